// onnxruntime's com.microsoft operators (its docs/ContribOperators.md) that its own tools write into
// shipped models: the transformer optimizer's fused activations, matrix products and
// normalisations, the quantizers' products, QLinear element-wise ops, LSTM and embeddings. Each is
// the composite of braid ops that its documented semantics spell out (or the standard op it
// extends, run as that op), so it trains under autograd wherever the standard ops it replaces do;
// the integer ones are inference-only, as MatMulInteger is. Checked op by op against onnxruntime
// (bindings/python/tests/test_onnx_contrib.py); the attention ops are in ops_contrib_attention.cpp.
#include <cmath>
#include <numeric>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

/// The standard op `type` run on this node (its inputs and attributes), as the contrib op that
/// extends it is defined.
Tensors as_standard(OpContext& c, const char* type) {
  const OpSchema* s = OpRegistry::global().find("", type);
  if (s == nullptr) c.fail("the standard op ", type, " is not registered");
  return s->run(c);
}

/// FusedConv's and FusedGemm's activation, by ONNX op name, with its parameters.
Tensor activation(OpContext& c, const Tensor& y, const std::string& name, const std::vector<double>& params) {
  auto param = [&](size_t i, double fallback) { return i < params.size() ? params[i] : fallback; };
  if (name.empty() || name == "Identity") return y;
  if (name == "Relu") return relu(y);
  if (name == "Tanh") return tanh(y);
  if (name == "Sigmoid") return sigmoid(y);
  if (name == "LeakyRelu") return leaky_relu(y, param(0, 0.01));
  if (name == "HardSigmoid") return hardsigmoid(y, param(0, 0.2), param(1, 0.5));
  if (name == "Clip") return clamp(y, param(0, -INFINITY), param(1, INFINITY));
  if (name == "Elu") return elu(y, param(0, 1.0));
  c.fail("activation '", name, "' is not one braid runs (Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid, Clip, Elu)");
}

Tensor input_or_none(const OpContext& c, size_t i) { return c.has_input(i) ? c.input(i) : Tensor(); }

// ---- activations ----

Tensors fast_gelu(OpContext& c) {  // the tanh approximation of x + bias
  const Tensor x = c.has_input(1) ? c.input(0) + c.input(1) : c.input(0);
  return {gelu(x, "tanh")};
}

Tensors quick_gelu(OpContext& c) {  // x * sigmoid(alpha x)
  const Tensor& x = c.input(0);
  return {x * sigmoid(x * c.attr_float("alpha", 1.702))};
}

// ---- products ----

Tensors fused_matmul(OpContext& c) {  // alpha * op(A) @ op(B)
  if (c.attr_int("transBatchA", 0) != 0 || c.attr_int("transBatchB", 0) != 0)
    c.fail("transBatchA and transBatchB are not supported (braid runs FusedMatMul with them 0)");
  Tensor a = c.input(0), b = c.input(1);
  if (c.attr_int("transA", 0) != 0) a = a.dim() < 2 ? a : a.mT();
  if (c.attr_int("transB", 0) != 0) b = b.dim() < 2 ? b : b.mT();
  const double alpha = c.attr_float("alpha", 1.0);
  Tensor y = matmul(a, b);
  return {alpha == 1.0 ? y : y * alpha};
}

/// (A - a_zero) @ (B - b_zero) * a_scale * b_scale (+ bias): zero points and B's scale per
/// tensor or per column of B, the integer product exact (summed in float64), then float32.
Tensor integer_product_to_float(OpContext& c, const Tensor& a, const Tensor& a_scale, const Tensor& a_zero,
                                const Tensor& b, const Tensor& b_scale, const Tensor& b_zero, const Tensor& bias) {
  if (a_zero.defined() && a_zero.numel() != 1) c.fail("a_zero_point must be one value, got ", a_zero.numel());
  if (a_scale.numel() != 1) c.fail("a_scale must be one value, got ", a_scale.numel());
  const Tensor acc = cast(integer_matmul(c, a, a_zero, b, b_zero.defined() ? reshape(b_zero, {-1}) : b_zero), kFloat32);
  Tensor y = acc * (cast(reshape(a_scale, {}), kFloat32) * cast(b_scale, kFloat32));
  return bias.defined() ? y + bias : y;
}

