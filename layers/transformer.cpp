// TransformerEncoderLayer: self-attention and a feed-forward block, each wrapped in dropout, a
// residual connection and LayerNorm, in PyTorch's post-norm or pre-norm (norm_first) order and
// with its child names (self_attn, linear1, dropout, linear2, norm1, norm2, dropout1, dropout2).
#include <memory>

#include "braid/nn/attention.h"
#include "braid/ops.h"

namespace braid::nn {

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, const TransformerEncoderLayerOptions& o)
    : TransformerEncoderLayer(d_model, nhead, o.dim_feedforward, o.dropout, o.activation, o.layer_norm_eps, o.batch_first,
                              o.norm_first, o.generator) {}

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                 double dropout, const std::string& activation,
                                                 double layer_norm_eps, bool batch_first, bool norm_first,
                                                 Generator* gen)
    : Module("TransformerEncoderLayer"),
      config_{d_model, nhead, {dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, gen}} {
  BRAID_CHECK(activation == "relu" || activation == "gelu", "TransformerEncoderLayer: unknown activation '",
              activation, "'; known: relu, gelu");
  register_module("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, dropout, true, batch_first, gen));
  register_module("linear1", std::make_shared<Linear>(d_model, dim_feedforward));
  register_module("dropout", std::make_shared<Dropout>(dropout, gen));
  register_module("linear2", std::make_shared<Linear>(dim_feedforward, d_model));
  register_module("norm1", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("norm2", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("dropout1", std::make_shared<Dropout>(dropout, gen));
  register_module("dropout2", std::make_shared<Dropout>(dropout, gen));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src) { return forward(src, Tensor(), Tensor()); }

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask) {
  Tensor x = src;
  auto run = [this](const char* name, const Tensor& t) { return child(name)->forward(t); };
  if (config_.options.norm_first) {
    x = x + self_attention_block(run("norm1", x), src_mask, src_key_padding_mask);
    return x + feed_forward_block(run("norm2", x));
  }
  x = run("norm1", x + self_attention_block(x, src_mask, src_key_padding_mask));
  return run("norm2", x + feed_forward_block(x));
}

// Children are looked up on each call rather than held, so that replace_child takes effect. A
// self_attn that is not a MultiheadAttention (a tensor-parallel one, which holds a share of the
// heads) is called as forward(x), so it serves only where there are no masks.
Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& mask,
                                                     const Tensor& key_padding_mask) {
  ModulePtr self_attn = child("self_attn");
  if (auto attn = std::dynamic_pointer_cast<MultiheadAttention>(self_attn))
    return child("dropout1")->forward(attn->forward(x, x, x, key_padding_mask, mask));
  BRAID_CHECK_T(TypeError, !mask.defined() && !key_padding_mask.defined(), "TransformerEncoderLayer: masks need a ",
                "MultiheadAttention as child 'self_attn', got a ", self_attn->type_name());
  return child("dropout1")->forward(self_attn->forward(x));
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  Tensor h = child("linear1")->forward(x);
  h = config_.options.activation == "relu" ? relu(h) : gelu(h);
  h = child("linear2")->forward(child("dropout")->forward(h));
  return child("dropout2")->forward(h);
}

std::string TransformerEncoderLayer::describe() const {
  return detail::cat("TransformerEncoderLayer(activation=", config_.options.activation, ", norm_first=", config_.options.norm_first ? "True" : "False",
                     ")");
}

}  // namespace braid::nn
