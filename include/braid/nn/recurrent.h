// LSTM and GRU: multi-layer, optionally bidirectional, sequence-first or batch_first, with
// PyTorch's gate order (LSTM i, f, g, o; GRU r, z, n) and parameter names (weight_ih_l0,
// weight_hh_l0, bias_ih_l0, bias_hh_l0, ..._reverse), so that state dicts map 1:1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/nn/module.h"
#include "braid/random.h"

namespace braid::nn {

/// LSTM's and GRU's settings (Note [Layer options] in layers.h).
struct RNNOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;  // between layers
  bool bidirectional = false;
  Generator* generator = nullptr;  // dropout's; nullptr: the default generator
};

struct RNNConfig {
  int64_t input_size, hidden_size;
  RNNOptions options;
};

/// What LSTM and GRU share: parameters, layer and direction loops, shape checks. Input (L, N, H_in),
/// (N, L, H_in) with batch_first, or unbatched (L, H_in); output (L, N, D * H) likewise, where D is
/// 2 when bidirectional; states (D * num_layers, N, H), or (D * num_layers, H) unbatched.
/// dropout (training only, drawn from gen or default_generator()) applies to every layer's output
/// but the last.
class RNNBase : public Module {
 public:
  /// The output sequence.
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  RNNConfig config() const {
    return {input_size_, hidden_size_, {num_layers_, bias_, batch_first_, dropout_, bidirectional_, gen_}};
  }

 protected:
  /// gates: rows of W_ih per hidden unit (4 for LSTM, 3 for GRU); cell_state: whether the cell
  /// carries a c beside h (LSTM).
  RNNBase(std::string type, int64_t gates, bool cell_state, int64_t input_size, int64_t hidden_size,
          int64_t num_layers, bool bias, bool batch_first, double dropout, bool bidirectional, Generator* gen);
  /// {output, h_n} and, with a cell state, c_n; undefined initial states are zeros.
  std::vector<Tensor> run(const Tensor& x, const Tensor& h0, const Tensor& c0);
  /// One time step: gi = x_t W_ih^T + b_ih (N, gates * H) precomputed for all steps; h, c (N, H).
  /// Returns the new h and (LSTM) c.
  virtual std::vector<Tensor> cell(const Tensor& gi, const Tensor& h, const Tensor& c, const Tensor& w_hh,
                                   const Tensor& b_hh) = 0;

 private:
  void check_state(const Tensor& s, const char* name, int64_t batch, bool batched) const;
  bool cell_state_;
  int64_t input_size_, hidden_size_, num_layers_;
  bool bias_, batch_first_;
  double dropout_;
  bool bidirectional_;
  Generator* gen_;
  // Per layer and direction (index 2 * layer + direction): weight_ih, weight_hh, bias_ih, bias_hh.
  std::vector<std::vector<Tensor>> weights_;
};

class LSTM : public RNNBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, const RNNOptions& options);
  // Deprecated beyond hidden_size (Note [Layer options]): the options struct's fields in order.
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true, bool batch_first = false,
       double dropout = 0.0, bool bidirectional = false, Generator* generator = nullptr);
  /// {output, h_n, c_n}.
  std::vector<Tensor> forward_all(const Tensor& x, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());

 protected:
  std::vector<Tensor> cell(const Tensor& gi, const Tensor& h, const Tensor& c, const Tensor& w_hh,
                           const Tensor& b_hh) override;
};

class GRU : public RNNBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, const RNNOptions& options);
  // Deprecated beyond hidden_size (Note [Layer options]): the options struct's fields in order.
  GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true, bool batch_first = false,
      double dropout = 0.0, bool bidirectional = false, Generator* generator = nullptr);
  /// {output, h_n}.
  std::vector<Tensor> forward_all(const Tensor& x, const Tensor& h0 = Tensor());

 protected:
  std::vector<Tensor> cell(const Tensor& gi, const Tensor& h, const Tensor& c, const Tensor& w_hh,
                           const Tensor& b_hh) override;
};

}  // namespace braid::nn
