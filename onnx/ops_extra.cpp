// ONNX indexing, sorting and assorted ops as braid ops: TopK, CumSum, the scatter family, GatherND,
// OneHot, normalisation and sequence ops, losses, Unique, NonMaxSuppression, Det and BitShift.
// (Resampling is in ops_sampling.cpp, Einsum in ops_einsum.cpp, control flow in ops_control.cpp,
// signal processing in ops_signal.cpp.)
//
// Index computations that are not differentiable (which elements TopK picks, where ScatterND
// writes, which rows GatherND reads) are done on the CPU
// over plain vectors; the values then flow through braid's differentiable ops (gather,
// index_select, scatter_add, where, matmul), so gradients reach the data inputs.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

// ---- TopK ----

Tensors topk(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() == 0) c.fail("input must have at least one dimension");
  const int64_t axis = norm_axis(c, c.attr_int("axis", -1), x.dim());
  int64_t k = 0;
  if (c.opset() < 10) {
    k = c.attr_int("k", 0);
  } else {
    std::vector<int64_t> kv = c.input_ints(1);
    if (kv.size() != 1) c.fail("K must hold one value, got ", kv.size());
    k = kv[0];
  }
  const int64_t n = x.size(axis);
  if (k < 0 || k > n) c.fail("k ", k, " is out of range for axis ", axis, " of size ", n);
  const bool largest = c.attr_int("largest", 1) != 0;
  const Shape& sh = x.shape();
  const int64_t outer = shape_prod(sh, 0, static_cast<size_t>(axis)), inner = shape_prod(sh, static_cast<size_t>(axis) + 1);
  std::vector<double> v = cast(x, kFloat64).to_vector<double>();
  std::vector<int64_t> out(static_cast<size_t>(outer * k * inner));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return v[static_cast<size_t>((o * n + j) * inner + i)]; };
      std::iota(order.begin(), order.end(), 0);
      // Ties keep the lower index first; NaN counts as the largest value.
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const double va = at(a), vb = at(b);
        if (std::isnan(va) || std::isnan(vb)) return largest ? (std::isnan(va) && !std::isnan(vb)) : (!std::isnan(va) && std::isnan(vb));
        return largest ? va > vb : va < vb;
      });
      for (int64_t r = 0; r < k; ++r) out[static_cast<size_t>((o * k + r) * inner + i)] = order[static_cast<size_t>(r)];
    }
  Shape os = sh;
  os[static_cast<size_t>(axis)] = k;
  Tensor idx = tensor(out, os, c.device());
  if (k == 0) return {zeros(os, x.dtype(), x.device()), idx};
  return {gather(x, axis, idx), idx};
}

// ---- CumSum ----

/// x shifted by k along axis (zeros enter at the front).
Tensor shift(const Tensor& x, int64_t axis, int64_t k) {
  const int64_t n = x.size(axis);
  Shape zs = x.shape();
  zs[static_cast<size_t>(axis)] = std::min(k, n);
  if (k >= n) return zeros(x.shape(), x.dtype(), x.device());
  return concat({zeros(zs, x.dtype(), x.device()), narrow(x, axis, 0, n - k)}, axis);
}

Tensors cumsum(OpContext& c) {
  Tensor x = c.input(0);
  std::vector<int64_t> av = int_values(c, c.input(1), "axis");
  if (av.size() != 1) c.fail("axis must hold one value");
  if (x.dim() == 0) return {x};
  const int64_t axis = norm_axis(c, av[0], x.dim());
  const bool reverse = c.attr_int("reverse", 0) != 0, exclusive = c.attr_int("exclusive", 0) != 0;
  const int64_t n = x.size(axis);
  if (n == 0) return {x};
  if (reverse) x = flip(x, axis);
  // Hillis-Steele scan: log2(n) shifted additions.
  for (int64_t k = 1; k < n; k *= 2) x = x + shift(x, axis, k);
  if (exclusive) x = shift(x, axis, 1);
  if (reverse) x = flip(x, axis);
  return {x};
}

// ---- scatter family ----

