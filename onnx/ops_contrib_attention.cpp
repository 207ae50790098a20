// onnxruntime's com.microsoft attention operators, as its transformer optimizer writes them into
// BERT- and GPT-shaped models: Attention (the input projection and attention in one node) and
// MultiHeadAttention (projected query, key and value), with their masks, attention bias, causal
// mode and past key/value. Composites of braid ops (so they train), checked against onnxruntime in
// bindings/python/tests/test_onnx_contrib.py. (ops_contrib.cpp holds the other com.microsoft ops.)
#include <cmath>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

/// (B, T, N * D) -> (B, N, T, D).
Tensor split_heads(const Tensor& x, int64_t heads) {
  return permute(reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}), {0, 2, 1, 3});
}

/// (B, N, T, D) -> (B, T, N * D).
Tensor merge_heads(const Tensor& x) {
  const Tensor t = permute(x, {0, 2, 1, 3});
  return reshape(t, {t.size(0), t.size(1), t.size(2) * t.size(3)});
}

/// softmax(q k^T * scale + bias) v with q (B, N, S, D), k and v (B, N, L, D), bias broadcasting to
/// (B, N, S, L) or undefined; `causal` masks key j for query i where j > i + L - S (the past
/// before the S new positions stays visible), with mask_filter_value as onnxruntime does.
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor bias, bool causal,
              double filter) {
  Tensor scores = matmul(q, k.mT()) * scale;
  if (bias.defined()) scores = scores + bias;
  if (causal) {
    const int64_t s = q.size(2), l = k.size(2);
    std::vector<float> m(static_cast<size_t>(s * l), 0.0f);
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = i + l - s + 1; j < l; ++j) m[static_cast<size_t>(i * l + j)] = static_cast<float>(filter);
    scores = scores + cast(tensor(m, {s, l}, q.device()), scores.dtype());
  }
  return matmul(softmax(scores, -1), v);
}

/// The additive bias of a key padding mask: (B, L) of 1 (attend) and 0 (masked), or (B) key
/// lengths (keys at and past the length masked); `filter` where masked, else 0, shaped (B, 1, 1, L).
Tensor padding_bias(OpContext& c, const Tensor& mask, int64_t b, int64_t l, double filter, const char* what) {
  Tensor keep;
  if (mask.dim() == 2 && mask.size(0) == b && mask.size(1) == l) {
    keep = cast(mask, kFloat32);
  } else if (mask.dim() == 1 && mask.size(0) == b) {
    std::vector<int64_t> len = cast(mask, kInt64).to_vector<int64_t>();
    std::vector<float> k(static_cast<size_t>(b * l));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < l; ++j) k[static_cast<size_t>(i * l + j)] = j < len[static_cast<size_t>(i)] ? 1.0f : 0.0f;
    keep = tensor(k, {b, l}, mask.device());
  } else {
    c.fail(what, " of shape ", shape_str(mask.shape()), " is not supported (", b, " or ", b, " x ", l, ")");
  }
  return reshape((1.0 - keep) * filter, {b, 1, 1, l});
}

double scale_of(OpContext& c, int64_t head_size) {
  const double s = c.attr_float("scale", 0.0);
  return s != 0.0 ? s : 1.0 / std::sqrt(static_cast<double>(head_size));
}

// MultiHeadAttention: query (B, S, N * D), key and value (B, L, N * D), bias (3 * N * D) added to
// the three, key_padding_mask, attention_bias (B or 1, N or 1, S, L), past_key / past_value
// (B, N, P, D) before the new keys; outputs the attention and present_key / present_value.
Tensors multi_head_attention(OpContext& c) {
  const int64_t heads = c.attr_int("num_heads", 0);
  Tensor q = c.input(0);
  if (heads <= 0) c.fail("num_heads must be positive, got ", heads);
  if (q.dim() != 3 || q.size(2) % heads != 0) c.fail("query must be (B, S, num_heads * D), got ", shape_str(q.shape()));
  if (!c.has_input(1) || !c.has_input(2) || c.input(1).dim() != 3)
    c.fail("key and value must be given as (B, L, num_heads * D) (packed or per-head forms are not supported)");
  Tensor k = c.input(1), v = c.input(2);
  const int64_t hidden = q.size(2);
  if (c.has_input(3)) {
    const Tensor& bias = c.input(3);
    q = q + narrow(bias, 0, 0, hidden);
    k = k + narrow(bias, 0, hidden, hidden);
    v = v + narrow(bias, 0, 2 * hidden, v.size(2));
  }
  q = split_heads(q, heads), k = split_heads(k, heads), v = split_heads(v, heads);
  if (c.has_input(6) != c.has_input(7)) c.fail("past_key and past_value come together");
  if (c.has_input(6)) k = concat({c.input(6), k}, 2), v = concat({c.input(7), v}, 2);
  const double filter = c.attr_float("mask_filter_value", -10000.0);
  Tensor bias;
  if (c.has_input(4)) bias = padding_bias(c, c.input(4), q.size(0), k.size(2), filter, "key_padding_mask");
  if (c.has_input(5)) bias = bias.defined() ? bias + c.input(5) : c.input(5);
  const Tensor y = attend(q, k, v, scale_of(c, q.size(3)), bias, c.attr_int("unidirectional", 0) != 0, filter);
  return {merge_heads(y), k, v};
}