/// QGemm: alpha * (A - a_zero)(B - b_zero) (+ C, int32 at scale a_scale * b_scale, in the exact
/// product) times a_scale * b_scale, op(A), op(B) transposed by transA / transB; B's scale and
/// zero point per tensor or per column; quantised with y_scale / y_zero_point when given.
Tensors qgemm(OpContext& c) {
  Tensor a = c.input(0), b = c.input(3);
  if (c.attr_int("transA", 0) != 0) a = a.mT();
  if (c.attr_int("transB", 0) != 0) b = b.mT();
  const Tensor bz = input_or_none(c, 5);
  Tensor acc = cast(integer_matmul(c, a, input_or_none(c, 2), b, bz.defined() ? reshape(bz, {-1}) : bz), kInt64);
  if (c.has_input(6)) acc = acc + cast(c.input(6), kInt64);
  const Tensor scale = cast(reshape(c.input(1), {}), kFloat32) * cast(reshape(c.input(4), {-1}), kFloat32);
  Tensor y = cast(acc, kFloat32) * (scale * static_cast<float>(c.attr_float("alpha", 1.0)));
  if (!c.has_input(7)) return {y};
  const int64_t zero = c.has_input(8) ? static_cast<int64_t>(c.input_scalar(8)) : 0;
  return {quantize(y, c.input_scalar(7), zero, c.has_input(8) ? c.input(8).dtype() : kUInt8)};
}

Tensors matmul_integer_to_float(OpContext& c) {
  return {integer_product_to_float(c, c.input(0), c.input(2), input_or_none(c, 4), c.input(1), c.input(3),
                                   input_or_none(c, 5), input_or_none(c, 6))};
}

Tensors dynamic_quantize_matmul(OpContext& c) {  // A quantised to uint8 on the fly, as DynamicQuantizeLinear
  const Tensor& a = c.input(0);
  if (a.dtype() != kFloat32) c.fail("A must be float32, got ", dtype_name(a.dtype()));
  const DynamicQuantized q = dynamic_quantize(a);
  const Tensor a_scale = full({}, q.scale, kFloat32, a.device());
  const Tensor a_zero = cast(full({}, static_cast<double>(q.zero_point), kInt32, a.device()), kUInt8);
  return {integer_product_to_float(c, q.values, a_scale, a_zero, c.input(1), c.input(2), input_or_none(c, 3),
                                   input_or_none(c, 4))};
}

/// MatMulNBits' weight (N, K) in A's dtype: B (N, k_blocks, block_size * bits / 8) holds `bits`-bit
/// values, the first of each byte in its low bits; w[n, k] = (value - zero[n, block]) *
/// scale[n, block], the zero point 2^(bits - 1) when absent, else packed like B (uint8) or one
/// float per block.
Tensor nbits_weight(OpContext& c) {
  const int64_t bits = c.attr_int("bits", 4), block = c.attr_int("block_size", 0), k = c.attr_int("K", 0),
                n = c.attr_int("N", 0);
  if (bits != 4 && bits != 8) c.fail("bits ", bits, " is not supported (4 or 8)");
  if (block < 16 || (block & (block - 1)) != 0) c.fail("block_size ", block, " must be a power of 2, at least 16");
  const int64_t blocks = (k + block - 1) / block, per_byte = 8 / bits, levels = int64_t{1} << bits;
  const Tensor& b = c.input(1);
  if (b.dtype() != kUInt8 || b.numel() != n * blocks * block / per_byte)
    c.fail("B must be uint8 holding N ", n, " x ", blocks, " blocks of ", block, " ", bits, "-bit values, got ",
           dtype_name(b.dtype()), " ", shape_str(b.shape()));
  if (c.has_input(4) && c.input(4).numel() > 0) c.fail("g_idx is not supported");
  // Unpacked in float32, where every value and zero point is exact.
  auto unpack = [&](const Tensor& packed, int64_t count) {
    Tensor v = reshape(cast(packed, kFloat32), {n, -1, 1});
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < per_byte; ++i) {
      const Tensor shifted = i == 0 ? v : floor(v / static_cast<double>(int64_t{1} << (bits * i)));
      parts.push_back(shifted - floor(shifted / static_cast<double>(levels)) * static_cast<double>(levels));
    }
    return narrow(reshape(concat(parts, 2), {n, -1}), 1, 0, count);
  };
  Tensor w = reshape(unpack(b, blocks * block), {n, blocks, block});
  Tensor zero = full({}, static_cast<double>(levels / 2), kFloat32, b.device());
  if (c.has_input(3)) {
    const Tensor& z = c.input(3);
    zero = z.dtype() == kUInt8 ? unpack(z, blocks) : reshape(cast(z, kFloat32), {n, blocks});
    zero = reshape(zero, {n, blocks, 1});
  }
  const Tensor scale = reshape(cast(c.input(2), kFloat32), {n, blocks, 1});
  w = narrow(reshape((w - zero) * scale, {n, blocks * block}), 1, 0, k);
  return cast(w, c.input(0).dtype());
}

