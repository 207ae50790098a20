// The primitive kernels a device backend implements: the one dispatch point between ops and
// devices. Ops validate and shape their operands before calling here, so a backend may assume
// valid input: matching shapes (broadcast operands come as stride-0 views), compute dtypes (except
// where a primitive says otherwise), and outputs that are freshly allocated or valid views.
// Everything else is composite code in src/ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "braid/tensor.h"

namespace braid {

/// One step of an elementwise chain. Slot 0 holds the chain's input; step i writes slot i + 1.
struct ChainStep {
  enum class Kind : uint8_t { FakeQuantize, ChannelAffine, Gelu, Add, Sub, Mul, Div, GeluHalfLast };
  Kind kind = Kind::Add;
  /// The slots read: `a` by every step; `b` by the arithmetic, whose operands are slot a and slot b,
  /// either of them kConstant for k or kTensor for `operand` (not both kConstant).
  static constexpr int kConstant = -1, kTensor = -2;
  int a = 0, b = kConstant;
  float k = 0;
  /// An arithmetic step's tensor operand: float32, on x's device, broadcasting to x's shape (a bias,
  /// a residual, a mask, a per-sample channel scale).
  Tensor operand;
  /// FakeQuantize: braid::fake_quantize(slot a, scale, zero, qtype).
  double scale = 1;
  int64_t zero = 0;
  DType qtype = kUInt8;
  /// Gelu: braid::gelu(slot a), the exact (erf) GELU; GeluHalfLast: detail::gelu_half_last(slot a).
  /// ChannelAffine: braid::channel_affine(slot a, channel_scale, channel_shift), each (C) float32.
  Tensor channel_scale, channel_shift;
};

}  // namespace braid

namespace braid::detail {

enum class UnaryOp {
  Neg,
  Abs,
  Exp,
  Log,
  Log1p,
  Expm1,
  Sqrt,
  Rsqrt,
  Square,
  Reciprocal,
  Sin,
  Cos,
  Tanh,
  Sigmoid,
  Relu,
  Erf,
  Sign,
  Floor,
  Ceil,
  Round,
  LogicalNot,
  IsNan,
  PowScalar,  // x ** p0
  Clamp,      // min(max(x, p0), p1); +-inf for an absent bound
  LeakyRelu,  // x > 0 ? x : p0 * x
  Elu,        // x > 0 ? x : p0 * (exp(x) - 1)
  Softplus,   // log(1 + exp(x)), stable
  GeluTanh,   // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  Gelu,
  GeluHalfLast,  // (x (1 + erf(x / sqrt 2))) 0.5: the order exporters write GELU in (Note [GELU as one op])       // x (0.5 (1 + erf(x / sqrt 2))), in that order (the composite's, bit for bit)
  Asin,
  Acos,
  Atan,
  HardSigmoid,  // min(max(p0 x + p1, 0), 1)
  HardSwish,    // x min(max(x / 6 + 1/2, 0), 1)
};

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Max, Min, Eq, Ne, Lt, Le, Gt, Ge, And, Or, Xor };

enum class ReduceOp { Sum, Prod, Max, Min, ArgMax, ArgMin };

enum class RandomKind { Uniform, Normal, Bernoulli };