/// data2 (rows, cols) with row rows[u] combined with row u of upd2 (nu, cols) by reduction
/// ("none": replaced, the last update wins; "add", "mul", "max", "min").
Tensor scatter_rows(const OpContext& c, const Tensor& data2, const std::vector<int64_t>& rows, const Tensor& upd2,
                    const std::string& reduction) {
  const int64_t nrows = data2.size(0), cols = data2.size(1);
  const auto nu = static_cast<int64_t>(rows.size());
  if (nu == 0) return data2;
  Tensor upd = cast(upd2, data2.dtype());
  auto row_index = [&](const std::vector<int64_t>& r) {
    return contiguous(expand(reshape(index_vec(r, c.device()), {static_cast<int64_t>(r.size()), 1}), {static_cast<int64_t>(r.size()), cols}));
  };
  if (reduction == "add") return scatter_add(data2, 0, row_index(rows), upd);
  if (reduction != "none" && reduction != "mul" && reduction != "max" && reduction != "min")
    c.fail("reduction '", reduction, "' is not one of none, add, mul, max, min");
  // Rounds in which each target row appears at most once: round r takes each row's r-th update
  // ("none" keeps only each row's last update).
  std::vector<std::vector<int64_t>> rounds;
  if (reduction == "none") {
    std::map<int64_t, int64_t> last;
    for (int64_t u = 0; u < nu; ++u) last[rows[static_cast<size_t>(u)]] = u;
    rounds.emplace_back();
    for (const auto& [row, u] : last) rounds[0].push_back(u);
  } else {
    std::map<int64_t, size_t> seen;
    for (int64_t u = 0; u < nu; ++u) {
      size_t& count = seen[rows[static_cast<size_t>(u)]];
      if (rounds.size() <= count) rounds.emplace_back();
      rounds[count++].push_back(u);
    }
  }
  Tensor out = data2;
  for (const std::vector<int64_t>& us : rounds) {
    std::vector<int64_t> rr;
    std::vector<bool> mask(static_cast<size_t>(nrows), false);
    for (int64_t u : us) {
      rr.push_back(rows[static_cast<size_t>(u)]);
      mask[static_cast<size_t>(rows[static_cast<size_t>(u)])] = true;
    }
    Tensor placed = scatter_add(zeros_like(data2), 0, row_index(rr), index_select(upd, 0, index_vec(us, c.device())));
    Tensor m = tensor_bool(mask, {nrows, 1}, c.device());
    Tensor combined = reduction == "none" ? placed
                      : reduction == "mul" ? out * placed
                      : reduction == "max" ? maximum(out, placed)
                                           : minimum(out, placed);
    out = where(m, combined, out);
  }
  return out;
}

Tensors scatter_nd(OpContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& indices = c.input(1);
  const Tensor& updates = c.input(2);
  if (indices.dim() < 1) c.fail("indices must have at least one dimension");
  const Shape& ds = data.shape();
  const int64_t k = indices.size(-1);
  if (k > data.dim()) c.fail("index tuples of ", k, " values for a rank-", data.dim(), " data");
  const int64_t nu = shape_prod(indices.shape(), 0, static_cast<size_t>(indices.dim() - 1));
  const int64_t rest = shape_prod(ds, static_cast<size_t>(k));
  Shape want(indices.shape().begin(), indices.shape().end() - 1);
  want.insert(want.end(), ds.begin() + k, ds.end());
  if (updates.shape() != want) c.fail("updates have shape ", shape_str(updates.shape()), ", expected ", shape_str(want));
  std::vector<int64_t> iv = int_values(c, indices, "indices");
  std::vector<int64_t> rows(static_cast<size_t>(nu), 0);
  for (int64_t u = 0; u < nu; ++u) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j)
      row = row * ds[static_cast<size_t>(j)] + wrap(c, iv[static_cast<size_t>(u * k + j)], ds[static_cast<size_t>(j)], "ScatterND");
    rows[static_cast<size_t>(u)] = row;
  }
  Tensor d2 = reshape(data, {shape_prod(ds, 0, static_cast<size_t>(k)), rest});
  Tensor u2 = reshape(updates, {static_cast<int64_t>(rows.size()), rest});
  return {reshape(scatter_rows(c, d2, rows, u2, c.attr_string("reduction", "none")), ds)};
}

