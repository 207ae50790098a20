// ONNX recurrent ops (LSTM, GRU, RNN) as braid ops.
//
// Each op unrolls the sequence step by step with matmul, the gate activations, where and stack,
// so autograd differentiates through time with no hand-written backward. The input projection
// X W^T + Wb is computed once for all steps; each step adds H R^T + Rb. sequence_lens is honoured
// with masks: a batch entry past its length keeps its hidden (and cell) state and writes zeros to
// Y, which also makes the reverse direction start at each entry's own last step.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool known_activation(const std::string& name) {
  static const char* const kNames[] = {"relu",    "tanh",          "sigmoid",  "affine", "leakyrelu",
                                       "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu", "softsign",
                                       "softplus"};
  const std::string l = lower(name);
  for (const char* k : kNames)
    if (l == k) return true;
  return false;
}

bool needs_alpha(const std::string& l) {
  return l == "affine" || l == "leakyrelu" || l == "thresholdedrelu" || l == "scaledtanh" || l == "hardsigmoid" ||
         l == "elu";
}
bool needs_beta(const std::string& l) { return l == "affine" || l == "scaledtanh" || l == "hardsigmoid"; }

double default_alpha(const std::string& l) {
  if (l == "leakyrelu") return 0.01;
  if (l == "hardsigmoid") return 0.2;
  return 1.0;  // affine, thresholdedrelu, scaledtanh, elu
}
double default_beta(const std::string& l) {
  if (l == "hardsigmoid") return 0.5;
  if (l == "affine") return 0.0;
  return 1.0;  // scaledtanh
}

/// One activation function with its alpha and beta.
struct Activation {
  std::string name;  // lower case
  double alpha = 0, beta = 0;
  Tensor operator()(const Tensor& x) const {
    if (name == "sigmoid") return sigmoid(x);
    if (name == "tanh") return tanh(x);
    if (name == "relu") return relu(x);
    if (name == "affine") return x * alpha + beta;
    if (name == "leakyrelu") return leaky_relu(x, alpha);
    if (name == "thresholdedrelu") return where(gt(x, scalar_like(x, alpha)), x, scalar_like(x, 0));
    if (name == "scaledtanh") return tanh(x * beta) * alpha;
    if (name == "hardsigmoid") return clamp(x * alpha + beta, 0.0, 1.0);
    if (name == "elu") return elu(x, alpha);
    if (name == "softsign") return x / (abs(x) + 1.0);
    if (name == "softplus") return softplus(x);
    throw NotImplementedError(detail::cat("activation '", name, "' is not supported"));
  }
};

Tensor select_dir(const Tensor& t, int64_t d) { return squeeze(narrow(t, 0, d, 1), 0); }

const std::vector<std::string> kRnnAttributes{"activation_alpha", "activation_beta", "activations", "clip",
                                              "direction", "hidden_size", "layout"};

std::string check_rnn(const Node& n) {
  auto it = n.attributes.find("activations");
  if (it != n.attributes.end()) {
    for (const std::string& a : it->second.strings)
      if (!known_activation(a)) return detail::cat("activation '", a, "' is not supported");
  }
  it = n.attributes.find("direction");
  if (it != n.attributes.end() && it->second.s != "forward" && it->second.s != "reverse" &&
      it->second.s != "bidirectional")
    return detail::cat("direction '", it->second.s, "' is not one of forward, reverse, bidirectional");
  return "";
}

/// The shared set-up of LSTM, GRU and RNN: inputs in layout 0, directions, activations.
struct Recurrence {
  Tensor x;            // (seq, batch, input)
  int64_t seq = 0, batch = 0, hidden = 0, num_dir = 1;
  bool layout1 = false;
  std::vector<bool> reverse;               // per direction
  std::vector<std::vector<Activation>> f;  // per direction: the op's activations
  std::optional<double> clip;
  std::vector<int64_t> lens;  // per batch entry; empty when every entry runs the whole sequence
  Tensor step_mask(int64_t t) const {  // (batch, 1) bool: entries still running at step t
    std::vector<bool> m(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) m[static_cast<size_t>(b)] = t < lens[static_cast<size_t>(b)];
    return tensor_bool(m, {batch, 1}, x.device());
  }
  Tensor act(size_t dir, size_t k, const Tensor& v) const {
    return f[dir][k](clip ? clamp(v, -*clip, *clip) : v);
  }
};