// Attention: input (B, S, in) times weights (in, 3 * hidden) plus bias (3 * hidden) gives q, k and
// v (qkv_hidden_sizes when they differ); mask_index (B, S_total) of 1 and 0, (B) key lengths or
// (B, S, S_total); past (2, B, N, P, D); outputs the attention and present (2, B, N, P + S, D).
/// Attention after its input projection: qkv (B, S, q + k + v hidden) split by qkv_hidden_sizes;
/// the mask, past and attention bias at the given inputs (0: the op has none).
Tensors attention_of(OpContext& c, const Tensor& qkv, size_t mask_input, size_t past_input, size_t bias_input) {
  const int64_t heads = c.attr_int("num_heads", 0);
  if (heads <= 0) c.fail("num_heads must be positive, got ", heads);
  if (c.attr_int("do_rotary", 0) != 0) c.fail("do_rotary is not supported");
  std::vector<int64_t> sizes = c.attr_ints("qkv_hidden_sizes");
  if (sizes.empty()) sizes = std::vector<int64_t>(3, qkv.size(2) / 3);
  if (sizes.size() != 3 || sizes[0] + sizes[1] + sizes[2] != qkv.size(2) || sizes[0] != sizes[1])
    c.fail("qkv_hidden_sizes ", shape_str(sizes), " do not split the projection of ", qkv.size(2));
  Tensor q = split_heads(narrow(qkv, 2, 0, sizes[0]), heads);
  Tensor k = split_heads(narrow(qkv, 2, sizes[0], sizes[1]), heads);
  Tensor v = split_heads(narrow(qkv, 2, sizes[0] + sizes[1], sizes[2]), heads);
  if (past_input != 0 && c.has_input(past_input)) {
    const Tensor& past = c.input(past_input);
    k = concat({past.select(0, 0), k}, 2);
    v = concat({past.select(0, 1), v}, 2);
  }
  const double filter = c.attr_float("mask_filter_value", -10000.0);
  const int64_t b = qkv.size(0), s = qkv.size(1), total = k.size(2);
  Tensor bias;
  if (mask_input != 0 && c.has_input(mask_input)) {
    const Tensor& mask = c.input(mask_input);
    if (mask.dim() == 3 && mask.size(0) == b && mask.size(1) == s && mask.size(2) == total)
      bias = reshape((1.0 - cast(mask, kFloat32)) * filter, {b, 1, s, total});
    else
      bias = padding_bias(c, mask, b, total, filter, "mask_index");
  }
  if (bias_input != 0 && c.has_input(bias_input))
    bias = bias.defined() ? bias + c.input(bias_input) : c.input(bias_input);
  const Tensor y = attend(q, k, v, scale_of(c, q.size(3)), bias, c.attr_int("unidirectional", 0) != 0, filter);
  if (k.size(3) != v.size(3)) return {merge_heads(y)};  // no present when the value heads are narrower
  return {merge_heads(y), stack({k, v}, 0)};
}

// Attention: input (B, S, in) times weights (in, 3 * hidden) plus bias (3 * hidden) gives q, k and
// v (qkv_hidden_sizes when they differ); mask_index (B, S_total) of 1 and 0, (B) key lengths or
// (B, S, S_total); past (2, B, N, P, D); outputs the attention and present (2, B, N, P + S, D).
Tensors attention(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() != 3) c.fail("input must be (B, S, input_hidden), got ", shape_str(x.shape()));
  Tensor qkv = matmul(x, c.input(1));
  if (c.has_input(2)) qkv = qkv + c.input(2);
  return attention_of(c, qkv, 3, 4, 5);
}

// QAttention (what quantize_dynamic makes of Attention): input (uint8 or int8) and weight (int8 or
// uint8) with their scales (inputs 3, 4; the weight's per tensor or per column) and zero points
// (6, 7); the exact integer product, scaled, plus bias, then Attention's; mask_index 5, past 8.
Tensors qattention(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() != 3) c.fail("input must be (B, S, input_hidden), got ", shape_str(x.shape()));
  auto zero = [&](size_t i) { return c.has_input(i) ? reshape(c.input(i), {-1}) : Tensor(); };
  const Tensor acc = cast(integer_matmul(c, x, zero(6), c.input(1), zero(7)), kFloat32);  // exact int32 sums
  Tensor qkv = acc * (cast(reshape(c.input(3), {}), kFloat32) * cast(reshape(c.input(4), {-1}), kFloat32));
  if (c.has_input(2)) qkv = qkv + c.input(2);
  return attention_of(c, qkv, 5, 8, 0);
}