Tensors scatter_elements(OpContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& indices = c.input(1);
  const Tensor& updates = c.input(2);
  const int64_t r = data.dim();
  const int64_t axis = norm_axis(c, c.attr_int("axis", 0), std::max<int64_t>(r, 1));
  if (indices.dim() != r || updates.shape() != indices.shape())
    c.fail("indices (", shape_str(indices.shape()), ") and updates (", shape_str(updates.shape()),
           ") must have one shape of data's rank ", r);
  const Shape& ds = data.shape();
  const Shape& is = indices.shape();
  for (int64_t d = 0; d < r; ++d)
    if (d != axis && is[static_cast<size_t>(d)] > ds[static_cast<size_t>(d)]) c.fail("indices shape ", shape_str(is), " exceeds data shape ", shape_str(ds));
  std::vector<int64_t> iv = int_values(c, indices, "indices");
  std::vector<int64_t> rows(iv.size());
  std::vector<int64_t> pos(static_cast<size_t>(r), 0);
  for (size_t p = 0; p < iv.size(); ++p) {
    int64_t flat = 0;
    for (int64_t d = 0; d < r; ++d) {
      const int64_t coord = d == axis ? wrap(c, iv[p], ds[static_cast<size_t>(d)], "ScatterElements") : pos[static_cast<size_t>(d)];
      flat = flat * ds[static_cast<size_t>(d)] + coord;
    }
    rows[p] = flat;
    for (int64_t d = r - 1; d >= 0; --d) {  // next position in indices, row-major
      if (++pos[static_cast<size_t>(d)] < is[static_cast<size_t>(d)]) break;
      pos[static_cast<size_t>(d)] = 0;
    }
  }
  Tensor d2 = reshape(data, {data.numel(), 1});
  Tensor u2 = reshape(updates, {updates.numel(), 1});
  return {reshape(scatter_rows(c, d2, rows, u2, c.attr_string("reduction", "none")), ds)};
}

Tensors gather_nd(OpContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& indices = c.input(1);
  const int64_t b = c.attr_int("batch_dims", 0);
  if (indices.dim() < 1) c.fail("indices must have at least one dimension");
  const Shape& ds = data.shape();
  const Shape& is = indices.shape();
  const int64_t k = is.back();
  if (b < 0 || b >= indices.dim() || b + k > data.dim()) c.fail("batch_dims ", b, " and index tuples of ", k, " values do not fit data of shape ", shape_str(ds));
  for (int64_t d = 0; d < b; ++d)
    if (ds[static_cast<size_t>(d)] != is[static_cast<size_t>(d)]) c.fail("batch dimensions of data and indices differ");
  const int64_t per_batch_rows = shape_prod(ds, static_cast<size_t>(b), static_cast<size_t>(b + k));
  const int64_t rest = shape_prod(ds, static_cast<size_t>(b + k));
  const int64_t per_batch_idx = shape_prod(is, static_cast<size_t>(b), is.size() - 1);
  const int64_t nidx = shape_prod(is, 0, is.size() - 1);
  std::vector<int64_t> iv = int_values(c, indices, "indices");
  std::vector<int64_t> rows(static_cast<size_t>(nidx));
  for (int64_t u = 0; u < nidx; ++u) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t n = ds[static_cast<size_t>(b + j)];
      row = row * n + wrap(c, iv[static_cast<size_t>(u * k + j)], n, "GatherND");
    }
    const int64_t batch = per_batch_idx == 0 ? 0 : u / per_batch_idx;
    rows[static_cast<size_t>(u)] = batch * per_batch_rows + row;
  }
  Tensor d2 = reshape(data, {shape_prod(ds, 0, static_cast<size_t>(b + k)), rest});
  Shape os(is.begin(), is.end() - 1);
  os.insert(os.end(), ds.begin() + b + k, ds.end());
  return {reshape(index_select(d2, 0, index_vec(rows, c.device())), os)};
}

