// LSTM and GRU as composites of matmul, sigmoid and tanh per time step. The input projection of
// every step is one matmul over the whole sequence; only the recurrent product runs per step.
// Parameters start U(-1/sqrt(hidden), 1/sqrt(hidden)), as PyTorch's.
#include <cmath>

#include "braid/nn/init.h"
#include "braid/nn/layers.h"
#include "braid/nn/recurrent.h"
#include "braid/ops.h"

namespace braid::nn {

namespace {

// Note [Unstacking a sequence]
// Each narrow's backward allocates a zero gradient of its source's full size, so cutting T steps
// straight off a (T, ...) tensor costs O(T^2) in backward. Halving recursively costs O(T log T).
void unstack_into(const Tensor& x, std::vector<Tensor>& out) {
  const int64_t n = x.size(0);
  if (n == 1) {
    out.push_back(x.squeeze(0));
    return;
  }
  unstack_into(x.narrow(0, 0, n / 2), out);
  unstack_into(x.narrow(0, n / 2, n - n / 2), out);
}

}  // namespace

RNNBase::RNNBase(std::string type, int64_t gates, bool cell_state, int64_t input_size, int64_t hidden_size,
                 int64_t num_layers, bool bias, bool batch_first, double dropout, bool bidirectional, Generator* gen)
    : Module(std::move(type)), cell_state_(cell_state), input_size_(input_size), hidden_size_(hidden_size), num_layers_(num_layers),
      bias_(bias), batch_first_(batch_first), dropout_(dropout), bidirectional_(bidirectional), gen_(gen) {
  BRAID_CHECK(input_size > 0 && hidden_size > 0 && num_layers > 0, type_name(), ": input_size, hidden_size and "
              "num_layers must be positive, got ", input_size, ", ", hidden_size, " and ", num_layers);
  BRAID_CHECK(dropout >= 0.0 && dropout <= 1.0, type_name(), ": dropout must be in [0, 1], got ", dropout);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  const int64_t dirs = bidirectional ? 2 : 1, rows = gates * hidden_size;
  auto param = [&](const std::string& name, const Shape& shape) {
    return register_parameter(name, init::uniform_(empty(shape, kFloat32, default_device()), -bound, bound));
  };
  for (int64_t l = 0; l < num_layers; ++l)
    for (int64_t d = 0; d < dirs; ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      const int64_t in = l == 0 ? input_size : dirs * hidden_size;
      std::vector<Tensor> w{param("weight_ih" + sfx, {rows, in}), param("weight_hh" + sfx, {rows, hidden_size})};
      if (bias) {
        w.push_back(param("bias_ih" + sfx, {rows}));
        w.push_back(param("bias_hh" + sfx, {rows}));
      } else {
        w.resize(4);
      }
      weights_.push_back(std::move(w));
    }
}

void RNNBase::check_state(const Tensor& s, const char* name, int64_t batch, bool batched) const {
  if (!s.defined()) return;
  const int64_t layers = (bidirectional_ ? 2 : 1) * num_layers_;
  const Shape want = batched ? Shape{layers, batch, hidden_size_} : Shape{layers, hidden_size_};
  BRAID_CHECK(s.shape() == want, type_name(), ": expected ", name, " of shape ", shape_str(want),
              " (num_layers * num_directions, batch, hidden_size), got ", shape_str(s.shape()));
}

Tensor RNNBase::forward(const Tensor& x) { return run(x, Tensor(), Tensor())[0]; }

std::vector<Tensor> RNNBase::run(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  BRAID_CHECK((x.dim() == 2 || x.dim() == 3) && x.size(-1) == input_size_, type_name(), ": expected input (L, N, ",
              input_size_, "), (N, L, ", input_size_, ") with batch_first or unbatched (L, ", input_size_,
              "), got shape ", shape_str(x.shape()));
  const bool batched = x.dim() == 3;
  Tensor seq = !batched ? x.unsqueeze(1) : batch_first_ ? x.transpose(0, 1) : x;  // (T, N, in)
  const int64_t steps = seq.size(0), batch = seq.size(1), dirs = bidirectional_ ? 2 : 1;
  BRAID_CHECK(steps > 0, type_name(), ": the input sequence is empty (shape ", shape_str(x.shape()), ")");
  check_state(h0, "h0", batch, batched);
  check_state(c0, "c0", batch, batched);
  auto initial = [&](const Tensor& s, int64_t k) {
    if (!s.defined()) return zeros({batch, hidden_size_}, x.dtype(), x.device());
    return batched ? s.select(0, k) : s.select(0, k).unsqueeze(0);
  };
  std::vector<Tensor> h_n, c_n;
  for (int64_t l = 0; l < num_layers_; ++l) {
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < dirs; ++d) {
      const std::vector<Tensor>& w = weights_[static_cast<size_t>(l * dirs + d)];
      std::vector<Tensor> gi;
      unstack_into(linear(seq, w[0], w[2]), gi);
      Tensor h = initial(h0, l * dirs + d), c = cell_state_ ? initial(c0, l * dirs + d) : Tensor();
      std::vector<Tensor> hs(static_cast<size_t>(steps));
      for (int64_t s = 0; s < steps; ++s) {
        const size_t t = static_cast<size_t>(d ? steps - 1 - s : s);
        std::vector<Tensor> next = cell(gi[t], h, c, w[1], w[3]);
        h = next[0];
        if (cell_state_) c = next[1];
        hs[t] = h;
      }
      outs.push_back(stack(hs, 0));
      h_n.push_back(h);
      c_n.push_back(c);
    }
    seq = dirs == 2 ? concat(outs, -1) : outs[0];
    if (l + 1 < num_layers_) seq = dropout(seq, dropout_, is_training(), gen_);
  }
  Tensor out = !batched ? seq.squeeze(1) : batch_first_ ? seq.transpose(0, 1) : seq;
  auto states = [&](const std::vector<Tensor>& v) { return batched ? stack(v, 0) : stack(v, 0).squeeze(1); };
  std::vector<Tensor> result{out, states(h_n)};
  if (cell_state_) result.push_back(states(c_n));
  return result;
}

