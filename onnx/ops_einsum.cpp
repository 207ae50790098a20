// ONNX Einsum as braid ops: the equation parsed, operands permuted and contracted with matmul.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

// ---- Einsum ----

constexpr int kEllipsisBase = 52;

int label_id(const OpContext& c, char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return 26 + (ch - 'a');
  c.fail("equation has an invalid character '", std::string(1, ch), "'");
}

/// Labels of one term; an ellipsis becomes -1 (expanded later).
std::vector<int> parse_term(const OpContext& c, const std::string& term) {
  std::vector<int> out;
  bool ellipsis = false;
  for (size_t i = 0; i < term.size(); ++i) {
    if (term[i] == '.') {
      if (ellipsis || term.compare(i, 3, "...") != 0) c.fail("malformed ellipsis in term '", term, "'");
      ellipsis = true;
      out.push_back(-1);
      i += 2;
      continue;
    }
    out.push_back(label_id(c, term[i]));
  }
  return out;
}

struct Operand {
  Tensor t;
  std::vector<int> labels;
};

/// Takes the diagonal of the axes that share a label until every label appears once.
void take_diagonals(const OpContext& c, Operand& op) {
  for (;;) {
    size_t p = 0, q = 0;
    bool found = false;
    for (size_t i = 0; i < op.labels.size() && !found; ++i)
      for (size_t j = i + 1; j < op.labels.size() && !found; ++j)
        if (op.labels[i] == op.labels[j]) {
          p = i;
          q = j;
          found = true;
        }
    if (!found) return;
    const int64_t n = op.t.size(static_cast<int64_t>(p));
    if (op.t.size(static_cast<int64_t>(q)) != n) c.fail("repeated label covers axes of sizes ", n, " and ", op.t.size(static_cast<int64_t>(q)));
    std::vector<int64_t> order;
    std::vector<int> labels;
    for (size_t i = 0; i < op.labels.size(); ++i)
      if (i != p && i != q) {
        order.push_back(static_cast<int64_t>(i));
        labels.push_back(op.labels[i]);
      }
    order.push_back(static_cast<int64_t>(p));
    order.push_back(static_cast<int64_t>(q));
    Tensor t = permute(op.t, order);
    Shape s(t.shape().begin(), t.shape().end() - 2);
    s.push_back(n * n);
    std::vector<int64_t> diag(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) diag[static_cast<size_t>(i)] = i * (n + 1);
    op.t = index_select(reshape(t, s), -1, index_vec(diag, c.device()));
    labels.push_back(op.labels[p]);
    op.labels = labels;
  }
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

/// Sums out the labels of op that are not in keep.
void sum_out(Operand& op, const std::vector<int>& keep) {
  std::vector<int64_t> axes;
  std::vector<int> labels;
  for (size_t i = 0; i < op.labels.size(); ++i) {
    if (contains(keep, op.labels[i])) labels.push_back(op.labels[i]);
    else axes.push_back(static_cast<int64_t>(i));
  }
  if (axes.empty()) return;
  op.t = sum(op.t, axes, false);
  op.labels = labels;
}

int64_t label_size(const Operand& op, int l) {
  for (size_t i = 0; i < op.labels.size(); ++i)
    if (op.labels[i] == l) return op.t.size(static_cast<int64_t>(i));
  return 1;
}

/// Contracts two operands with matmul, keeping the labels in keep.
Operand contract(Operand a, Operand b, const std::vector<int>& keep) {
  std::vector<int> keep_a = keep, keep_b = keep;
  keep_a.insert(keep_a.end(), b.labels.begin(), b.labels.end());
  keep_b.insert(keep_b.end(), a.labels.begin(), a.labels.end());
  sum_out(a, keep_a);
  sum_out(b, keep_b);
  std::vector<int> batch, con, a_only, b_only;
  for (int l : a.labels) {
    if (contains(b.labels, l)) (contains(keep, l) ? batch : con).push_back(l);
    else a_only.push_back(l);
  }
  for (int l : b.labels)
    if (!contains(a.labels, l)) b_only.push_back(l);
  auto arrange = [](const Operand& op, const std::vector<std::vector<int>>& groups) {
    std::vector<int64_t> order;
    for (const auto& g : groups)
      for (int l : g)
        for (size_t i = 0; i < op.labels.size(); ++i)
          if (op.labels[i] == l) order.push_back(static_cast<int64_t>(i));
    return permute(op.t, order);
  };
  auto size_of = [](const Operand& op, const std::vector<int>& g) {
    int64_t p = 1;
    for (int l : g) p *= label_size(op, l);
    return p;
  };
  const int64_t nb = size_of(a, batch), m = size_of(a, a_only), k = size_of(a, con), n = size_of(b, b_only);
  Tensor ta = reshape(arrange(a, {batch, a_only, con}), {nb, m, k});
  Tensor tb = reshape(arrange(b, {batch, con, b_only}), {nb, k, n});
  Tensor prod_ab = matmul(ta, tb);
  Shape os;
  Operand r;
  for (int l : batch) os.push_back(label_size(a, l));
  for (int l : a_only) os.push_back(label_size(a, l));
  for (int l : b_only) os.push_back(label_size(b, l));
  r.labels = batch;
  r.labels.insert(r.labels.end(), a_only.begin(), a_only.end());
  r.labels.insert(r.labels.end(), b_only.begin(), b_only.end());
  r.t = reshape(prod_ab, os);
  return r;
}

Tensors einsum(OpContext& c) {
  std::string equation;
  for (char ch : c.attr_string("equation", ""))
    if (!std::isspace(static_cast<unsigned char>(ch))) equation += ch;
  const size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != c.num_inputs()) c.fail("equation '", equation, "' has ", terms.size(), " operands, the node has ", c.num_inputs(), " inputs");
  // Expand ellipses: their axes get labels kEllipsisBase.., right-aligned across operands.
  std::vector<std::vector<int>> raw;
  int64_t ell = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    raw.push_back(parse_term(c, terms[i]));
    const int64_t named = static_cast<int64_t>(raw.back().size()) - (contains(raw.back(), -1) ? 1 : 0);
    if (contains(raw.back(), -1)) ell = std::max(ell, c.input(i).dim() - named);
    else if (named != c.input(i).dim())
      c.fail("term '", terms[i], "' has ", named, " labels for an input of rank ", c.input(i).dim());
  }
  std::vector<Operand> ops;
  for (size_t i = 0; i < terms.size(); ++i) {
    Operand op;
    op.t = c.input(i);
    const int64_t named = static_cast<int64_t>(raw[i].size()) - (contains(raw[i], -1) ? 1 : 0);
    const int64_t e = op.t.dim() - named;
    if (e < 0) c.fail("term '", terms[i], "' has more labels than input ", i, " has axes");
    for (int l : raw[i]) {
      if (l != -1) {
        op.labels.push_back(l);
        continue;
      }
      for (int64_t j = 0; j < e; ++j) op.labels.push_back(kEllipsisBase + static_cast<int>(ell - e + j));
    }
    ops.push_back(op);
  }
  std::vector<int> out_labels;
  if (arrow != std::string::npos) {
    for (int l : parse_term(c, equation.substr(arrow + 2))) {
      if (l != -1) {
        out_labels.push_back(l);
        continue;
      }
      for (int64_t j = 0; j < ell; ++j) out_labels.push_back(kEllipsisBase + static_cast<int>(j));
    }
  } else {
    for (int64_t j = 0; j < ell; ++j) out_labels.push_back(kEllipsisBase + static_cast<int>(j));
    std::map<int, int> count;
    for (const auto& op : ops)
      for (int l : op.labels)
        if (l < kEllipsisBase) count[l]++;
    for (const auto& [l, n] : count)
      if (n == 1) out_labels.push_back(l);
  }
  // Label sizes (broadcasting size-1 axes), diagonals, then pairwise contraction.
  std::map<int, int64_t> sizes;
  for (auto& op : ops) {
    take_diagonals(c, op);
    for (size_t i = 0; i < op.labels.size(); ++i) {
      int64_t& s = sizes[op.labels[i]];
      const int64_t n = op.t.size(static_cast<int64_t>(i));
      if (s > 1 && n != 1 && n != s) c.fail("label sizes ", s, " and ", n, " do not broadcast");
      s = std::max(s, n);
    }
  }
  for (auto& op : ops) {
    Shape want;
    for (int l : op.labels) want.push_back(sizes[l]);
    if (want != op.t.shape()) op.t = expand(op.t, want);
  }
  for (int l : out_labels)
    if (sizes.count(l) == 0) c.fail("output label is not in any input");
  Operand acc = ops[0];
  for (size_t i = 1; i < ops.size(); ++i) {
    std::vector<int> keep = out_labels;
    for (size_t j = i + 1; j < ops.size(); ++j) keep.insert(keep.end(), ops[j].labels.begin(), ops[j].labels.end());
    acc = contract(acc, ops[i], keep);
  }
  sum_out(acc, out_labels);
  std::vector<int64_t> order;
  for (int l : out_labels)
    for (size_t i = 0; i < acc.labels.size(); ++i)
      if (acc.labels[i] == l) order.push_back(static_cast<int64_t>(i));
  if (order.size() != acc.labels.size()) c.fail("output labels must be distinct");
  return {order.empty() ? acc.t : permute(acc.t, order)};
}

}  // namespace

void register_einsum_ops(OpRegistry& r) {
  r.add(op("Einsum", {"equation"}, einsum, 12));
}

}  // namespace braid::onnx::ops