Tensors one_hot_op(OpContext& c) {
  const Tensor& indices = c.input(0);
  const auto depth = static_cast<int64_t>(c.input_scalar(1));
  const Tensor& values = c.input(2);
  if (values.numel() != 2) c.fail("values must hold two elements (off, on), got shape ", shape_str(values.shape()));
  if (depth <= 0) c.fail("depth must be positive, got ", depth);
  const int64_t axis = norm_axis(c, c.attr_int("axis", -1), indices.dim() + 1);
  std::vector<double> iv = cast(indices, kFloat64).to_vector<double>();
  std::vector<int64_t> idx(iv.size());
  for (size_t i = 0; i < iv.size(); ++i) {
    auto v = static_cast<int64_t>(iv[i]);
    if (v < 0) v += depth;
    idx[i] = v;  // still out of range: the row is all off
  }
  Tensor labels = unsqueeze(tensor(idx, indices.shape(), c.device()), axis);
  Shape rs(static_cast<size_t>(indices.dim() + 1), 1);
  rs[static_cast<size_t>(axis)] = depth;
  Tensor mask = eq(labels, reshape(arange(depth, kInt64, c.device()), rs));
  Tensor flat = reshape(values, {2});
  return {where(mask, reshape(narrow(flat, 0, 1, 1), {}), reshape(narrow(flat, 0, 0, 1), {}))};
}

// ---- normalisation and sequence ops ----

Tensors reverse_sequence(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() < 2) c.fail("input must have at least 2 dimensions");
  const int64_t ta = norm_axis(c, c.attr_int("time_axis", 0), x.dim(), "time_axis");
  const int64_t ba = norm_axis(c, c.attr_int("batch_axis", 1), x.dim(), "batch_axis");
  if (ta == ba) c.fail("time_axis and batch_axis must differ");
  std::vector<int64_t> lens = int_values(c, c.input(1), "sequence_lens");
  const int64_t nb = x.size(ba), nt = x.size(ta);
  if (static_cast<int64_t>(lens.size()) != nb) c.fail("sequence_lens has ", lens.size(), " values for a batch of ", nb);
  for (int64_t l : lens)
    if (l < 0 || l > nt) c.fail("sequence length ", l, " is out of range for ", nt, " steps");
  // gather's index along time_axis, shaped like x.
  const Shape& s = x.shape();
  std::vector<int64_t> idx(static_cast<size_t>(x.numel()));
  std::vector<int64_t> pos(s.size(), 0);
  for (size_t p = 0; p < idx.size(); ++p) {
    const int64_t t = pos[static_cast<size_t>(ta)], l = lens[static_cast<size_t>(pos[static_cast<size_t>(ba)])];
    idx[p] = t < l ? l - 1 - t : t;
    for (size_t d = s.size(); d-- > 0;) {
      if (++pos[d] < s[d]) break;
      pos[d] = 0;
    }
  }
  return {gather(x, ta, tensor(idx, s, c.device()))};
}

Tensors compress(OpContext& c) {
  Tensor x = c.input(0);
  std::vector<double> cond = float_values(c.input(1));
  int64_t axis = 0;
  if (c.has_attr("axis")) axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
  else x = reshape(x, {x.numel()});
  std::vector<int64_t> keep;
  for (size_t i = 0; i < cond.size() && static_cast<int64_t>(i) < x.size(axis); ++i)
    if (cond[i] != 0) keep.push_back(static_cast<int64_t>(i));
  return {index_select(x, axis, index_vec(keep, c.device()))};
}

// ---- losses ----

/// NegativeLogLikelihoodLoss over log-probabilities x (N, C, d...) and integer targets (N, d...).
Tensor nll_loss(OpContext& c, const Tensor& x, const Tensor& target, const Tensor& weight) {
  if (x.dim() < 2) c.fail("input must be (N, C, ...), got shape ", shape_str(x.shape()));
  const int64_t classes = x.size(1);
  std::vector<int64_t> tv = int_values(c, target, "target");
  const bool has_ignore = c.has_attr("ignore_index");
  const int64_t ignore = c.attr_int("ignore_index", 0);
  std::vector<bool> keep(tv.size(), true);
  for (size_t i = 0; i < tv.size(); ++i) {
    if (has_ignore && tv[i] == ignore) {
      keep[i] = false;
      tv[i] = 0;
      continue;
    }
    if (tv[i] < 0 || tv[i] >= classes) c.fail("target ", tv[i], " is out of range for ", classes, " classes");
  }
  Tensor t = tensor(tv, target.shape(), c.device());
  Tensor picked = squeeze(gather(x, 1, unsqueeze(t, 1)), 1);
  Tensor w = cast(tensor_bool(keep, target.shape(), c.device()), x.dtype());
  if (weight.defined()) w = w * reshape(index_select(weight, 0, reshape(t, {t.numel()})), target.shape());
  Tensor loss = -picked * w;
  const std::string reduction = c.attr_string("reduction", "mean");
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  if (reduction == "mean") return sum(loss) / sum(w);
  c.fail("reduction '", reduction, "' is not one of none, sum, mean");
}