/// The unpacked weight, transposed to (K, N) and contiguous, kept with B's memory (Note [Storage
/// versions]) while B, its scales and zero points are unchanged, as the quantised weights of a
/// model are (unpacking it at every run dominated the model's time: benchmarks/README.md, issue 45).
Tensor nbits_weight_kept(OpContext& c) {
  const Tensor &b = c.input(1), &scales = c.input(2);
  if (scales.requires_grad()) return nbits_weight(c).mT();  // a trained scale: recompute under autograd
  auto tag = [](const Tensor& t) {
    return t.defined()
               ? detail::cat(static_cast<const void*>(t.storage().get()), "@", t.storage()->version(), ":", t.offset())
               : std::string("-");
  };
  const std::string key =
      detail::cat("MatMulNBits ", c.attr_int("K", 0), "x", c.attr_int("N", 0), " ", c.attr_int("bits", 4), "/",
                  c.attr_int("block_size", 0), " ", dtype_name(c.input(0).dtype()), " ", tag(b), " ", tag(scales), " ",
                  tag(input_or_none(c, 3)), " ", c.input(0).device().str());
  if (auto kept = std::static_pointer_cast<Tensor>(b.storage()->derived(key))) return *kept;
  const Tensor w = nbits_weight(c).mT().contiguous();
  b.storage()->set_derived(key, std::make_shared<Tensor>(w));
  return w;
}

Tensors matmul_nbits(OpContext& c) {  // A (..., K) @ w^T (+ bias)
  Tensor y = matmul(c.input(0), nbits_weight_kept(c));
  if (c.has_input(5)) y = y + c.input(5);
  return {y};
}

// ---- BERT's embeddings ----

/// EmbedLayerNormalization: LayerNorm(word[input_ids] + position[position_ids, default 0..S-1] +
/// segment[segment_ids]) * gamma + beta; mask_index, the count of ones in each row of mask (0 without
/// one); embedding_sum, the sum before the normalisation.
/// The tables and the normalisation's weights of EmbedLayerNormalization, float32.
struct Embeddings {
  Tensor word, position, segment, gamma, beta;
};

Tensors embed_and_normalize(OpContext& c, const Embeddings& e, size_t mask_input, size_t positions_input) {
  const Tensor ids = cast(c.input(0), kInt64);
  if (ids.dim() != 2) c.fail("input_ids must be (batch, sequence), got ", shape_str(ids.shape()));
  const int64_t b = ids.size(0), s = ids.size(1), h = e.word.size(1);
  auto rows = [&](const Tensor& table, const Tensor& index) {
    return reshape(index_select(table, 0, reshape(index, {-1})), {index.size(0), index.size(1), h});
  };
  Tensor positions;
  if (positions_input != 0 && c.has_input(positions_input)) {
    positions = cast(c.input(positions_input), kInt64);
  } else {
    std::vector<int64_t> v(static_cast<size_t>(s));
    std::iota(v.begin(), v.end(), int64_t{0});
    positions = tensor(v, {1, s}, ids.device());
  }
  Tensor total = rows(e.word, ids) + rows(e.position, positions);
  if (c.has_input(1) && e.segment.defined()) total = total + rows(e.segment, cast(c.input(1), kInt64));
  const Tensor y = layer_norm(total, 1, e.gamma, e.beta, c.attr_float("epsilon", 1e-12));
  const Tensor mask_index = c.has_input(mask_input) ? cast(sum(cast(c.input(mask_input), kInt64), {1}), kInt32)
                                                    : zeros({b}, kInt32, ids.device());
  return {y, mask_index, total};
}

