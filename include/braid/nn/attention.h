// Multi-head attention and the Transformer encoder layer, with PyTorch's parameter names
// (in_proj_weight, out_proj.weight, linear1.weight, norm1.weight, ...), defaults and mask
// conventions: a bool mask is true where attention is NOT allowed, a float mask is added to the scores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/dtype.h"
#include "braid/ops.h"
#include "braid/nn/layers.h"

namespace braid::nn {

/// The (n, n) float mask with -inf above the diagonal: position i attends to positions <= i.
Tensor generate_square_subsequent_mask(int64_t n, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);

/// MultiheadAttention's settings (Note [Layer options] in layers.h).
struct MultiheadAttentionOptions {
  double dropout = 0.0;
  bool bias = true;
  bool batch_first = false;
  Generator* generator = nullptr;  // dropout's; nullptr: the default generator
};

struct MultiheadAttentionConfig {
  int64_t embed_dim, num_heads;
  MultiheadAttentionOptions options;
};

/// Scaled dot-product attention over num_heads heads of embed_dim / num_heads features.
/// Inputs are (L, N, E), or (N, L, E) with batch_first, or unbatched (L, E). Parameters:
/// in_proj_weight (3E, E), in_proj_bias (3E), out_proj.weight (E, E), out_proj.bias (E).
/// (PyTorch's add_bias_kv, add_zero_attn, kdim and vdim are not offered.)
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& options);
  // Deprecated beyond num_heads (Note [Layer options]): the options struct's fields in order.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false, Generator* generator = nullptr);
  /// Self-attention without masks.
  Tensor forward(const Tensor& x) override;
  /// The attention output only.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 const Tensor& attn_mask = Tensor());
  /// {output, attention weights}. key_padding_mask (N, S) or (S) unbatched; attn_mask (L, S) or
  /// (N * num_heads, L, S). Weights are (N, L, S) averaged over heads, or (N, num_heads, L, S).
  std::vector<Tensor> forward_all(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(),
                                  bool average_attn_weights = true);
  std::string describe() const override;
  MultiheadAttentionConfig config() const {
    return {embed_dim_, num_heads_, {dropout_, in_proj_bias_.defined(), batch_first_, gen_}};
  }

 private:
  std::vector<Tensor> attend(const Tensor& query, const Tensor& key, const Tensor& value,
                             const Tensor& key_padding_mask, const Tensor& attn_mask, bool need_weights,
                             bool average_attn_weights);
  int64_t embed_dim_, num_heads_;
  double dropout_;
  bool batch_first_;
  Generator* gen_;
  Tensor in_proj_weight_, in_proj_bias_;
};

/// TransformerEncoderLayer's settings (Note [Layer options] in layers.h).
struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  Generator* generator = nullptr;  // dropout's; nullptr: the default generator
};

struct TransformerEncoderLayerConfig {
  int64_t d_model, nhead;
  TransformerEncoderLayerOptions options;
};

/// Self-attention then a feed-forward block, each with a residual connection and LayerNorm
/// (after the residual, or before the block with norm_first). activation: "relu" or "gelu".
/// Inputs as MultiheadAttention's.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, const TransformerEncoderLayerOptions& options);
  // Deprecated beyond nhead (Note [Layer options]): the options struct's fields in order.
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048, double dropout = 0.1,
                          const std::string& activation = "relu", double layer_norm_eps = 1e-5,
                          bool batch_first = false, bool norm_first = false, Generator* generator = nullptr);
  Tensor forward(const Tensor& src) override;
  /// src_mask as attn_mask, src_key_padding_mask as key_padding_mask of MultiheadAttention.
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor());
  std::string describe() const override;
  const TransformerEncoderLayerConfig& config() const { return config_; }

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& key_padding_mask);
  Tensor feed_forward_block(const Tensor& x);
  TransformerEncoderLayerConfig config_;
};

}  // namespace braid::nn