// ---- Unique and NonMaxSuppression (index outputs computed on the CPU) ----

Tensors unique(OpContext& c) {
  Tensor x = c.input(0);
  const bool has_axis = c.has_attr("axis");
  int64_t axis = 0;
  if (has_axis) axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
  else x = reshape(x, {x.numel()});
  const int64_t n = x.size(axis);
  // Each slice along axis as a vector of values, compared lexicographically.
  Tensor moved = contiguous(transpose(x, 0, axis));
  std::vector<double> flat = cast(moved, kFloat64).to_vector<double>();
  const int64_t width = n == 0 ? 0 : static_cast<int64_t>(flat.size()) / n;
  auto slice_of = [&](int64_t i) {
    return std::vector<double>(flat.begin() + i * width, flat.begin() + (i + 1) * width);
  };
  std::map<std::vector<double>, int64_t> first;  // slice -> first index
  std::vector<int64_t> order;                    // first indices in order of appearance
  std::vector<std::vector<double>> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    keys[static_cast<size_t>(i)] = slice_of(i);
    if (first.emplace(keys[static_cast<size_t>(i)], i).second) order.push_back(i);
  }
  if (c.attr_int("sorted", 1) != 0) {
    order.clear();
    for (const auto& [key, i] : first) order.push_back(i);
  }
  std::map<std::vector<double>, int64_t> position;
  for (size_t p = 0; p < order.size(); ++p) position[keys[static_cast<size_t>(order[p])]] = static_cast<int64_t>(p);
  std::vector<int64_t> inverse(static_cast<size_t>(n)), counts(order.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = position[keys[static_cast<size_t>(i)]];
    inverse[static_cast<size_t>(i)] = p;
    counts[static_cast<size_t>(p)]++;
  }
  return {index_select(x, axis, index_vec(order, c.device())), index_vec(order, c.device()), index_vec(inverse, c.device()), index_vec(counts, c.device())};
}

bool nms_suppress(const std::vector<double>& b, int64_t i, int64_t j, bool center, double iou_threshold) {
  auto box = [&](int64_t k, double& x0, double& x1, double& y0, double& y1) {
    const double* p = &b[static_cast<size_t>(k * 4)];
    if (!center) {
      y0 = std::min(p[0], p[2]);
      y1 = std::max(p[0], p[2]);
      x0 = std::min(p[1], p[3]);
      x1 = std::max(p[1], p[3]);
    } else {
      x0 = p[0] - p[2] / 2;
      x1 = p[0] + p[2] / 2;
      y0 = p[1] - p[3] / 2;
      y1 = p[1] + p[3] / 2;
    }
  };
  double ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;
  box(i, ax0, ax1, ay0, ay1);
  box(j, bx0, bx1, by0, by1);
  const double ix0 = std::max(ax0, bx0), ix1 = std::min(ax1, bx1), iy0 = std::max(ay0, by0), iy1 = std::min(ay1, by1);
  if (ix1 <= ix0 || iy1 <= iy0) return false;
  const double inter = (ix1 - ix0) * (iy1 - iy0);
  const double a1 = (ax1 - ax0) * (ay1 - ay0), a2 = (bx1 - bx0) * (by1 - by0), uni = a1 + a2 - inter;
  if (inter <= 0 || a1 <= 0 || a2 <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

Tensors non_max_suppression(OpContext& c) {
  const Tensor& boxes = c.input(0);
  const Tensor& scores = c.input(1);
  if (boxes.dim() != 3 || boxes.size(2) != 4 || scores.dim() != 3 || scores.size(0) != boxes.size(0) || scores.size(2) != boxes.size(1))
    c.fail("boxes (", shape_str(boxes.shape()), ") and scores (", shape_str(scores.shape()), ") do not match");
  int64_t max_out = 0;
  double iou = 0;
  std::optional<double> score_threshold;
  if (c.has_input(2) && c.input(2).numel() > 0) max_out = std::max<int64_t>(static_cast<int64_t>(c.input(2).to_vector<int64_t>()[0]), 0);
  if (c.has_input(3) && c.input(3).numel() > 0) iou = float_values(c.input(3))[0];
  if (c.has_input(4) && c.input(4).numel() > 0) score_threshold = float_values(c.input(4))[0];
  const bool center = c.attr_int("center_point_box", 0) != 0;
  const int64_t nb = boxes.size(0), nbox = boxes.size(1), ncls = scores.size(1);
  std::vector<double> bv = float_values(boxes), sv = float_values(scores);
  std::vector<int64_t> out;
  for (int64_t b = 0; b < nb; ++b) {
    std::vector<double> bb(bv.begin() + b * nbox * 4, bv.begin() + (b + 1) * nbox * 4);
    for (int64_t k = 0; k < ncls; ++k) {
      const double* sc = &sv[static_cast<size_t>((b * ncls + k) * nbox)];
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < nbox; ++i)
        if (!score_threshold || sc[i] > *score_threshold) cand.push_back(i);
      // Highest score first; equal scores: lower index first.
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return sc[i] > sc[j]; });
      std::vector<int64_t> sel;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(sel.size()) >= max_out) break;
        bool keep = true;
        for (int64_t j : sel)
          if (nms_suppress(bb, i, j, center, iou)) {
            keep = false;
            break;
          }
        if (keep) {
          sel.push_back(i);
          out.insert(out.end(), {b, k, i});
        }
      }
    }
  }
  return {tensor(out, {static_cast<int64_t>(out.size() / 3), 3}, c.device())};
}