/// EmbedLayerNormalization: LayerNorm(word[input_ids] + position[position_ids, default 0..S-1] +
/// segment[segment_ids]) * gamma + beta; mask_index, the count of ones in each row of mask (0 without
/// one); embedding_sum, the sum before the normalisation.
Tensors embed_layer_norm(OpContext& c) {
  return embed_and_normalize(c, {c.input(2), c.input(3), input_or_none(c, 4), c.input(5), input_or_none(c, 6)}, 7, 8);
}

/// QEmbedLayerNormalization (what quantize_dynamic makes of EmbedLayerNormalization): its tables,
/// gamma and beta uint8 with a scale (inputs 8-12) and a zero point (13-17) each, dequantised first.
Tensors qembed_layer_norm(OpContext& c) {
  auto table = [&](size_t i) -> Tensor {
    if (!c.has_input(i)) return Tensor();
    const int64_t zero = c.has_input(i + 11) ? static_cast<int64_t>(c.input_scalar(i + 11)) : 0;
    const double scale = c.input_scalar(i + 6);
    // Kept with the table's memory while it is unchanged (Note [Storage versions]): the word
    // embeddings are most of the model's bytes (benchmarks/README.md, issue 45).
    const Tensor& q = c.input(i);
    const std::string key = detail::cat("QEmbedLayerNormalization ", scale, " ", zero, " ", q.offset(), " ",
                                        shape_str(q.shape()), " ", q.device().str());
    if (auto kept = std::static_pointer_cast<Tensor>(q.storage()->derived(key))) return *kept;
    const Tensor t = dequantize(q, scale, zero);
    q.storage()->set_derived(key, std::make_shared<Tensor>(t));
    return t;
  };
  return embed_and_normalize(c, {table(2), table(3), table(4), table(5), table(6)}, 7, 0);
}

// ---- rotary position embedding ----

/// RotaryEmbedding: input (B, S, N * D) or (B, N, S, D); the first rotary_embedding_dim (default
/// D) features of each head rotated by the angles of cos_cache / sin_cache (max positions, dim / 2)
/// at position_ids (B, S), or at offset + 0..S-1 when position_ids holds one value; pairs are the
/// two halves of those features, or neighbours when interleaved; then the rest unchanged.
Tensors rotary_embedding(OpContext& c) {
  const Tensor& x = c.input(0);
  const Tensor &cos_cache = c.input(2), &sin_cache = c.input(3);
  if (c.attr_int("is_packed_batching", 0) != 0) c.fail("is_packed_batching is not supported");
  if (c.attr_float("scale", 1.0) != 1.0) c.fail("scale ", c.attr_float("scale", 1.0), " is not supported (1)");
  if (x.dim() != 3 && x.dim() != 4) c.fail("input must be (B, S, N * D) or (B, N, S, D), got ", shape_str(x.shape()));
  const bool bsnd = x.dim() == 3;
  const int64_t b = x.size(0), s = bsnd ? x.size(1) : x.size(2);
  int64_t heads = bsnd ? c.attr_int("num_heads", 0) : x.size(1);
  if (bsnd && heads == 0) heads = x.size(2) / (2 * cos_cache.size(1));  // the rotary part is the whole head
  if (heads <= 0 || (bsnd && x.size(2) % heads != 0)) c.fail("num_heads ", heads, " does not divide ", x.size(2));
  const int64_t d = bsnd ? x.size(2) / heads : x.size(3);
  const int64_t rot = c.attr_int("rotary_embedding_dim", 0) > 0 ? c.attr_int("rotary_embedding_dim", 0) : d;
  if (rot > d || rot % 2 != 0 || cos_cache.size(1) * 2 != rot)
    c.fail("rotary_embedding_dim ", rot, " does not fit head size ", d, " and a cos_cache of ",
           shape_str(cos_cache.shape()));
  Tensor pos = cast(c.input(1), kInt64);
  if (pos.numel() == 1) {  // an offset: positions offset + 0..S-1 for every sequence
    std::vector<int64_t> v(static_cast<size_t>(s));
    std::iota(v.begin(), v.end(), static_cast<int64_t>(pos.item()));
    pos = tensor(v, {1, s}, x.device());
  }
  // (B or 1, S, rot / 2), then placed against (B, S, N, D) or (B, N, S, D).
  const Shape angle_shape = bsnd ? Shape{pos.size(0), s, 1, rot / 2} : Shape{pos.size(0), 1, s, rot / 2};
  const Tensor flat = reshape(pos, {-1});
  const Tensor cs = reshape(index_select(cos_cache, 0, flat), angle_shape);
  const Tensor sn = reshape(index_select(sin_cache, 0, flat), angle_shape);
  const Tensor heads_x = bsnd ? reshape(x, {b, s, heads, d}) : x;
  const Tensor part = narrow(heads_x, 3, 0, rot);
  Tensor rotated;
  if (c.attr_int("interleaved", 0) != 0) {
    const Tensor pairs = reshape(part, {heads_x.size(0), heads_x.size(1), heads_x.size(2), rot / 2, 2});
    const Tensor e = squeeze(narrow(pairs, 4, 0, 1), 4), o = squeeze(narrow(pairs, 4, 1, 1), 4);
    rotated = reshape(stack({e * cs - o * sn, o * cs + e * sn}, 4), part.shape());
  } else {
    const Tensor x1 = narrow(part, 3, 0, rot / 2), x2 = narrow(part, 3, rot / 2, rot / 2);
    rotated = concat({x1 * cs - x2 * sn, x2 * cs + x1 * sn}, 3);
  }
  Tensor y = rot == d ? rotated : concat({rotated, narrow(heads_x, 3, rot, d - rot)}, 3);
  return {bsnd ? reshape(y, x.shape()) : y};
}