Recurrence setup(OpContext& c, const std::vector<std::string>& defaults, int64_t gates) {
  Recurrence r;
  r.x = c.input(0);
  if (r.x.dim() != 3) c.fail("X must be 3-d, got shape ", shape_str(r.x.shape()));
  r.layout1 = c.attr_int("layout", 0) != 0;
  if (r.layout1) r.x = transpose(r.x, 0, 1);
  r.seq = r.x.size(0);
  r.batch = r.x.size(1);
  const std::string direction = c.attr_string("direction", "forward");
  if (direction == "forward") r.reverse = {false};
  else if (direction == "reverse") r.reverse = {true};
  else if (direction == "bidirectional") r.reverse = {false, true};
  else c.fail("direction '", direction, "' is not one of forward, reverse, bidirectional");
  r.num_dir = static_cast<int64_t>(r.reverse.size());
  const Tensor& w = c.input(1);
  r.hidden = c.attr_int("hidden_size", w.dim() == 3 ? w.size(1) / gates : 0);
  if (w.dim() != 3 || w.size(0) != r.num_dir || w.size(1) != gates * r.hidden || w.size(2) != r.x.size(2))
    c.fail("W has shape ", shape_str(w.shape()), ", expected [", r.num_dir, ", ", gates * r.hidden, ", ", r.x.size(2), "]");
  const Tensor& rr = c.input(2);
  if (rr.dim() != 3 || rr.size(0) != r.num_dir || rr.size(1) != gates * r.hidden || rr.size(2) != r.hidden)
    c.fail("R has shape ", shape_str(rr.shape()), ", expected [", r.num_dir, ", ", gates * r.hidden, ", ", r.hidden, "]");
  if (c.has_attr("clip")) r.clip = c.attr_float("clip", 0);
  // Activations: defaults per direction; alpha and beta are consumed in order by the functions that take them.
  std::vector<std::string> names;
  if (c.has_attr("activations")) {
    names = c.attr("activations").strings;
    if (names.size() != defaults.size() * r.reverse.size())
      c.fail("activations needs ", defaults.size() * r.reverse.size(), " names, got ", names.size());
  } else {
    for (size_t d = 0; d < r.reverse.size(); ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  }
  std::vector<double> alphas = c.attr_floats("activation_alpha"), betas = c.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  r.f.resize(r.reverse.size());
  for (size_t i = 0; i < names.size(); ++i) {
    Activation a;
    a.name = lower(names[i]);
    if (!known_activation(a.name)) throw NotImplementedError(detail::cat(c.node().label(), ": activation '", names[i], "' is not supported"));
    a.alpha = default_alpha(a.name);
    a.beta = default_beta(a.name);
    if (needs_alpha(a.name) && ai < alphas.size()) a.alpha = alphas[ai++];
    if (needs_beta(a.name) && bi < betas.size()) a.beta = betas[bi++];
    r.f[i / defaults.size()].push_back(a);
  }
  if (c.has_input(4)) {
    r.lens = c.input_ints(4);
    if (static_cast<int64_t>(r.lens.size()) != r.batch) c.fail("sequence_lens has ", r.lens.size(), " values for a batch of ", r.batch);
    bool all_full = true;
    for (int64_t l : r.lens) {
      if (l < 0 || l > r.seq) c.fail("sequence length ", l, " is out of range for a sequence of ", r.seq);
      all_full = all_full && l == r.seq;
    }
    if (all_full) r.lens.clear();
  }
  return r;
}

/// Initial state input i (initial_h or initial_c) for direction d as (batch, hidden), zeros when omitted.
Tensor initial_state(OpContext& c, const Recurrence& r, size_t i, int64_t d) {
  if (!c.has_input(i)) return zeros({r.batch, r.hidden}, r.x.dtype(), r.x.device());
  Tensor h = c.input(i);
  if (r.layout1) h = transpose(h, 0, 1);
  if (h.dim() != 3 || h.size(0) != r.num_dir || h.size(1) != r.batch || h.size(2) != r.hidden)
    c.fail("initial state ", i, " has shape ", shape_str(c.input(i).shape()), ", expected [", r.num_dir, ", ",
           r.batch, ", ", r.hidden, "] in layout ", r.layout1 ? 1 : 0);
  return select_dir(h, d);
}


/// Per direction: W (gates*hidden, input) and R as matrices, the input projection for every step
/// (seq, batch, gates*hidden) including both biases when split_bias is false.
struct DirWeights {
  Tensor w, r, wb, rb;  // wb, rb undefined when B is omitted
  Tensor xp;            // X W^T (+ Wb)
};

DirWeights dir_weights(OpContext& c, const Recurrence& rec, int64_t d, int64_t gates) {
  DirWeights dw;
  dw.w = select_dir(c.input(1), d);
  dw.r = select_dir(c.input(2), d);
  if (c.has_input(3)) {
    const Tensor& b = c.input(3);
    if (b.dim() != 2 || b.size(0) != rec.num_dir || b.size(1) != 2 * gates * rec.hidden)
      c.fail("B has shape ", shape_str(b.shape()), ", expected [", rec.num_dir, ", ", 2 * gates * rec.hidden, "]");
    Tensor bd = select_dir(b, d);
    dw.wb = narrow(bd, 0, 0, gates * rec.hidden);
    dw.rb = narrow(bd, 0, gates * rec.hidden, gates * rec.hidden);
  }
  dw.xp = matmul(rec.x, dw.w.mT());
  if (dw.wb.defined()) dw.xp = dw.xp + dw.wb;
  return dw;
}

Tensor gate(const Tensor& t, int64_t k, int64_t hidden) { return narrow(t, -1, k * hidden, hidden); }

/// Runs `step` over the sequence in the direction's order; returns (Y as (seq, batch, hidden), final states).
/// step(t, states) -> new states, the first of which is H.
template <typename Step>
std::pair<Tensor, std::vector<Tensor>> unroll(const Recurrence& r, size_t dir, std::vector<Tensor> states, Step step) {
  std::vector<Tensor> ys(static_cast<size_t>(r.seq));
  for (int64_t i = 0; i < r.seq; ++i) {
    const int64_t t = r.reverse[dir] ? r.seq - 1 - i : i;
    std::vector<Tensor> next = step(t, states);
    if (!r.lens.empty()) {
      Tensor m = r.step_mask(t);
      for (size_t k = 0; k < next.size(); ++k) next[k] = where(m, next[k], states[k]);
      ys[static_cast<size_t>(t)] = where(m, next[0], zeros({}, next[0].dtype(), next[0].device()));
    } else {
      ys[static_cast<size_t>(t)] = next[0];
    }
    states = std::move(next);
  }
  Tensor y = r.seq > 0 ? stack(ys, 0) : zeros({0, r.batch, r.hidden}, r.x.dtype(), r.x.device());
  return {y, states};
}

/// Assembles Y (seq, num_dir, batch, hidden) and each final state (num_dir, batch, hidden), in the node's layout.
Tensors outputs(const Recurrence& r, const std::vector<Tensor>& ys, const std::vector<std::vector<Tensor>>& finals) {
  Tensor y = stack(ys, 1);
  if (r.layout1) y = permute(y, {2, 0, 1, 3});
  Tensors out{y};
  for (size_t k = 0; k < finals[0].size(); ++k) {
    std::vector<Tensor> per_dir;
    for (const auto& f : finals) per_dir.push_back(f[k]);
    Tensor s = stack(per_dir, 0);
    if (r.layout1) s = transpose(s, 0, 1);
    out.push_back(s);
  }
  return out;
}

Tensors lstm(OpContext& c) {
  Recurrence r = setup(c, {"Sigmoid", "Tanh", "Tanh"}, 4);
  const bool input_forget = c.attr_int("input_forget", 0) != 0;
  const int64_t h = r.hidden;
  std::vector<Tensor> ys;
  std::vector<std::vector<Tensor>> finals;
  for (size_t dir = 0; dir < r.reverse.size(); ++dir) {
    const auto d = static_cast<int64_t>(dir);
    DirWeights dw = dir_weights(c, r, d, 4);
    Tensor pi, po, pf;
    if (c.has_input(7)) {
      const Tensor& p = c.input(7);
      if (p.dim() != 2 || p.size(0) != r.num_dir || p.size(1) != 3 * h)
        c.fail("P has shape ", shape_str(p.shape()), ", expected [", r.num_dir, ", ", 3 * h, "]");
      Tensor pd = select_dir(p, d);
      pi = narrow(pd, 0, 0, h);
      po = narrow(pd, 0, h, h);
      pf = narrow(pd, 0, 2 * h, h);
    }
    Tensor rt = dw.r.mT();
    auto step = [&](int64_t t, const std::vector<Tensor>& s) {
      const Tensor &hp = s[0], &cp = s[1];
      Tensor g = select_dir(dw.xp, t) + matmul(hp, rt);
      if (dw.rb.defined()) g = g + dw.rb;
      // Gate order in W, R and B: input, output, forget, cell.
      Tensor gi = gate(g, 0, h), go = gate(g, 1, h), gf = gate(g, 2, h), gc = gate(g, 3, h);
      if (pi.defined()) {
        gi = gi + pi * cp;
        gf = gf + pf * cp;
      }
      Tensor i = r.act(dir, 0, gi);
      Tensor f = input_forget ? 1.0 - i : r.act(dir, 0, gf);
      Tensor cc = r.act(dir, 1, gc);
      Tensor cn = f * cp + i * cc;
      if (po.defined()) go = go + po * cn;
      Tensor o = r.act(dir, 0, go);
      Tensor hn = o * r.act(dir, 2, cn);
      return std::vector<Tensor>{hn, cn};
    };
    auto [y, fin] = unroll(r, dir, {initial_state(c, r, 5, d), initial_state(c, r, 6, d)}, step);
    ys.push_back(y);
    finals.push_back(fin);
  }
  return outputs(r, ys, finals);
}

Tensors gru(OpContext& c) {
  Recurrence r = setup(c, {"Sigmoid", "Tanh"}, 3);
  const bool linear_before_reset = c.attr_int("linear_before_reset", 0) != 0;
  const int64_t h = r.hidden;
  std::vector<Tensor> ys;
  std::vector<std::vector<Tensor>> finals;
  for (size_t dir = 0; dir < r.reverse.size(); ++dir) {
    const auto d = static_cast<int64_t>(dir);
    DirWeights dw = dir_weights(c, r, d, 3);
    // Gate order: update (z), reset (r), hidden (h).
    Tensor rzr = narrow(dw.r, 0, 0, 2 * h).mT(), rh = narrow(dw.r, 0, 2 * h, h).mT();
    Tensor rb_zr, rb_h;
    if (dw.rb.defined()) {
      rb_zr = narrow(dw.rb, 0, 0, 2 * h);
      rb_h = narrow(dw.rb, 0, 2 * h, h);
    }
    auto step = [&](int64_t t, const std::vector<Tensor>& s) {
      const Tensor& hp = s[0];
      Tensor xt = select_dir(dw.xp, t);
      Tensor g = narrow(xt, -1, 0, 2 * h) + matmul(hp, rzr);
      if (rb_zr.defined()) g = g + rb_zr;
      Tensor z = r.act(dir, 0, gate(g, 0, h));
      Tensor rs = r.act(dir, 0, gate(g, 1, h));
      Tensor xh = gate(xt, 2, h);
      Tensor pre;
      if (linear_before_reset) {
        Tensor lin = matmul(hp, rh);
        if (rb_h.defined()) lin = lin + rb_h;
        pre = xh + rs * lin;
      } else {
        pre = xh + matmul(rs * hp, rh);
        if (rb_h.defined()) pre = pre + rb_h;
      }
      Tensor hh = r.act(dir, 1, pre);
      Tensor hn = (1.0 - z) * hh + z * hp;
      return std::vector<Tensor>{hn};
    };
    auto [y, fin] = unroll(r, dir, {initial_state(c, r, 5, d)}, step);
    ys.push_back(y);
    finals.push_back(fin);
  }
  return outputs(r, ys, finals);
}

Tensors rnn(OpContext& c) {
  Recurrence r = setup(c, {"Tanh"}, 1);
  std::vector<Tensor> ys;
  std::vector<std::vector<Tensor>> finals;
  for (size_t dir = 0; dir < r.reverse.size(); ++dir) {
    const auto d = static_cast<int64_t>(dir);
    DirWeights dw = dir_weights(c, r, d, 1);
    Tensor rt = dw.r.mT();
    auto step = [&](int64_t t, const std::vector<Tensor>& s) {
      Tensor g = select_dir(dw.xp, t) + matmul(s[0], rt);
      if (dw.rb.defined()) g = g + dw.rb;
      return std::vector<Tensor>{r.act(dir, 0, g)};
    };
    auto [y, fin] = unroll(r, dir, {initial_state(c, r, 5, d)}, step);
    ys.push_back(y);
    finals.push_back(fin);
  }
  return outputs(r, ys, finals);
}

std::vector<std::string> with(std::vector<std::string> v, const char* extra) {
  v.emplace_back(extra);
  return v;
}

}  // namespace

void register_rnn_ops(OpRegistry& r) {
  {
    OpSchema s = op("LSTM", with(kRnnAttributes, "input_forget"), lstm, 7);
    s.check = [](const Node& n, int64_t) { return check_rnn(n); };
    r.add(std::move(s));
  }
  {
    OpSchema s = op("GRU", with(kRnnAttributes, "linear_before_reset"), gru, 7);
    s.check = [](const Node& n, int64_t) { return check_rnn(n); };
    r.add(std::move(s));
  }
  {
    OpSchema s = op("RNN", kRnnAttributes, rnn, 7);
    s.check = [](const Node& n, int64_t) { return check_rnn(n); };
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx::ops