// ---- Det: Gaussian elimination with partial pivoting (pivots chosen on the CPU) ----

Tensors det_op(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() < 2 || x.size(-1) != x.size(-2)) c.fail("input must be (..., M, M), got shape ", shape_str(x.shape()));
  const int64_t m = x.size(-1);
  const Shape batch_shape(x.shape().begin(), x.shape().end() - 2);
  int64_t nb = 1;
  for (int64_t d : batch_shape) nb *= d;
  Tensor a = reshape(x, {nb, m, m});
  Tensor det = ones({nb}, x.dtype(), x.device());
  std::vector<double> sign(static_cast<size_t>(nb), 1.0);
  for (int64_t k = m; k > 0; --k) {  // a is (nb, k, k)
    const std::vector<double> col = cast(narrow(a, 2, 0, 1), kFloat64).to_vector<double>();
    std::vector<int64_t> perm(static_cast<size_t>(nb * k));
    bool swapped = false;
    for (int64_t b = 0; b < nb; ++b) {
      int64_t piv = 0;
      for (int64_t i = 1; i < k; ++i)
        if (std::abs(col[static_cast<size_t>(b * k + i)]) > std::abs(col[static_cast<size_t>(b * k + piv)])) piv = i;
      for (int64_t i = 0; i < k; ++i) perm[static_cast<size_t>(b * k + i)] = i;
      if (piv != 0) {
        std::swap(perm[static_cast<size_t>(b * k)], perm[static_cast<size_t>(b * k + piv)]);
        sign[static_cast<size_t>(b)] = -sign[static_cast<size_t>(b)];
        swapped = true;
      }
    }
    if (swapped) a = gather(a, 1, contiguous(expand(reshape(tensor(perm, {nb * k}, c.device()), {nb, k, 1}), {nb, k, k})));
    Tensor pivot = reshape(narrow(narrow(a, 1, 0, 1), 2, 0, 1), {nb});
    det = det * pivot;
    if (k > 1) {
      Tensor zero = scalar_like(pivot, 0);
      Tensor safe = where(eq(pivot, zero), scalar_like(pivot, 1), pivot);  // a zero pivot already made det 0
      Tensor rest = narrow(narrow(a, 1, 1, k - 1), 2, 1, k - 1);
      Tensor lower = narrow(narrow(a, 1, 1, k - 1), 2, 0, 1);
      Tensor upper = narrow(narrow(a, 1, 0, 1), 2, 1, k - 1);
      a = rest - lower * upper / reshape(safe, {nb, 1, 1});
    }
  }
  det = det * cast(tensor(sign, {nb}, c.device()), det.dtype());
  return {reshape(det, batch_shape)};
}