// As PyTorch prints it: only the arguments that differ from their defaults.
std::string RNNBase::describe() const {
  std::string s = detail::cat(type_name(), "(", input_size_, ", ", hidden_size_);
  if (num_layers_ != 1) s += detail::cat(", num_layers=", num_layers_);
  if (!bias_) s += ", bias=False";
  if (batch_first_) s += ", batch_first=True";
  if (dropout_ != 0.0) s += detail::cat(", dropout=", dropout_);
  if (bidirectional_) s += ", bidirectional=True";
  return s + ")";
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, const RNNOptions& o)
    : LSTM(input_size, hidden_size, o.num_layers, o.bias, o.batch_first, o.dropout, o.bidirectional, o.generator) {}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bias, bool batch_first, double dropout,
           bool bidirectional, Generator* gen)
    : RNNBase("LSTM", 4, true, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, gen) {}

std::vector<Tensor> LSTM::forward_all(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  return run(x, h0, c0);
}

// Gates in PyTorch's order: input, forget, cell candidate, output.
std::vector<Tensor> LSTM::cell(const Tensor& gi, const Tensor& h, const Tensor& c, const Tensor& w_hh,
                               const Tensor& b_hh) {
  std::vector<Tensor> g = chunk(gi + linear(h, w_hh, b_hh), 4, 1);
  Tensor c_next = sigmoid(g[1]) * c + sigmoid(g[0]) * tanh(g[2]);
  return {sigmoid(g[3]) * tanh(c_next), c_next};
}

GRU::GRU(int64_t input_size, int64_t hidden_size, const RNNOptions& o)
    : GRU(input_size, hidden_size, o.num_layers, o.bias, o.batch_first, o.dropout, o.bidirectional, o.generator) {}

GRU::GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bias, bool batch_first, double dropout,
         bool bidirectional, Generator* gen)
    : RNNBase("GRU", 3, false, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, gen) {}

std::vector<Tensor> GRU::forward_all(const Tensor& x, const Tensor& h0) { return run(x, h0, Tensor()); }

// Gates in PyTorch's order: reset, update, new; the reset gate scales the recurrent part of n only.
std::vector<Tensor> GRU::cell(const Tensor& gi, const Tensor& h, const Tensor&, const Tensor& w_hh,
                              const Tensor& b_hh) {
  std::vector<Tensor> i = chunk(gi, 3, 1), r = chunk(linear(h, w_hh, b_hh), 3, 1);
  Tensor reset = sigmoid(i[0] + r[0]), update = sigmoid(i[1] + r[1]);
  Tensor n = tanh(i[2] + reset * r[2]);
  return {n + update * (h - n)};
}

}  // namespace braid::nn