// ---- the dynamic quantizer's LSTM ----

/// DynamicQuantizeLSTM: ONNX's LSTM with int8/uint8 weights W (D, input, 4H) and R (D, H, 4H),
/// the transposes of LSTM's, each with a scale and zero point per direction or per direction and
/// column. braid dequantises the weights and runs the standard LSTM in float32; onnxruntime also
/// quantises the input and the hidden state to uint8 at every product, so the two agree to within
/// that quantisation's error, not bitwise (bindings/python/tests/test_onnx_contrib.py states it).
Tensors dynamic_quantize_lstm(OpContext& c) {
  auto weight = [&](size_t w, size_t scale, size_t zero) {
    const Tensor& q = c.input(w);
    if (q.dim() != 3) c.fail("input ", w, " must be (directions, rows, 4 * hidden), got ", shape_str(q.shape()));
    const Shape per_column{q.size(0), 1, q.size(2)}, per_direction{q.size(0), 1, 1};
    auto shaped = [&](const Tensor& t) {
      return reshape(cast(t, kFloat32), t.numel() == q.size(0) ? per_direction : per_column);
    };
    Tensor f = cast(q, kFloat32);
    if (c.has_input(zero)) f = f - shaped(c.input(zero));
    return (f * shaped(c.input(scale))).mT();  // (D, 4H, rows), as LSTM takes it
  };
  std::vector<Tensor> inputs{c.input(0), weight(1, 8, 9), weight(2, 10, 11)};
  for (size_t i = 3; i < 8; ++i) inputs.push_back(c.has_input(i) ? c.input(i) : Tensor());
  OpContext lstm(c.node(), c.opset(), c.training(), inputs, nullptr);
  return as_standard(lstm, "LSTM");
}

// ---- normalisations ----

/// x / sqrt(mean(x^2 over the axes from `axis`) + eps) * scale: RMS normalisation.
std::pair<Tensor, Tensor> rms_norm(OpContext& c, const Tensor& x, const Tensor& scale, int64_t axis) {
  std::vector<int64_t> axes;
  for (int64_t d = norm_axis(c, axis, x.dim()); d < x.dim(); ++d) axes.push_back(d);
  const Tensor inv = rsqrt(mean(square(x), axes, true) + c.attr_float("epsilon", 1e-5));
  return {x * inv * scale, inv};
}

/// The sum that the Skip forms normalise: input + skip (+ bias), and output 3 when asked for.
Tensor skip_sum(OpContext& c, size_t bias_input) {
  Tensor s = c.input(0) + c.input(1);
  return c.has_input(bias_input) ? s + c.input(bias_input) : s;
}