/// A 2-d sliding window over (h, w) planes, as convolution and pooling use it: output position
/// (oy, ox) covers input rows oy * sh - ph + i * dh for i < kh, and columns likewise; positions
/// outside [0, h) x [0, w) are padding. The output size (oh, ow) is set by the op, which has
/// already checked that it is positive.
struct Window2d {
  int64_t h, w;    // input plane
  int64_t oh, ow;  // output plane
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

/// The taps [lo, hi) of a window starting at start (dilation, k taps) that fall in [0, size).
inline std::pair<int64_t, int64_t> window_taps(int64_t start, int64_t dilation, int64_t k, int64_t size) {
  const int64_t lo = start >= 0 ? 0 : std::min(k, (-start + dilation - 1) / dilation);
  const int64_t hi = start >= size ? 0 : std::min(k, (size - 1 - start) / dilation + 1);
  return {lo, std::max(lo, hi)};
}

/// An elementwise function applied to a kernel's result before it is written: a convolution's
/// residual and activation in inference (Backend::conv2d).
struct Epilogue {
  enum class Kind { None, Relu, Clip, HardSwish, HardSigmoid };
  Kind kind = Kind::None;
  double a = 0, b = 0;  // Clip: min and max; HardSigmoid: alpha and beta (min(max(a x + b, 0), 1))
  double scale = 1, shift = 0;  // then y * scale + shift (a learnable affine after the activation)
  // Added before the activation, when defined: a residual block's shortcut (y = act(conv + bias +
  // residual)). Backend::conv2d takes it of y's shape, dtype and layout, or declines; y may be
  // residual itself when residual_writable (its caller reads it no more and nothing shares it).
  Tensor residual{};
  bool residual_writable = false;
  bool any() const { return kind != Kind::None || scale != 1 || shift != 0 || residual.defined(); }
};

/// The numbers of one Adam step (Backend::adam_step), worked out by the optimizer.
struct AdamStep {
  double decay;       // the parameter's factor before the step: 1 - lr * weight_decay for AdamW, else 1
  double beta1, beta2;
  double step_size;   // lr / (1 - beta1^t)
  double sqrt_bias_correction2;  // sqrt(1 - beta2^t)
  double eps;
};

/// One parameter of a multi-tensor Adam step (FusedKernels::adam_steps): adam_step's operands.
struct AdamTensors {
  Tensor p, g, m, v, max_v;
};

/// One multi-tensor SGD step's numbers (FusedKernels::sgd_steps): torch.optim.SGD's options.
struct SgdStep {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
};

/// One parameter of sgd_steps: the parameter, its gradient and its momentum buffer (undefined
/// without momentum).
struct SgdTensors {
  Tensor p, g, buf;
};

/// A backend's event; each backend derives its own (the default's is a host timestamp).
struct BackendEvent {
  virtual ~BackendEvent() = default;
};

/// One step of matmul_epilogue and matmul_int8_epilogue: out = out (+ - * /) operand.
struct FusedKernelsEpilogueStep {
  ChainStep::Kind kind;  // Add, Sub, Mul or Div
  Tensor operand;        // float32, contiguous: 1, N (one per column) or M * N (row-major) elements,
  float k = 0;           // or undefined for this one value
};

// Note [Fused kernels]
// Every kernel that computes a whole composite in one pass (oneDNN's or cuDNN's convolutions, a
// chain of elementwise steps, an optimizer's update) is an entry of one table, FusedKernels, which
// a backend returns from Backend::fused(): the entries it overrides are the kernels it has. Each
// returns true when it computed the result and false when it has no kernel for the case (dtype,
// geometry, library absent). Each entry's definition is the composite that the op calling it
// writes from the required primitives of Backend, which every backend has: the op runs that
// composite wherever the entry declines, so a backend without the entry (the default table has
// none) computes the same values, and tests/test_fused_values.cpp holds each CPU entry to its
// composite on the special values. The op never asks which backend it is talking to, and the
// backward formulas stay the op's: these are building blocks that the formulas call. Where each
// composite lives: conv2d, conv2d_backward_input/weight and conv2d_prefers_channels_last in
// src/ops/conv.cpp (im2col + matmul, col2im); max_pool2d_channels_last in src/ops/pool.cpp;
// matmul_int8, quantize, dequantize, dynamic_quantize, fake_quantize in src/ops/quant.cpp;
// matmul_epilogue, matmul_int8_epilogue, elementwise_chain in src/ops/chain.cpp; linear_bias in
// src/ops/linalg.cpp; aminmax and
// softmax_rows in src/ops/reduce.cpp; layer_norm_rows and the channel_* passes in src/ops/norm.cpp;
// channel_gate in src/ops/gate.cpp; adam_step in src/optim/adam.cpp; sgd_steps in src/optim/sgd.cpp; attention_forward and
// attention_backward in src/ops/attention.cpp.
class FusedKernels {
 public:
  virtual ~FusedKernels() = default;
  using EpilogueStep = FusedKernelsEpilogueStep;

