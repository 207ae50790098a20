// The public tensor operations. Every op validates its arguments at the front door (throwing an
// Error that names the op and the operands), dispatches to the device's backend primitives, and,
// when an input requires a gradient, records its backward formula for autograd.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "braid/random.h"
#include "braid/tensor.h"

namespace braid {

// Note [Implicit devices]
// A creation function called without a device puts the tensor on default_device(), as PyTorch's
// factory functions do. Inside braid itself that default would hide bugs: a constant that an op
// or a backward formula makes without naming its operand's device would land wherever the user's
// default points, right in a test whose default is the test device and wrong on a GPU. So braid's
// own sources (built with BRAID_BUILDING_LIBRARY) see the CPU as the implicit device: a constant
// made without the operand's device is a CPU tensor, which the shadow-device runs of the test suite
// reject as a device mix. Code that means the user's default (a layer's parameters) names
// default_device() explicitly.
#if defined(BRAID_BUILDING_LIBRARY)
#define BRAID_IMPLICIT_DEVICE ::braid::Device::cpu()
#else
#define BRAID_IMPLICIT_DEVICE ::braid::default_device()
#endif

// ---- creation ----
Tensor empty(const Shape& shape, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
Tensor zeros(const Shape& shape, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
Tensor ones(const Shape& shape, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
Tensor full(const Shape& shape, double value, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
/// Same shape and device as t, with t's dtype unless dtype is given (torch.zeros_like(t, dtype=...)).
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor ones_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor full_like(const Tensor& t, double value, std::optional<DType> dtype = std::nullopt);
/// A 0-d tensor holding value.
Tensor scalar_tensor(double value, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
/// A 0-d tensor holding value with t's dtype and device (tinygrad's const_like): the constant that
/// ops and backward formulas combine with t.
Tensor scalar_like(const Tensor& t, double value);
/// Values start, start+step, ... below end (above end for a negative step).
Tensor arange(double start, double end, double step = 1.0, DType dtype = kFloat32,
              Device device = BRAID_IMPLICIT_DEVICE);
Tensor arange(int64_t end, DType dtype = kInt64, Device device = BRAID_IMPLICIT_DEVICE);
/// steps values evenly spaced from start to end inclusive.
Tensor linspace(double start, double end, int64_t steps, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
Tensor eye(int64_t n, DType dtype = kFloat32, Device device = BRAID_IMPLICIT_DEVICE);
/// Copies count = numel(shape) elements of dtype from host memory at data onto device.
Tensor from_buffer(const void* data, const Shape& shape, DType dtype, Device device = BRAID_IMPLICIT_DEVICE);
/// Wraps host memory without copying (a CPU tensor); the caller keeps it alive while any view of
/// the tensor lives.
Tensor from_blob(void* data, const Shape& shape, DType dtype);
/// An uninitialised CPU tensor in page-locked host memory for transfers to and from device
/// (torch.empty(..., pin_memory=True)): a GPU's copy engine reads and writes it directly. Ordinary
/// host memory where device has none (the CPU, or when the system has no more to lock).
Tensor empty_pinned(const Shape& shape, DType dtype, Device device);
Tensor tensor(const std::vector<float>& values, const Shape& shape, Device device = BRAID_IMPLICIT_DEVICE);
Tensor tensor(const std::vector<double>& values, const Shape& shape, Device device = BRAID_IMPLICIT_DEVICE);
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape, Device device = BRAID_IMPLICIT_DEVICE);
Tensor tensor(const std::vector<int32_t>& values, const Shape& shape, Device device = BRAID_IMPLICIT_DEVICE);
Tensor tensor_bool(const std::vector<bool>& values, const Shape& shape, Device device = BRAID_IMPLICIT_DEVICE);
/// Uniform on [low, high). Draws are the same on every device for the same generator state.
Tensor rand(const Shape& shape, DType dtype = kFloat32, Generator* gen = nullptr, double low = 0.0, double high = 1.0,
            Device device = BRAID_IMPLICIT_DEVICE);
/// Normal with the given mean and standard deviation.
Tensor randn(const Shape& shape, DType dtype = kFloat32, Generator* gen = nullptr, double mean = 0.0, double std = 1.0,
             Device device = BRAID_IMPLICIT_DEVICE);
/// rand and randn with t's shape, dtype and device.
Tensor rand_like(const Tensor& t, Generator* generator = nullptr);
Tensor randn_like(const Tensor& t, Generator* generator = nullptr);
/// 1 with probability p, else 0, in dtype.
Tensor bernoulli(const Shape& shape, double p, DType dtype = kFloat32, Generator* gen = nullptr,
                 Device device = BRAID_IMPLICIT_DEVICE);
/// Integers uniform on [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = kInt64, Generator* gen = nullptr,
               Device device = BRAID_IMPLICIT_DEVICE);
/// A random permutation of 0..n-1.
Tensor randperm(int64_t n, Generator* generator = nullptr, Device device = BRAID_IMPLICIT_DEVICE);

// ---- elementwise unary ----
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor silu(const Tensor& x);
/// clamp(alpha x + beta, 0, 1); the defaults are PyTorch's (relu6(x + 3) / 6), ONNX's alpha is 0.2.
Tensor hardsigmoid(const Tensor& x, double alpha = 1.0 / 6.0, double beta = 0.5);
/// x hardsigmoid(x), as MobileNetV3 uses it.
Tensor hardswish(const Tensor& x);
/// log(1 + exp(x)) for every x (PyTorch returns x itself above its threshold of 20).
Tensor softplus(const Tensor& x);
/// approximate: "none" (exact, with erf) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor erf(const Tensor& x);
/// Inverse trigonometric functions (asin, acos on [-1, 1]).
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
/// Either bound may be absent, not both (as in PyTorch). The bounds are scalar operands (Note [Type
/// promotion] in dtype.h): a fractional bound makes an integer tensor float32. min > max is an
/// error, where PyTorch sets every element to max: such bounds are almost always a mistake in the
/// caller, and no result is right.
Tensor clamp(const Tensor& x, std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
/// -1, 0 or 1; NaN stays NaN, as in NumPy (PyTorch 1.13 gives 0); bool stays bool.
Tensor sign(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);
Tensor logical_not(const Tensor& x);
Tensor isnan(const Tensor& x);

// ---- elementwise binary, NumPy broadcasting ----
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
/// cond ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// The shape a and b broadcast to; throws ValueError naming op when they do not.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

// ---- reductions over the axes in dim (empty = all axes; negative axes count from the end) ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
Tensor prod(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
/// The minimum and the maximum of all of x, as 0-d tensors (amin(x) and amax(x), NaN when x holds
/// one), in one pass where the backend has it; recorded as amin and amax when x requires a gradient.
std::pair<Tensor, Tensor> aminmax(const Tensor& x);
/// The index of the largest (smallest) element along dim, the first one on ties; without
/// dim, the index into x flattened (kept axes all of size 1 with keepdim). int64.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
/// Whether any (all) element is nonzero, over dim (empty: every axis), as a bool tensor. Over no
/// elements any is false and all is true.
Tensor any(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
Tensor all(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
/// correction 1 is the unbiased (Bessel) estimate, 0 the population variance.
Tensor var(const Tensor& x, const std::vector<int64_t>& dim = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, const std::vector<int64_t>& dim = {}, int64_t correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dim = {}, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
/// Sums x over broadcast axes so that it has shape (the reverse of expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- normalisation ----
/// Batch normalisation with the batch's own statistics, as PyTorch's F.batch_norm(training=True):
/// over every axis of x (N, C, *) but the channels, y = (x - mean) / sqrt(var + eps) * weight + bias,
/// weight and bias (C) optional. Returns {y, mean, var}: the batch's mean and biased variance (C),
/// without gradients, for the running statistics. One autograd node with a closed-form backward
/// (Note [BatchNorm as one node] in src/ops/norm.cpp).
std::vector<Tensor> batch_norm_training(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
/// x * scale[c] + shift[c] over x (N, C, *), scale and shift (C): inference BatchNorm's scale and
/// shift in one pass where the backend has it and nothing needs a gradient; composed otherwise.
Tensor channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift);
/// Layer normalisation over the last `normalized_dims` axes of x, as PyTorch's F.layer_norm:
/// y = (x - mean) / sqrt(var + eps) * weight + bias per row, var biased, weight and bias (the
/// normalised shape) optional. Where nothing needs a gradient, one pass per row through the backend
/// (Note [Fused kernels]); otherwise composed, so autograd differentiates it.
Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
/// layer_norm's y with its statistics, as ONNX's LayerNormalization gives them: {y, mean, inverse
/// standard deviation}, the statistics of x's shape with the normalised axes kept as size 1.
std::vector<Tensor> layer_norm_with_stats(const Tensor& x, int64_t normalized_dims, const Tensor& weight,
                                          const Tensor& bias, double eps);

// ---- linear algebra ----
/// 1-d, 2-d and batched (broadcast batch axes) matrix product, as numpy.matmul. Operands of
/// different dtypes are promoted as in add (PyTorch requires equal dtypes); bool is refused.
Tensor matmul(const Tensor& a, const Tensor& b);
/// Scaled dot-product attention, as PyTorch's F.scaled_dot_product_attention: softmax(q k^T * scale
/// + mask) v for query (..., L, E), key (..., S, E) and value (..., S, Ev) of one floating dtype,
/// batch axes broadcast, giving (..., L, Ev). attn_mask broadcasts to (..., L, S): bool keeps the
/// scores where true, floating-point is added to them; is_causal masks key j > query i (upper-left,
/// not with attn_mask); scale defaults to 1 / sqrt(E); dropout_p drops probabilities with gen's
/// stream, as dropout() does (pass 0 in evaluation). One autograd node (Note [Attention as one
/// node] in src/ops/attention.cpp), through the backend's fused kernels where it has them.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt, Generator* generator = nullptr);
/// The exact integer product (a - a_zero) @ (b - b_zero) as int32, for a and b of int8 or uint8
/// (each either; zero points in their operand's range), with matmul's 1-d and batch rules: the
/// products of quantised inference (ONNX's MatMulInteger). Through the backend's int8 GEMM where
/// it has one (oneDNN on the CPU), else summed exactly in float64. Not differentiable.
Tensor int_matmul(const Tensor& a, const Tensor& b, int64_t a_zero = 0, int64_t b_zero = 0);
/// Quantisation per tensor, as ONNX's QuantizeLinear: round_half_even(x / scale) + zero_point,
/// saturated to dtype (int8 or uint8); x / scale is computed in x's floating dtype, NaN gives 0.
/// One pass through the backend's kernel where it has one. Not differentiable.
Tensor quantize(const Tensor& x, double scale, int64_t zero_point, DType dtype);
/// ONNX's DynamicQuantizeLinear: x (float32) as uint8 values with the scale and zero point that its
/// range, widened to include 0, gives (scale = range / 255, zero = round(-min / scale)); the
/// reference's float32 arithmetic. One team through the backend's kernel where it has one.
struct DynamicQuantized {
  Tensor values;
  float scale = 1;
  int64_t zero_point = 0;
};
DynamicQuantized dynamic_quantize(const Tensor& x);
/// Its inverse per tensor, as ONNX's DequantizeLinear: (x - zero_point) * scale in float32, for x
/// int8, uint8 or int32. One pass through the backend's kernel where it has one.
Tensor dequantize(const Tensor& x, double scale, int64_t zero_point);
/// dequantize(quantize(x, scale, zero_point, dtype), scale, zero_point): x rounded to its grid
/// (fake quantisation, ONNX's QuantizeLinear followed by DequantizeLinear), in float32, in one pass
/// where the backend has it. Not differentiable.
Tensor fake_quantize(const Tensor& x, double scale, int64_t zero_point, DType dtype);

// ---- shape and indexing ----
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const std::vector<int64_t>& order);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, std::optional<int64_t> dim = std::nullopt);
Tensor unsqueeze(const Tensor& x, int64_t axis);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);
/// x on device (x itself when it is there already); the gradient is moved back to x's device.
Tensor to_device(const Tensor& x, Device device);
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Pieces of the given sizes along dim (they must add up to the axis' size).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
/// n pieces of equal size (the last may be smaller), as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
// In gather, index_select and scatter_add a negative index counts from the end of the axis, as in
// Python and NumPy (PyTorch refuses it); an index out of [-size, size) is an IndexError.
/// out[i][j] = x[index[i][j]][j] for axis 0 (torch.gather).
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index);
/// Rows of x along axis chosen by the 1-d index.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index);
/// A copy of x with src (of x's dtype) added at index along axis (torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
/// Pads with pairs (before, after) for the last axes, innermost pair first as torch.nn.functional.pad.
/// mode: "constant", "reflect" or "replicate", for any dtype and rank (PyTorch's reflect and
/// replicate take float tensors of rank 2 to 5). A negative constant pad crops; out[j] is
/// x[j - before] or value, for any non-negative result size (PyTorch crops before it pads, so it
/// refuses a crop larger than the axis even when the other side's pad makes up for it).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, const std::string& mode = "constant", double value = 0.0);
/// One-hot rows of num_classes for integer labels (num_classes -1: max label + 1).
Tensor one_hot(const Tensor& labels, int64_t num_classes = -1, DType dtype = kInt64);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---- comparison helpers for tests and users ----
/// |a - b| <= atol + rtol * |b| elementwise, for all elements.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
/// Bitwise equality of shape, dtype and values.
bool equal(const Tensor& a, const Tensor& b);

// ---- operators ----
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);

}  // namespace braid