// ---- BitShift (unsigned integers, widened to int32/int64 by the loader) ----

Tensors bit_shift(OpContext& c) {
  const Tensor &a = c.input(0), &b = c.input(1);
  if (is_floating(a.dtype()) || is_floating(b.dtype()) || a.dtype() == kBool) c.fail("BitShift needs integer inputs");
  const std::string dir = c.attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") c.fail("direction must be LEFT or RIGHT, got '", dir, "'");
  const Shape s = broadcast_shapes(a.shape(), b.shape(), "BitShift");
  const std::vector<int64_t> av = contiguous(expand(cast(a, kInt64), s)).to_vector<int64_t>();
  const std::vector<int64_t> bv = contiguous(expand(cast(b, kInt64), s)).to_vector<int64_t>();
  std::vector<int64_t> out(av.size());
  for (size_t i = 0; i < av.size(); ++i) {
    const auto v = static_cast<uint64_t>(av[i]);
    const auto k = static_cast<uint64_t>(bv[i]);
    const uint64_t r = k >= 64 ? 0 : (dir == "LEFT" ? v << k : v >> k);
    out[i] = static_cast<int64_t>(r);
  }
  return {cast(tensor(out, s, c.device()), promote_types(a.dtype(), b.dtype()))};
}

}  // namespace

void register_extra_ops(OpRegistry& r) {
  r.add(op("TopK", {"axis", "k", "largest", "sorted"}, topk));
  r.add(op("CumSum", {"exclusive", "reverse"}, cumsum, 11));
  r.add(op("ScatterND", {"reduction"}, scatter_nd, 11));
  r.add(op("ScatterElements", {"axis", "reduction"}, scatter_elements, 11));
  r.add(op("Scatter", {"axis"}, scatter_elements, 9));
  r.add(op("GatherND", {"batch_dims"}, gather_nd, 11));
  r.add(op("OneHot", {"axis"}, one_hot_op, 9));
  r.add(op("MeanVarianceNormalization", {"axes"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    std::vector<int64_t> axes = c.attr_ints("axes", {0, 2, 3});
    for (int64_t& a : axes) a = norm_axis(c, a, x.dim());
    Tensor m = mean(x, axes, true);
    return Tensors{(x - m) / (sqrt(var(x, axes, 0, true)) + 1e-9)};
  }, 9));
  r.add(op("LpNormalization", {"axis", "p"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = norm_axis(c, c.attr_int("axis", -1), x.dim());
    const int64_t p = c.attr_int("p", 2);
    // A zero vector stays zero (the reference's x / norm with norm 0 replaced by 1), not NaN.
    auto safe = [](const Tensor& norm) { return where(eq(norm, zeros_like(norm)), ones_like(norm), norm); };
    if (p == 1) return Tensors{x / safe(sum(abs(x), {axis}, true))};
    if (p == 2) return Tensors{x / safe(sqrt(sum(square(x), {axis}, true)))};
    c.fail("p must be 1 or 2, got ", p);
  }));
  r.add(op("ReverseSequence", {"batch_axis", "time_axis"}, reverse_sequence, 10));
  r.add(op("Compress", {"axis"}, compress, 9));
  r.add(op("NegativeLogLikelihoodLoss", {"ignore_index", "reduction"}, [](OpContext& c) {
    return Tensors{nll_loss(c, c.input(0), c.input(1), c.has_input(2) ? c.input(2) : Tensor())};
  }, 12));
  r.add(op("SoftmaxCrossEntropyLoss", {"ignore_index", "reduction"}, [](OpContext& c) {
    Tensor log_prob = log_softmax(c.input(0), 1);
    return Tensors{nll_loss(c, log_prob, c.input(1), c.has_input(2) ? c.input(2) : Tensor()), log_prob};
  }, 12));
  r.add(op("Unique", {"axis", "sorted"}, unique, 11));
  r.add(op("NonMaxSuppression", {"center_point_box"}, non_max_suppression, 10));
  r.add(op("Det", {}, det_op, 11));
  {
    OpSchema s = op("BitShift", {"direction"}, bit_shift, 11);
    s.storage_via_compute = false;
    s.until_opset = 27;  // opset 28 defines shifts of signed types and by the type's width or more
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx::ops