  /// y (N, C_out, oh, ow) = epilogue(x (N, C, h, w) convolved with w (C_out, C / groups, kh, kw),
  /// plus bias (C_out) when defined). w and bias contiguous; x and y each contiguous or channels-last
  /// (Note [Channels-last activations in inference]), which a backend that does not take that layout
  /// declines. The backend checks the dtypes it takes: y of x's compute dtype (float32 for half x
  /// and w), or, for float16/bfloat16 x and w of one dtype, y of that dtype too (Note [Half outputs]
  /// in src/ops/conv.cpp: the product accumulated in float32 and rounded once; a bias or residual
  /// may then be added to the rounded product, rounding again, as PyTorch's half convolutions do),
  /// which a backend without such a kernel declines.
  virtual bool conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                      const Epilogue& epilogue, const Tensor& y);
  /// max_pool2d for channels-last x and out of one dtype, float16 and bfloat16 included: the values,
  /// and, where indices is defined (training, Note [Channels-last training] in src/ops/conv.cpp),
  /// each maximum's position h * W + w in its plane, as max_pool2d's, into channels-last int64
  /// indices of out's shape; false where the backend has no such kernel (for that dtype).
  virtual bool max_pool2d_channels_last(const Tensor& x, const Window2d& win, const Tensor& out,
                                        const Tensor& indices);
  /// Whether conv2d's kernel for this geometry works on channels-last activations, so that an
  /// output in that layout saves it a conversion: in inference (Note [Channels-last activations in
  /// inference]) or, with training, also for the two backward passes (Note [Channels-last training]).
  virtual bool conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups,
                                            bool training);
  /// gx (N, C, h, w) = the adjoint of conv2d in x applied to gy (N, C_out, oh, ow) (overwritten, not
  /// accumulated); w as conv2d's, contiguous. gy and gx both contiguous, or both channels-last, which
  /// a backend that does not take that layout declines. gx of gy's compute dtype, or of gy's and w's
  /// half dtype where they share one (float32 accumulation, one rounding; declined where not taken).
  virtual bool conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                                     const Tensor& gx);
  /// gw (C_out, C / groups, kh, kw) = the gradient of conv2d's weight, given its input x (N, C, h, w)
  /// and gy (N, C_out, oh, ow) (overwritten). gw contiguous; x and gy contiguous or channels-last, as
  /// the backend takes them (it declines otherwise). gw's dtypes as conv2d_backward_input's gx.
  virtual bool conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                                      const Tensor& gw);
  /// out (M, N) int32 = (a - a_zero)(b - b_zero) for a (M, K) and b (K, N), each int8 or uint8, zero
  /// points in their operand's range; all contiguous (int_matmul, ONNX's quantised products).
  virtual bool matmul_int8(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero, const Tensor& out);
  /// out (M, N) float32 = matmul_int8's exact product of a (M, K) and b (K, N) converted to float32,
  /// then each step of `epilogue` in order, each one float32 operation, so that the result is bitwise
  /// the conversion and the steps run as ops (braid::int_matmul_chain; onnxruntime's quantisers write
  /// the scale and the bias after every MatMulInteger).
  virtual bool matmul_int8_epilogue(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero,
                                    const std::vector<EpilogueStep>& epilogue, const Tensor& out);
  /// out (M, N) float32 = a (M, K) times b (K, N), both float32 and contiguous (b a weight: a matrix
  /// that later products read again), then each step of `epilogue` in order, each one float32
  /// operation, so that the result is the product's (up to the order of its sums) with the steps run
  /// as ops (braid::matmul_chain: a linear layer's bias and a residual).
  virtual bool matmul_epilogue(const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue,
                               const Tensor& out);
  /// out (M, N) = x (M, K) w (N, K)^T + bias (N), the bias added to the float32 product in its
  /// epilogue, before its one rounding to out (a linear layer in training, Note [Linear as one node]
  /// in src/ops/linalg.cpp). x and w contiguous, of one dtype: float32, float16 or bfloat16; out of
  /// that dtype, or float32 for half x and w; bias contiguous, of out's dtype.
  virtual bool linear_bias(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
  /// out (float32, x's shape) = (x - zero) * scale for x int8 or uint8, contiguous; the subtraction
  /// and the multiplication in float32 (braid::dequantize).
  virtual bool dequantize(const Tensor& x, double scale, int64_t zero, const Tensor& out);
  /// lo and hi (0-d float32) = the minimum and the maximum of x (float32, contiguous, not empty),
  /// NaN when x holds one; which zero of -0 and +0 is unspecified (braid::aminmax).
  virtual bool aminmax(const Tensor& x, const Tensor& lo, const Tensor& hi);
  /// ONNX's DynamicQuantizeLinear of x (float32, contiguous, not empty) into out (uint8, x's
  /// shape): scale and zero point from x's minimum and maximum as dynamic_quantize_params gives them,
  /// then quantize's values; bitwise braid::dynamic_quantize's composite.
  virtual bool dynamic_quantize(const Tensor& x, const Tensor& out, float& scale, int64_t& zero);
  /// out = softmax of x along its last axis, x contiguous (rows of x.size(-1)), with the composite's
  /// steps: m = max, e = exp(x - m), out = e / sum(e) (braid::softmax, forward only).
  virtual bool softmax_rows(const Tensor& x, const Tensor& out);
  /// out = log_softmax of x along its last axis, x float32 and contiguous, with the composite's
  /// steps: m = max (NaN when the row holds one), s = x - m, out = s - log(sum(exp(s))) (braid::
  /// log_softmax's forward; a language model's cross-entropy over its vocabulary).
  virtual bool log_softmax_rows(const Tensor& x, const Tensor& out);
  /// gx = g - exp(y) * sum(g) along the last axis (log_softmax's gradient, y its output), all float32,
  /// contiguous and of one shape, with the composite's steps.
  virtual bool log_softmax_backward_rows(const Tensor& g, const Tensor& y, const Tensor& gx);
  /// Layer normalisation of the rows of x (x contiguous, rows of n = weight's or bias's numel or the
  /// caller's row length: out's trailing size), with the composite's steps: m = mean, inv =
  /// 1 / sqrt(biased var + eps), out = (x - m) * inv, then * weight and + bias where defined (each n
  /// contiguous). mean and inv (one per row, contiguous) are written where defined (braid::
  /// layer_norm, forward only).
  virtual bool layer_norm_rows(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,
                               const Tensor& out, const Tensor& mean, const Tensor& inv);
  /// out (float32, x's shape) = dequantize(quantize(x, scale, zero, qtype), scale, zero), x float32
  /// and contiguous, qtype int8 or uint8, bitwise the two composites (braid::fake_quantize).
  virtual bool fake_quantize(const Tensor& x, double scale, int64_t zero, DType qtype, const Tensor& out);
  /// out = the last slot of braid::elementwise_chain's steps over x (float32, contiguous, out
  /// likewise), the channel of flat element i being (i / inner) % channels; each step the float32
  /// operations of its op, so that the result is bitwise the steps run one by one.
  virtual bool elementwise_chain(const Tensor& x, const std::vector<ChainStep>& steps, int64_t channels, int64_t inner,
                                 const Tensor& out);
  /// The channel gate of x (detail::channel_gate_values; a squeeze-and-excitation block's) into gate (N, C), and where out
  /// is defined x times it (detail::channel_gate): per sample n, m = the mean of x over H and W,
  /// gate[n] = e2(w2 e1(w1 m + b1) + b2), out[n, c, ...] = x[n, c, ...] * gate[n, c]. x and out float32
  /// and contiguous, (N, H, W, C) when channels_last, else (N, C, H, W); w1 (C_mid, C), w2 (C, C_mid),
  /// b1 (C_mid) and b2 (C) contiguous float32 or undefined; e1 and e2 activations only.
  virtual bool channel_gate(const Tensor& x, bool channels_last, const Tensor& w1, const Tensor& b1,
                              const Epilogue& e1, const Tensor& w2, const Tensor& b2, const Epilogue& e2,
                              const Tensor& gate, const Tensor& out);
  /// out (int8 or uint8, x's shape) = round_half_even(x / scale) + zero saturated to out's range, x
  /// float32 and contiguous, the division in float32; NaN gives 0 (braid::quantize).
  virtual bool quantize(const Tensor& x, double scale, int64_t zero, const Tensor& out);
  /// One Adam step in one pass over memory, in the order of the optimizer's composite update:
  /// p = p * decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2; s = max(max_v, v)
  /// written to max_v when it is defined (amsgrad), else v; p = p + (m / (sqrt(s) /
  /// sqrt_bias_correction2 + eps)) * -step_size. All contiguous, of one dtype and shape.
  virtual bool adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                         const AdamStep& s);
  /// adam_step on each entry of params in turn, all with the numbers s, in as few launches as the
  /// backend can (PyTorch's fused multi-tensor Adam): every parameter is stepped (true) or none is
  /// (false). The optimizer falls back to adam_step per parameter, then to the composite.
  virtual bool adam_steps(const std::vector<AdamTensors>& params, const AdamStep& s);
  /// torch.optim.SGD's step after the first for each parameter (the momentum buffers exist, or the
  /// momentum is 0): d = g (negated when maximize) + weight_decay * p; with momentum buf = momentum *
  /// buf + (1 - dampening) * d and d = nesterov ? d + momentum * buf : buf; p += -lr * d. Each
  /// operation one rounding in p's dtype, in the order of SGD::update's composite
  /// (src/optim/sgd.cpp), so that the result is the composite's bit for bit. All contiguous, of one
  /// dtype (float32 or float64) and one device.
  virtual bool sgd_steps(const std::vector<SgdTensors>& params, const SgdStep& s);
  // Batch normalisation's passes over x viewed as (N, C, S), per channel c (src/ops/norm.cpp). All
  // contiguous and of one dtype, or mixed: x, g, a, b and out of one half dtype (float16 or
  // bfloat16) with the per-channel tensors (mean, var, sum_g, sum_gxc, sa, shift, b_mean, sb)
  // float32, each element widened to float32, the sums accumulated in float32 or wider and out
  // rounded once to the half dtype (PyTorch's mixed-dtype batch norm; Note [BatchNorm as one node]).
  // A backend without such a kernel declines the mixed dtypes (the CPU's take float32 and float64).
  /// mean (C) and the biased variance var (C) of x over N and S.
  virtual bool channel_moments(const Tensor& x, const Tensor& mean, const Tensor& var);
  /// sum_g (C) = the sum of g, and sum_gxc (C) = the sum of g * (x - mean[c]), over N and S.
  virtual bool channel_grad_sums(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,
                                 const Tensor& sum_gxc);
  /// out = (a * sa[c] + shift[c]) + (b - b_mean[c]) * sb[c], the last term only when b is defined;
  /// a, b, out (N, C, S), the others (C).
  virtual bool channel_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b,
                              const Tensor& b_mean, const Tensor& sb, const Tensor& out);
  /// Attention without dropout per batch b (Note [Attention as one node] in src/ops/attention.cpp):
  /// out[b] (L, Ev) = softmax(q[b] k[b]^T * scale + bias) v[b] for q (B, L, E), k (B, S, E), v (B, S,
  /// Ev), contiguous, of one dtype (a backend checks the dtypes it takes); bias from mask, undefined
  /// or (B, L, S) with any strides (0 over axes it is broadcast along), bool (0 where true, -inf
  /// where false) or float32 (added), or with causal the -inf where key j > query i. lse (B, L)
  /// float32 = the log-sum-exp of each row of the scaled, biased scores. out float32 for float16 or
  /// bfloat16 q (or q's half dtype, rounded once from float32; a backend may decline it), else q's
  /// dtype. A row with every score -inf gives NaN, as the composite's softmax.
  virtual bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                                 double scale, const Tensor& out, const Tensor& lse);
  /// gq, gk, gv (q's, k's and v's shapes, overwritten; one dtype, float32 or for half q q's dtype,
  /// rounded once) = the gradients of attention_forward's out for grad_out (B, L, Ev, out's dtype,
  /// contiguous), given the forward's operands, out and lse.
  virtual bool attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                                  double scale, const Tensor& out, const Tensor& lse, const Tensor& grad_out,
                                  const Tensor& gq, const Tensor& gk, const Tensor& gv);
};

