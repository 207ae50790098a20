// MultiheadAttention: scaled_dot_product_attention over heads, with masks turned into one additive
// term (bool: -inf where true); forward_all, which returns the weights, composes it, initialised as PyTorch's (xavier_uniform_ in_proj_weight,
// zero biases, out_proj a Linear with zero bias).
#include <cmath>
#include <limits>
#include <memory>

#include "braid/nn/attention.h"
#include "braid/nn/init.h"
#include "braid/ops.h"

namespace braid::nn {

Tensor generate_square_subsequent_mask(int64_t n, DType dtype, Device device) {
  BRAID_CHECK(n >= 0, "generate_square_subsequent_mask: size must be non-negative, got ", n);
  Tensor i = arange(n, kInt64, device);
  return where(gt(i.unsqueeze(0), i.unsqueeze(1)), full({}, -std::numeric_limits<double>::infinity(), dtype, device),
               zeros({}, dtype, device));
}

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& o)
    : MultiheadAttention(embed_dim, num_heads, o.dropout, o.bias, o.batch_first, o.generator) {}

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                       bool batch_first, Generator* gen)
    : Module("MultiheadAttention"), embed_dim_(embed_dim), num_heads_(num_heads), dropout_(dropout),
      batch_first_(batch_first), gen_(gen) {
  BRAID_CHECK(embed_dim > 0 && num_heads > 0, "MultiheadAttention: embed_dim and num_heads must be positive, got ",
              embed_dim, " and ", num_heads);
  BRAID_CHECK(embed_dim % num_heads == 0, "MultiheadAttention: embed_dim (", embed_dim,
              ") must be divisible by num_heads (", num_heads, ")");
  BRAID_CHECK(dropout >= 0.0 && dropout <= 1.0, "MultiheadAttention: dropout must be in [0, 1], got ", dropout);
  in_proj_weight_ = register_parameter("in_proj_weight", init::xavier_uniform_(empty({3 * embed_dim, embed_dim}, kFloat32, default_device())));
  if (bias) in_proj_bias_ = register_parameter("in_proj_bias", zeros({3 * embed_dim}, kFloat32, default_device()));
  auto out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, bias));
  if (bias) init::zeros_(out_proj->bias());
}

namespace {

/// A bool mask (true = masked) as 0 / -inf, a float mask as it is, both in dtype.
Tensor additive_mask(const Tensor& mask, DType dtype, const char* name) {
  if (mask.dtype() == kBool)
    return where(mask, full({}, -std::numeric_limits<double>::infinity(), dtype, mask.device()),
                 zeros({}, dtype, mask.device()));
  BRAID_CHECK_T(TypeError, is_floating(mask.dtype()), "MultiheadAttention: ", name,
                " must be bool or floating-point, got ", dtype_name(mask.dtype()));
  return mask.to(dtype);
}

}  // namespace

Tensor MultiheadAttention::forward(const Tensor& x) { return attend(x, x, x, Tensor(), Tensor(), false, false)[0]; }

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, const Tensor& attn_mask) {
  return attend(query, key, value, key_padding_mask, attn_mask, false, false)[0];
}

std::vector<Tensor> MultiheadAttention::forward_all(const Tensor& query, const Tensor& key, const Tensor& value,
                                                    const Tensor& key_padding_mask, const Tensor& attn_mask,
                                                    bool average_attn_weights) {
  return attend(query, key, value, key_padding_mask, attn_mask, true, average_attn_weights);
}