Tensors skip_layer_norm(OpContext& c) {  // input, skip, gamma, beta?, bias?
  const Tensor s = skip_sum(c, 4);
  std::vector<Tensor> r = layer_norm_with_stats(s, 1, c.input(2), input_or_none(c, 3), c.attr_float("epsilon", 1e-12));
  return {r[0], r[1], r[2], s};
}

Tensors skip_simplified_layer_norm(OpContext& c) {  // input, skip, gamma, bias?
  const Tensor s = skip_sum(c, 3);
  auto [y, inv] = rms_norm(c, s, c.input(2), -1);
  return {y, Tensor(), inv, s};
}

Tensors simplified_layer_norm(OpContext& c) {  // X, scale; outputs Y, inv_std_var
  auto [y, inv] = rms_norm(c, c.input(0), c.input(1), c.attr_int("axis", -1));
  return {y, inv};
}

// ---- the QLinear element-wise family: dequantise, the float op, quantise ----

/// Input i (int8 or uint8) in float32 with the scale of input i + 1 and the zero point of input
/// i + 2 (optional, 0), each one value.
Tensor dequantized(OpContext& c, size_t i) {
  const Tensor& q = c.input(i);
  if (q.dtype() != kInt8 && q.dtype() != kUInt8)
    c.fail("input ", i, " must be int8 or uint8, got ", dtype_name(q.dtype()));
  const int64_t zero = c.has_input(i + 2) ? static_cast<int64_t>(c.input_scalar(i + 2)) : 0;
  return dequantize(q, c.input_scalar(i + 1), zero);
}

/// y quantised with the scale of input i and the zero point of input i + 1 (optional, 0), to the
/// dtype of the op's first quantised input, as onnxruntime's QLinear ops write it.
Tensor requantized(OpContext& c, const Tensor& y, size_t i, DType dtype) {
  const int64_t zero = c.has_input(i + 1) ? static_cast<int64_t>(c.input_scalar(i + 1)) : 0;
  return quantize(y, c.input_scalar(i), zero, dtype);
}

Tensors qlinear_binary(OpContext& c, bool mul) {  // A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp
  const Tensor a = dequantized(c, 0), b = dequantized(c, 3);
  return {requantized(c, mul ? a * b : a + b, 6, c.input(0).dtype())};
}

Tensors qlinear_unary(OpContext& c, const std::function<Tensor(const Tensor&)>& f) {  // X, scale, zp, Y_scale, Y_zp
  return {requantized(c, f(dequantized(c, 0)), 3, c.input(0).dtype())};
}

Tensors qlinear_concat(OpContext& c) {  // Y_scale, Y_zp, then (X, X_scale, X_zp) per input
  if (c.num_inputs() < 5 || (c.num_inputs() - 2) % 3 != 0)
    c.fail("expects Y_scale, Y_zero_point and (X, X_scale, X_zero_point) per input, got ", c.num_inputs(), " inputs");
  std::vector<Tensor> xs;
  for (size_t i = 2; i < c.num_inputs(); i += 3) xs.push_back(dequantized(c, i));
  const int64_t axis = norm_axis(c, c.attr_int("axis", 0), xs[0].dim());
  return {requantized(c, concat(xs, axis), 0, c.input(2).dtype())};
}

Tensors qlinear_global_average_pool(OpContext& c) {  // X, x_scale, x_zp, y_scale, y_zp
  const Tensor x = dequantized(c, 0);
  if (x.dim() < 3) c.fail("X must have a batch, a channel and spatial axes, got rank ", x.dim());
  std::vector<int64_t> axes;
  const bool channels_last = c.attr_int("channels_last", 0) != 0;
  for (int64_t d = channels_last ? 1 : 2; d < x.dim() - (channels_last ? 1 : 0); ++d) axes.push_back(d);
  return {requantized(c, mean(x, axes, true), 3, c.input(0).dtype())};
}

}  // namespace