/// (B, KV, T, D) with each of the KV heads serving `groups` query heads -> (B, KV * groups, T, D).
Tensor repeat_kv(const Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const Shape& s = x.shape();
  return reshape(expand(unsqueeze(x, 2), {s[0], s[1], groups, s[2], s[3]}), {s[0], s[1] * groups, s[2], s[3]});
}

// GroupQueryAttention: query (B, S, N * D) with key and value (B, S, KV * D), or the three packed
// in query; past_key / past_value (B, KV, P, D); seqlens_k (B) the total length of each sequence
// minus one; causal, each key head shared by N / KV query heads. Without a past, keys at and past
// a sequence's length are padding; with one, every sequence must end at P + S (a past of ragged
// lengths in a shared buffer is not supported). Outputs the attention and present_key /
// present_value (B, KV, P + S, D).
Tensors group_query_attention(OpContext& c) {
  const int64_t heads = c.attr_int("num_heads", 0), kv_heads = c.attr_int("kv_num_heads", 0);
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    c.fail("num_heads ", heads, " must be a positive multiple of kv_num_heads ", kv_heads);
  if (c.attr_int("do_rotary", 0) != 0) c.fail("do_rotary is not supported (a RotaryEmbedding node before it is)");
  if (c.attr_int("local_window_size", -1) != -1) c.fail("local_window_size is not supported");
  if (c.attr_float("softcap", 0.0) != 0.0 || c.attr_int("smooth_softmax", 0) != 0)
    c.fail("softcap and smooth_softmax are not supported");
  if (c.has_input(10) || c.has_input(11)) c.fail("attention_bias and head_sink are not supported");
  Tensor q = c.input(0), k, v;
  if (q.dim() != 3) c.fail("query must be (B, S, hidden), got ", shape_str(q.shape()));
  if (c.has_input(1)) {
    k = c.input(1), v = c.input(2);
  } else {  // packed: (B, S, (N + 2 KV) * D)
    const int64_t d = q.size(2) / (heads + 2 * kv_heads);
    k = narrow(q, 2, heads * d, kv_heads * d), v = narrow(q, 2, (heads + kv_heads) * d, kv_heads * d);
    q = narrow(q, 2, 0, heads * d);
  }
  q = split_heads(q, heads), k = split_heads(k, kv_heads), v = split_heads(v, kv_heads);
  const int64_t b = q.size(0), s = q.size(2);
  const std::vector<int64_t> lengths = cast(c.input(5), kInt64).to_vector<int64_t>();
  if (static_cast<int64_t>(lengths.size()) != b)
    c.fail("seqlens_k must hold one length per sequence, got ", lengths.size());
  Tensor bias;
  if (c.has_input(3)) {
    const int64_t past = c.input(3).size(2);
    for (int64_t len : lengths)
      if (len + 1 != past + s)
        c.fail("sequences of ragged lengths with a past are not supported (", len + 1, " != ", past, " + ", s, ")");
    k = concat({c.input(3), k}, 2), v = concat({c.input(4), v}, 2);
  } else {
    std::vector<float> m(static_cast<size_t>(b * s), 0.0f);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = lengths[static_cast<size_t>(i)] + 1; j < s; ++j) m[static_cast<size_t>(i * s + j)] = -INFINITY;
    bias = reshape(tensor(m, {b, s}, q.device()), {b, 1, 1, s});
  }
  const Tensor y = attend(q, repeat_kv(k, heads / kv_heads), repeat_kv(v, heads / kv_heads), scale_of(c, q.size(3)),
                          bias, true, -INFINITY);
  return {merge_heads(y), k, v};
}

}  // namespace

void register_contrib_attention_ops(OpRegistry& r) {
  r.add(contrib_op("MultiHeadAttention", {"num_heads", "mask_filter_value", "scale", "unidirectional"},
                   multi_head_attention));
  r.add(contrib_op("Attention",
                   {"num_heads", "qkv_hidden_sizes", "scale", "unidirectional", "mask_filter_value", "do_rotary",
                    "past_present_share_buffer", "rotary_embedding_dim"},
                   attention));
  r.add(contrib_op("GroupQueryAttention",
                   {"num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "do_rotary",
                    "rotary_interleaved", "smooth_softmax", "qk_output"},
                   group_query_attention));
  r.add(contrib_op(
      "QAttention",
      {"num_heads", "unidirectional", "do_rotary", "past_present_share_buffer", "scale", "mask_filter_value"},
      qattention, true));
}

}  // namespace braid::onnx::ops