// Note [Half arithmetic]
// float16 and bfloat16 tensors compute as PyTorch's do: each element of unary, binary and where, and
// each sum, product, maximum and minimum of reduce, is computed in float32 (a reduction accumulates
// in float32) and the result is rounded once to the operands' dtype. So a half op gives exactly the
// float32 op on the widened operands, rounded: every backend agrees with the CPU's, which widens to
// float32 scratch and runs its float32 kernels (an extra pass; the CPU has no half arithmetic to
// gain from), where a GPU reads and writes the halves directly, which is the point of them: half
// the memory traffic of float32 activations (Note [Autocast] in src/ops/autocast.cpp). matmul takes
// half operands into a float32 or a same-dtype out, rounded once from the float32 accumulation.
// binary's arithmetic and where also take one float32 and one half operand into a float32 out
// (mixed_half_operands), reading the half one in its own dtype and widening it on the load, as
// PyTorch's TensorIterator casts inline: a float32 residual stream plus a bfloat16 product's output
// costs no separate cast pass. Widening is exact, so the values are those of casting first; only
// this pair is taken (not float16 with bfloat16, nor a half with float64), which keeps a GPU's
// kernels to two per op, and the ops cast any other mixture first.

/// Whether binary (arithmetic, into a float32 out) and where take operands of dtypes a and b as they
/// are although they differ: one float32 and one float16 or bfloat16 (Note [Half arithmetic]).
inline bool mixed_half_operands(DType a, DType b) {
  return (a == DType::Float32 && is_half(b)) || (is_half(a) && b == DType::Float32);
}

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory, transfers and ordering (Note [Device memory] in src/core/storage.cpp) ----
  /// nbytes (a positive multiple of 64) of this device's memory, 64-byte aligned at least; throws
  /// Error naming the bytes on exhaustion.
  virtual void* allocate(Device device, int64_t nbytes) = 0;
  /// Returns memory from allocate (same device and size).
  virtual void deallocate(Device device, void* p, int64_t nbytes) = 0;
  /// Bytes the allocator keeps for reuse, and their release to the system.
  virtual int64_t cached_bytes(Device device) = 0;
  virtual void empty_cache(Device device) = 0;
  /// Page-locked host memory for transfers to and from this device (optional): the device's copy
  /// engine reads and writes it directly, where ordinary host memory goes through a driver buffer
  /// and a second copy. nullptr where the device has none (the default), or when none is left; the
  /// caller then uses ordinary host memory. deallocate_pinned takes back what allocate_pinned gave.
  virtual void* allocate_pinned(Device device, int64_t nbytes);
  virtual void deallocate_pinned(Device device, void* p, int64_t nbytes);
  /// Raw byte copies between host memory and this device's memory; ordered after every queued op,
  /// and complete (host memory safe to read or reuse) when they return.
  virtual void copy_from_host(Device device, const void* host, void* dev, int64_t nbytes) = 0;
  virtual void copy_to_host(Device device, const void* dev, void* host, int64_t nbytes) = 0;
  /// Waits for every queued operation on device.
  virtual void synchronize(Device device) = 0;
  /// The number of devices of this backend's type in the process.
  virtual int device_count() = 0;
  /// A marker at the end of device's queue (braid::Event). The default suits a backend whose work is
  /// complete when synchronize returns: it synchronises and takes a timestamp, so the event is
  /// always ready. A backend with a queue (CUDA's stream) records into it instead.
  virtual std::shared_ptr<BackendEvent> record_event(Device device);
  virtual bool event_ready(const BackendEvent& event);
  virtual void event_synchronize(const BackendEvent& event);
  /// Milliseconds from start to end, both recorded by this backend on one device; waits for end.
  virtual double event_elapsed_ms(const BackendEvent& start, const BackendEvent& end);

  // ---- primitives ----
  /// dst[i] = cast(src[i]); same shape, any strides and dtypes.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, double value) = 0;
  /// dst[i] = start + i * step over dst's row-major order.
  virtual void iota(const Tensor& dst, double start, double step) = 0;
  /// out = op(x); same shape and dtype (bool for LogicalNot/IsNan); float16 and bfloat16 too (Note
  /// [Half arithmetic]).
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) = 0;
  /// out = op(a, b); a and b have out's shape and the same dtype; out is that dtype or bool. The half
  /// types too, and for the arithmetic ops (out not bool) a float32 out from one float32 and one
  /// half operand (mixed_half_operands; Note [Half arithmetic]).
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// out = cond ? a : b; all of out's shape, cond bool, a/b out's dtype (any dtype), or for a
  /// float32 out one of a/b float16 or bfloat16 (widened exactly; mixed_half_operands).
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// out has x's shape with the reduced axes set to 1; ArgMax/ArgMin reduce one axis into int64. The
  /// half types accumulate in float32 and round once (Note [Half arithmetic]).
  virtual void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) = 0;
  /// out (..., M, N) = a (..., M, K) @ b (..., K, N); batch axes already broadcast; out contiguous.
  /// a, b and out share a compute dtype, or (autocast, Note [Autocast] in src/ops/autocast.cpp) a
  /// and b are both Float16 or both BFloat16 and out is Float32 or their dtype: the products
  /// accumulate in float32, rounded once into a half out (cuBLAS: half inputs, float32 compute type).
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// out[..i..] = x[..index[..i..]..] along axis; index int64 of out's shape, values in range.
  virtual void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) = 0;
  /// out[..index[..i..]..] += src[..i..] along axis; index int64 of src's shape, values in range.
  virtual void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) = 0;
  /// Fills out from the Philox stream (seed, first block counter).
  virtual void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) = 0;
  /// cols (C * kh * kw, N * oh * ow) from x (N, C, h, w), both contiguous: row (c, i, j) holds tap
  /// (i, j) of channel c for every sample and output position, 0 in the padding. x and cols share
  /// a floating dtype, Float16 and BFloat16 included (pure data movement; autocast's convolutions).
  virtual void im2col(const Tensor& x, const Window2d& win, const Tensor& cols) = 0;
  /// x (N, C, h, w) += the adjoint of im2col applied to cols (C * kh * kw, N * oh * ow); both contiguous.
  virtual void col2im(const Tensor& cols, const Window2d& win, const Tensor& x) = 0;
  /// Depthwise convolution (groups = C): y (N, C * m, oh, ow) = each channel c of x (N, C, h, w)
  /// convolved with the m filters w (C * m, 1, kh, kw) of rows c * m .. c * m + m - 1, plus bias
  /// (C * m) when defined. All contiguous.
  virtual void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                                const Tensor& y) = 0;
  /// out (N, C, oh, ow) = the max of each window of x (N, C, h, w), padding excluded, NaN winning;
  /// indices (int64, out's shape) = its position y * w + x in the plane, when defined (undefined
  /// when no gradient will need them). Every window holds an element of x. All contiguous. The
  /// pooling primitives take float32, float64, float16 and bfloat16 (x, out, grad and grad_x of one
  /// dtype): a half maximum is exact, a half average or adjoint sums and divides in float32 and
  /// rounds once (Note [Half arithmetic]; the CPU widens to float32 scratch).
  virtual void max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) = 0;
  /// out (N, C, oh, ow) = each window's sum over x (N, C, h, w) (dilation 1) divided by its size
  /// clipped to [-ph, h + ph) x [-pw, w + pw) when count_include_pad, else to the input. All contiguous.
  virtual void avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) = 0;
  /// grad_x (N, C, h, w) += the adjoint of avg_pool2d applied to grad (N, C, oh, ow). All contiguous.
  virtual void avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                                   const Tensor& grad_x) = 0;

  /// Its table of fused kernels (Note [Fused kernels]); the default offers none.
  virtual FusedKernels& fused();
  /// Whether autocast keeps activations in float16/bfloat16 on this device (Note [Autocast] in
  /// src/ops/autocast.cpp): true where the kernels read and write halves directly, so that half
  /// outputs halve the activations' memory and traffic (a GPU); false, the default, where half
  /// arithmetic widens to float32 anyway (the CPU), and autocast's products return float32.
  virtual bool autocast_half_activations() const { return false; }
};

/// The backend that runs tensors on device; NotImplementedError when the device is not compiled
/// in or does not exist.
Backend& backend_for(Device device);

/// DynamicQuantizeLinear's scale and zero point from x's minimum and maximum (NaN where x holds
/// one) in the ONNX reference's float32 arithmetic: the range widened to include 0 (a NaN bound
/// counts as 0), scale = range / 255 (1 / 255 for an all-zero x), zero = round(-lo / scale) in
/// [0, 255].
inline void dynamic_quantize_params(float mn, float mx, float& scale, int64_t& zero) {
  const float lo = std::min(0.0f, mn), hi = std::max(0.0f, mx);
  scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
  zero = static_cast<int64_t>(std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f)));
}

}  // namespace braid::detail