void register_contrib_ops(OpRegistry& r) {
  r.add(contrib_op("Gelu", {}, [](OpContext& c) { return Tensors{gelu(c.input(0), "none")}; }));
  r.add(contrib_op("BiasGelu", {}, [](OpContext& c) { return Tensors{gelu(c.input(0) + c.input(1), "none")}; }));
  r.add(contrib_op("FastGelu", {}, fast_gelu));
  r.add(contrib_op("QuickGelu", {"alpha"}, quick_gelu));
  r.add(contrib_op("BiasAdd", {}, [](OpContext& c) { return Tensors{c.input(0) + c.input(1) + c.input(2)}; }));
  r.add(contrib_op("FusedMatMul", {"alpha", "transA", "transB", "transBatchA", "transBatchB"}, fused_matmul));
  r.add(contrib_op(
      "FusedGemm",
      {"alpha", "beta", "transA", "transB", "activation", "activation_alpha", "activation_beta", "activation_gamma"},
      [](OpContext& c) {
        std::vector<double> p{c.attr_float("activation_alpha", 0.01), c.attr_float("activation_beta", 0.5)};
        if (c.attr_string("activation", "") == "HardSigmoid") p[0] = c.attr_float("activation_alpha", 0.2);
        return Tensors{activation(c, as_standard(c, "Gemm")[0], c.attr_string("activation", ""), p)};
      }));
  r.add(contrib_op(
      "FusedConv",
      {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", "activation", "activation_params"},
      [](OpContext& c) {
        Tensor y = as_standard(c, "Conv")[0];
        if (c.has_input(3)) y = y + c.input(3);  // Z, added before the activation
        return Tensors{activation(c, y, c.attr_string("activation", ""), c.attr_floats("activation_params"))};
      }));
  r.add(contrib_op("SkipLayerNormalization", {"epsilon"}, skip_layer_norm));
  r.add(contrib_op("SkipSimplifiedLayerNormalization", {"epsilon"}, skip_simplified_layer_norm));
  r.add(contrib_op("SimplifiedLayerNormalization", {"axis", "epsilon", "stash_type"}, simplified_layer_norm));
  // onnxruntime registers SimplifiedLayerNormalization in the ONNX domain too, where its optimizer
  // writes it.
  r.add(op("SimplifiedLayerNormalization", {"axis", "epsilon", "stash_type"}, simplified_layer_norm));
  r.add(contrib_op("MatMulIntegerToFloat", {}, matmul_integer_to_float, true));
  r.add(contrib_op("DynamicQuantizeMatMul", {}, dynamic_quantize_matmul, true));
  r.add(contrib_op("EmbedLayerNormalization", {"epsilon", "mask_index_type"}, embed_layer_norm));
  r.add(contrib_op("QEmbedLayerNormalization", {"epsilon"}, qembed_layer_norm, true));
  r.add(contrib_op("RotaryEmbedding",
                   {"interleaved", "is_packed_batching", "num_heads", "rotary_embedding_dim", "scale"},
                   rotary_embedding));
  r.add(contrib_op(
      "DynamicQuantizeLSTM",
      {"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "input_forget"},
      dynamic_quantize_lstm, true));
  r.add(contrib_op("QGemm", {"alpha", "transA", "transB"}, qgemm, true));
  r.add(contrib_op("MatMulNBits", {"K", "N", "bits", "block_size", "accuracy_level"}, matmul_nbits, true));
  // com.microsoft's QuantizeLinear and DequantizeLinear are the standard ones of opset 10-13.
  r.add(contrib_op(
      "QuantizeLinear", {"axis"}, [](OpContext& c) { return as_standard(c, "QuantizeLinear"); }, true));
  r.add(contrib_op(
      "DequantizeLinear", {"axis"}, [](OpContext& c) { return as_standard(c, "DequantizeLinear"); }, true));
  r.add(contrib_op(
      "QLinearAdd", {}, [](OpContext& c) { return qlinear_binary(c, false); }, true));
  r.add(contrib_op(
      "QLinearMul", {}, [](OpContext& c) { return qlinear_binary(c, true); }, true));
  r.add(contrib_op(
      "QLinearSigmoid", {}, [](OpContext& c) { return qlinear_unary(c, [](const Tensor& x) { return sigmoid(x); }); },
      true));
  r.add(contrib_op(
      "QLinearLeakyRelu", {"alpha"},
      [](OpContext& c) {
        const double alpha = c.attr_float("alpha", 0.01);
        return qlinear_unary(c, [alpha](const Tensor& x) { return leaky_relu(x, alpha); });
      },
      true));
  r.add(contrib_op("QLinearConcat", {"axis"}, qlinear_concat, true));
  r.add(contrib_op("QLinearGlobalAveragePool", {"channels_last"}, qlinear_global_average_pool, true));
}

}  // namespace braid::onnx::ops