std::vector<Tensor> MultiheadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value,
                                               const Tensor& key_padding_mask, const Tensor& attn_mask,
                                               bool need_weights, bool average_attn_weights) {
  const int64_t E = embed_dim_, H = num_heads_, Dh = E / H;
  BRAID_CHECK(query.dim() == 2 || query.dim() == 3, "MultiheadAttention: expected a 3-d (batched) or 2-d (unbatched) "
              "query, got shape ", shape_str(query.shape()));
  BRAID_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), "MultiheadAttention: query, key and value must "
              "have the same rank, got shapes ", shape_str(query.shape()), ", ", shape_str(key.shape()), " and ",
              shape_str(value.shape()));
  BRAID_CHECK(query.size(-1) == E && key.size(-1) == E && value.size(-1) == E, "MultiheadAttention: expected ", E,
              " features (embed_dim) in query, key and value, got shapes ", shape_str(query.shape()), ", ",
              shape_str(key.shape()), " and ", shape_str(value.shape()));
  const bool batched = query.dim() == 3;
  // Work batch-first: (N, L, E).
  auto to_nle = [&](const Tensor& t) { return !batched ? t.unsqueeze(0) : batch_first_ ? t : t.transpose(0, 1); };
  Tensor q = to_nle(query), k = to_nle(key), v = to_nle(value);
  const int64_t N = q.size(0), L = q.size(1), S = k.size(1);
  BRAID_CHECK(k.size(0) == N && v.size(0) == N && v.size(1) == S, "MultiheadAttention: key and value must match the "
              "query's batch size and each other's sequence length, got shapes ", shape_str(query.shape()), ", ",
              shape_str(key.shape()), " and ", shape_str(value.shape()), batch_first_ ? " (batch_first)" : "");

  if (query.is_same(key) && key.is_same(value)) {  // self-attention: one product for q, k and v
    std::vector<Tensor> qkv = chunk(linear(q, in_proj_weight_, in_proj_bias_), 3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    std::vector<Tensor> w = chunk(in_proj_weight_, 3, 0), b(3);
    if (in_proj_bias_.defined()) b = chunk(in_proj_bias_, 3, 0);
    q = linear(q, w[0], b[0]), k = linear(k, w[1], b[1]), v = linear(v, w[2], b[2]);
  }
  auto heads = [&](const Tensor& t, int64_t len) { return t.reshape({N, len, H, Dh}).permute({0, 2, 1, 3}); };
  const Tensor qh = heads(q, L), kh = heads(k, S), vh = heads(v, S);  // (N, H, L or S, Dh)
  Tensor mask;  // additive, broadcasting to (N, H, L, S)
  if (attn_mask.defined()) {
    const bool ok = (attn_mask.dim() == 2 && attn_mask.shape() == Shape{L, S}) ||
                    (attn_mask.dim() == 3 && attn_mask.shape() == Shape{N * H, L, S});
    BRAID_CHECK(ok, "MultiheadAttention: attn_mask must have shape ", shape_str({L, S}), " or ",
                shape_str({N * H, L, S}), " (batch * num_heads, L, S), got ", shape_str(attn_mask.shape()));
    mask = additive_mask(attn_mask, qh.dtype(), "attn_mask");
    if (mask.dim() == 3) mask = mask.reshape({N, H, L, S});
  }
  if (key_padding_mask.defined()) {
    const Shape want = batched ? Shape{N, S} : Shape{S};
    BRAID_CHECK(key_padding_mask.shape() == want, "MultiheadAttention: key_padding_mask must have shape ",
                shape_str(want), " (batch, source length), got ", shape_str(key_padding_mask.shape()));
    const Tensor m = additive_mask(key_padding_mask, qh.dtype(), "key_padding_mask").reshape({N, 1, 1, S});
    mask = mask.defined() ? mask + m : m;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  Tensor out, attn;
  if (need_weights) {  // the probabilities are asked for: the composite, which holds them
    Tensor scores = matmul(qh * scale, kh.mT());  // (N, H, L, S)
    if (mask.defined()) scores = scores + mask;
    attn = dropout(softmax(scores, -1), dropout_, is_training(), gen_);
    out = matmul(attn, vh);
  } else {
    out = scaled_dot_product_attention(qh, kh, vh, mask, is_training() ? dropout_ : 0.0, false, scale, gen_);
  }
  out = child("out_proj")->forward(out.permute({0, 2, 1, 3}).reshape({N, L, E}));
  Tensor weights = !need_weights ? Tensor() : average_attn_weights ? mean(attn, {1}) : attn;
  if (!batched) return {out.squeeze(0), weights.defined() ? weights.squeeze(0) : weights};
  return {batch_first_ ? out : out.transpose(0, 1), weights};
}

std::string MultiheadAttention::describe() const {
  return detail::cat("MultiheadAttention(embed_dim=", embed_dim_, ", num_heads=", num_heads_, ", dropout=", dropout_,
                     ", batch_first=", batch_first_ ? "True" : "False", ")");
}

}  // namespace braid::nn
