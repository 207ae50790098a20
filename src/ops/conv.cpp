// Convolution (braid/conv.h; pooling is in pool.cpp), composed from the backend's im2col/col2im
// primitives and matmul, or run by a backend's own convolution kernels where it has them (oneDNN's
// on the CPU: Note [Fused kernels] in backend/backend.h). Each op checks its arguments at the
// front door and records one autograd node. Three building blocks serve every formula: conv2d's
// input gradient is conv_transpose2d's forward and the other way round, and one weight-gradient
// product serves both. Under autocast the products read rounded operands (Note [Autocast]).
#include "braid/conv.h"
#include "ops/fused.h"

#include <algorithm>
#include <array>
#include <atomic>

#include "braid/amp.h"
#include "ops/window.h"
#include "core/knob_read.h"

namespace braid {

using namespace detail;

namespace {

// Note [Channel-major columns]
// im2col writes cols as (C * kh * kw, N * oh * ow), the whole batch side by side, rather than one
// (C * K, P) matrix per sample: then conv2d with groups = 1 is one large GEMM, W (C_out, C * K) x
// cols (C * K, N * P), which OpenBLAS threads well, and so are the weight gradient
// (C_out, N * P) x (N * P, C * K) and the column gradient. With groups the leading axis splits into
// (G, C / G * K) and the product is a batch of G GEMMs. The price is that outputs and output
// gradients travel channel-major, (C_out, N * P); the transposes to and from (N, C_out, P) touch
// C_out * N * P elements, C * K / C_out times fewer than cols, and the forward one is fused with
// the bias add.

// Whether a convolution runs in mixed precision: x, w and the bias (if any) are all of the dtypes
// autocast rounds, inside a scope (Note [Autocast]).
bool conv_autocasts(const Tensor& x, const Tensor& w, const Tensor& bias) {
  return autocasts(x, w) && (!bias.defined() || autocast_eligible(bias));
}

// t detached, and rounded to the autocast dtype when amp.
Tensor operand(const Tensor& t, bool amp) { return amp ? cast_raw(t.detach(), autocast_dtype()) : t.detach(); }

// A saved operand as backward uses it: the rounded half operands of autocast widened to float32.
Tensor widened(const Tensor& t) { return is_compute_type(t.dtype()) ? t : cast(t, kFloat32); }

// The dtype a convolution returns: autocast's rule on x's device (Note [Autocast]), else x's own
// (half operands outside a scope give half, as in PyTorch). The products accumulate in float32.
DType output_dtype(const Tensor& x, bool amp) { return amp ? autocast_output_dtype(x) : x.dtype(); }

// The saved operands x and w and the output gradient g as the backward products read them: with a
// half gradient (half activations, Note [Autocast]) the half operands as they are, into float32
// results; otherwise widened to float32.
struct BackwardOperands {
  Tensor x, w, g;
};
BackwardOperands backward_operands(const Tensor& xs, const Tensor& ws, const Tensor& g) {
  if (is_half(g.dtype()) && is_half(xs.dtype())) return {xs, ws, cast_raw(g, xs.dtype())};
  return {widened(xs), widened(ws), widened(g)};
}

// x (N, C, *spatial) and weight (C_out, C / groups, *kernel), or (C, C_out / groups, *kernel) when
// transposed, plus the optional bias (C_out). Under autocast the three may have different dtypes.
void check_conv(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, int64_t groups, int64_t spatial,
                bool transposed) {
  const bool amp = conv_autocasts(x, w, bias);
  if (!amp) {
    check_float(x, op, "input");
    check_float(w, op, "weight");
  }
  const char* dims = spatial == 1 ? "L" : "H, W";
  BRAID_CHECK(x.dim() == spatial + 2, op, ": expected a ", spatial + 1, "-d (C, ", dims, ") or ", spatial + 2,
              "-d (N, C, ", dims, ") input, got shape ", shape_str(x.shape()));
  BRAID_CHECK(w.dim() == spatial + 2, op, ": expected a ", spatial + 2, "-d weight, got shape ", shape_str(w.shape()));
  for (int64_t d = 2; d < x.dim(); ++d)
    BRAID_CHECK(x.shape()[d] > 0, op, ": input shape ", shape_str(x.shape()), " has an empty spatial axis ", d,
                " (padding does not make up for it, as in PyTorch)");
  BRAID_CHECK_T(TypeError, amp || x.dtype() == w.dtype(), op, ": input is ", dtype_name(x.dtype()), " but weight is ",
                dtype_name(w.dtype()), "; cast one to the other's dtype");
  check_same_device(x, w, op);
  BRAID_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  if (!bias.defined()) return;
  const int64_t bias_size = transposed ? w.shape()[1] * groups : w.shape()[0];
  if (!amp) check_float(bias, op, "bias");
  check_same_device(x, bias, op);
  BRAID_CHECK_T(TypeError, amp || bias.dtype() == x.dtype(), op, ": bias is ", dtype_name(bias.dtype()),
                " but input is ", dtype_name(x.dtype()));
  BRAID_CHECK(bias.dim() == 1 && bias.shape()[0] == bias_size, op, ": bias must have shape [", bias_size, "], got ",
              shape_str(bias.shape()));
}

// (N, C, h, w) -> (G, C / G, N * h * w), the layout of Note [Channel-major columns].
Tensor channel_major(const Tensor& t, int64_t groups) {
  const Shape& s = t.shape();
  return contiguous(t.permute({1, 0, 2, 3})).view({groups, s[1] / groups, s[0] * s[2] * s[3]});
}

// cols (G, C / G * kh * kw, N * oh * ow) of x (N, C, h, w), in x's dtype (half under autocast).
Tensor im2col(const Tensor& x, const Window2d& win, int64_t groups) {
  const Shape& s = x.shape();
  Tensor cols = new_like(x, {s[1] * win.kh * win.kw, s[0] * win.oh * win.ow}, x.dtype());
  backend_of(x).im2col(contiguous(x), win, cols);
  return cols.view({groups, cols.shape()[0] / groups, cols.shape()[1]});
}

// The building blocks take detached tensors and record nothing; their products are matmul_raw,
// which turns the half operands of autocast into a float32 result.

// Note [Convolution fast paths]
// Two common shapes skip im2col: a depthwise convolution (groups = C, MobileNet's 3x3 layers) runs
// the backend's direct kernel, which reads each input plane once instead of copying it kh * kw
// times and running C tiny GEMMs; a 1x1 convolution with stride 1 and no padding is already a GEMM
// per sample, W (C_out, C) x x[n] (C, h * w), with no column matrix and no transposes. Only the
// forward changes; the backward formulas below serve every case.
//
// y (N, C_out, oh, ow) = w (C_out, C / G, kh, kw) convolved with x (N, C, h, w), plus bias; x and w
// of one dtype, y and bias of that dtype or float32 for half x and w. The fused entries are handed
// outputs of the composite's dtype (float32 for half operands, as matmul_raw writes), so that a
// backend's kernel and the composite give one result; see Note [Half outputs] for the exception.

// Note [Half outputs]
// Where a product's operands are float16/bfloat16 and the op wants its result in that dtype anyway
// (autocast's half activations on a GPU, Note [Autocast]; half tensors outside a scope; in backward
// a half gradient), the fused entry is first offered an output of the operands' dtype: the tensor
// cores' half-in/half-out configuration (cuDNN's PSEUDO_HALF_CONFIG, as PyTorch runs), float32
// accumulation rounded once, with no float32 intermediate and no rounding pass after it. A backend
// without that kernel (the CPU's oneDNN entries take float32 only) declines, and the op takes
// today's path exactly: a float32 output from the entry or the composite, rounded by cast_raw. So
// the CPU's values never change. Each product says where it makes the offer (half_out below).

// Whether a product of operands a and b is offered an output of dtype out first (Note [Half outputs]).
bool half_out(const Tensor& a, const Tensor& b, DType out) {
  return is_half(out) && a.dtype() == out && b.dtype() == out;
}

// The activation of an epilogue, applied with the ops (recorded when its input needs a gradient).
Tensor apply_activation(const Tensor& y, const Epilogue& e) {
  switch (e.kind) {
    case Epilogue::Kind::None: return y;
    case Epilogue::Kind::Relu: return relu(y);
    case Epilogue::Kind::Clip: return clamp(y, e.a, e.b);
    case Epilogue::Kind::HardSwish: return hardswish(y);
    case Epilogue::Kind::HardSigmoid: return hardsigmoid(y, e.a, e.b);
  }
  return y;
}

Tensor apply_epilogue(const Tensor& y, const Epilogue& e) {
  Tensor out = apply_activation(e.residual.defined() ? y + e.residual : y, e);
  if (e.scale != 1) out = out * e.scale;
  if (e.shift != 0) out = out + e.shift;
  return out;
}

// Note [Channels-last activations in inference]
// braid's tensors are NCHW, while oneDNN's convolution kernels work on channels-last (NHWC) or
// blocked activations: converting to and from them around every convolution was a large share of
// ResNet-18's inference and more of the MobileNet-style models'. Where nothing records the convolution (no
// gradient wanted), its output is channels-last when its input is, and, inside a ChannelsLastGuard
// (braid/conv.h; the ONNX executor runs inference in one), also when the backend says its kernel
// takes that layout (Backend::conv2d_prefers_channels_last; on the CPU every convolution oneDNN
// runs, on NHWC activations). Such a tensor is a strided view of NHWC memory with the usual
// (N, C, H, W) shape: PyTorch's channels_last format. The elementwise ops keep the layout of their
// first full-size operand (ops/common.cpp), so residual blocks, activations and squeeze-excitation
// products pass it on from one convolution to the next; every other op reads it through its strides
// or makes it contiguous, as for any view, and the executor hands its callers NCHW outputs. Values
// are the same either way, bit for bit, but for the dense 3x3 convolutions of stride 1 that take
// Winograd's kernels on channels-last activations (Note [Winograd convolutions in inference] in
// src/backend/cpu/conv.cpp), which round differently (measured: benchmarks/README.md, What changed
// what, run M). Training takes channels-last where its backend asks for it (Note [Channels-last
// training]), and BRAID_CHANNELS_LAST=0 keeps NCHW everywhere, for a comparison.
thread_local bool t_prefer_channels_last = false;

// Note [Channels-last training]
// cuDNN's tensor-core kernels for half operands are NHWC ones: fed NCHW activations, it transposes
// them on the way into and out of every pass. So where the backend says a recorded convolution
// prefers channels-last (Backend::conv2d_prefers_channels_last with training set: CUDA for half
// operands, every convolution under autocast's GPU rule; never the CPU, whose oneDNN backward plans
// are NCHW), conv_recorded lays its (rounded) input out NHWC, once at the first convolution, and y
// comes out NHWC, as PyTorch's channels_last memory format. The ops after it keep the layout
// (elementwise ops, casts, BatchNorm's NHWC channel view in norm.cpp, max pooling in pool.cpp), so
// the next convolution finds its input NHWC. Backward offers the fused entries the gradient in the
// layout it arrives in, and dL/dx comes back in it; an entry that declines gets contiguous copies,
// and the composite runs on contiguous copies, its output laid out as x. The values are the NCHW
// path's wherever the same kernels run: tests/test_channels_last_training.cpp.

// set_channels_last's value: -1 until set or first read (then BRAID_CHANNELS_LAST's).
std::atomic<int> g_channels_last{-1};

bool channels_last_enabled() {
  int v = g_channels_last.load();
  if (v < 0) {
    int unset = -1;
    g_channels_last.compare_exchange_strong(unset, detail::knob_flag("BRAID_CHANNELS_LAST") ? 1 : 0);
    v = g_channels_last.load();
  }
  return v == 1;
}

// The epilogue's residual as the convolution's output, where its caller gives its memory up
// (Epilogue::residual_writable) and it is what the output would be: of that shape and dtype, and
// channels-last or contiguous as asked, and not the memory of x or w. Undefined otherwise.
Tensor writable_residual(const Epilogue& e, const Tensor& x, const Tensor& w, const Shape& shape, DType dtype,
                         bool channels_last) {
  const Tensor& r = e.residual;
  if (!e.residual_writable || !r.defined() || r.shape() != shape || r.dtype() != dtype ||
      r.storage() == x.storage() || r.storage() == w.storage())
    return Tensor();
  return (channels_last ? !r.is_contiguous() && r.is_channels_last() : r.is_contiguous()) ? r : Tensor();
}

// The fused conv2d entry's y of dtype y_dtype (Note [Fused kernels]); undefined where it declines.
Tensor fused_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                     const Epilogue& epilogue, bool any_layout, DType y_dtype) {
  const int64_t n = x.shape()[0], c_out = w.shape()[0];
  const bool x_cl = is_channels_last_layout(x);
  if (any_layout && x.dim() == 4 && channels_last_enabled() &&
      (x_cl ||
       (t_prefer_channels_last && backend_of(x).fused().conv2d_prefers_channels_last(x, w, win, groups, false)))) {
    Tensor y = writable_residual(epilogue, x, w, {n, c_out, win.oh, win.ow}, y_dtype, true);
    if (!y.defined()) y = new_channels_last({n, c_out, win.oh, win.ow}, y_dtype, x.device());
    const Tensor xs = x_cl ? x : contiguous(x);
    if (backend_of(x).fused().conv2d(xs, contiguous(w), bias.defined() ? contiguous(bias) : bias, win, groups, epilogue, y))
      return y;
  }
  Tensor y = writable_residual(epilogue, x, w, {n, c_out, win.oh, win.ow}, y_dtype, false);
  if (!y.defined()) y = new_like(x, {n, c_out, win.oh, win.ow}, y_dtype);
  if (backend_of(x).fused().conv2d(contiguous(x), contiguous(w), bias.defined() ? contiguous(bias) : bias, win, groups,
                                   epilogue, y))
    return y;
  return Tensor();
}

Tensor conv_composite(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups);

// half_y: the caller wants y in x's half dtype (Note [Half outputs]); y may then be of that dtype.
// any_layout: y may be channels-last (Note [Channels-last activations in inference], Note
// [Channels-last training]), and is where x is.
Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                    const Epilogue& epilogue = Epilogue(), bool any_layout = false, bool half_y = false) {
  if (half_y && half_out(x, w, x.dtype()))
    if (Tensor y = fused_forward(x, w, bias, win, groups, epilogue, any_layout, x.dtype()); y.defined()) return y;
  if (Tensor y = fused_forward(x, w, bias, win, groups, epilogue, any_layout, compute_type(x.dtype())); y.defined())
    return y;  // Note [Fused kernels]
  if (epilogue.any()) return apply_epilogue(conv_forward(x, w, bias, win, groups, Epilogue(), any_layout), epilogue);
  const Tensor y = conv_composite(x, w, bias, win, groups);
  return any_layout && channels_last_enabled() && is_channels_last_layout(x) ? as_channels_last(y) : y;
}

// conv_forward's composite, without an epilogue: y contiguous.
Tensor conv_composite(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups) {
  const int64_t n = x.shape()[0], c_out = w.shape()[0];
  if (groups > 1 && groups == x.shape()[1]) {
    if (!is_compute_type(x.dtype()))  // the direct kernel has no half form (Note [Autocast])
      return conv_forward(cast_raw(x, kFloat32), cast_raw(w, kFloat32), bias, win, groups);
    Tensor y = new_like(x, {n, c_out, win.oh, win.ow}, x.dtype());
    backend_of(x).depthwise_conv2d(contiguous(x), contiguous(w), bias.defined() ? contiguous(bias) : bias, win, y);
    return y;
  }
  if (groups == 1 && win.kh == 1 && win.kw == 1 && win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0 &&
      win.oh == win.h && win.ow == win.w) {
    Tensor y = matmul_raw(w.reshape({c_out, -1}), contiguous(x).view({n, x.shape()[1], win.h * win.w}));
    y = y.view({n, c_out, win.oh, win.ow});
    return bias.defined() ? y + bias.view({1, c_out, 1, 1}) : y;
  }
  Tensor y = matmul_raw(w.reshape({groups, c_out / groups, -1}), im2col(x, win, groups));  // (G, C_out / G, N * P)
  Tensor yt = y.view({c_out, n, win.oh, win.ow}).permute({1, 0, 2, 3});
  return bias.defined() ? yt + bias.view({1, c_out, 1, 1}) : contiguous(yt);
}

// An output gradient z (N, C_out, oh, ow) of a convolution with groups, and its channel_major form
// (G, C_out / G, N * oh * ow) that the composite building blocks read, made once on first use.
class ChannelMajor {
 public:
  ChannelMajor(Tensor z, int64_t groups) : z_(std::move(z)), groups_(groups) {}
  const Tensor& z() const { return z_; }
  int64_t groups() const { return groups_; }
  const Tensor& cm() const {
    if (!cm_.defined()) cm_ = channel_major(z_, groups_);
    return cm_;
  }

 private:
  Tensor z_;
  int64_t groups_;
  mutable Tensor cm_;
};

// The fused backward-data entry's x (x_shape) of dtype dt from gy, offered gy's own layout first
// where it is channels-last (Note [Channels-last training]); undefined where the entry declines.
Tensor fused_adjoint(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups, const Shape& x_shape,
                     DType dt) {
  FusedKernels& fused = backend_of(gy).fused();
  if (is_channels_last_layout(gy))
    if (Tensor x = new_channels_last(x_shape, dt, gy.device());
        fused.conv2d_backward_input(gy, contiguous(w), win, groups, x))
      return x;
  if (Tensor x = new_like(gy, x_shape, dt); fused.conv2d_backward_input(contiguous(gy), contiguous(w), win, groups, x))
    return x;
  return Tensor();
}

// x (x_shape) = bias + the adjoint of x -> conv_forward(x, w) applied to z; half_x: x may be of z's
// half dtype where there is no bias (Note [Half outputs]).
Tensor conv_adjoint(const ChannelMajor& z, const Tensor& w, const Window2d& win, const Shape& x_shape,
                    const Tensor& bias, bool half_x = false) {
  const int64_t groups = z.groups();
  if (half_x && !bias.defined() && half_out(z.z(), w, z.z().dtype()))
    if (Tensor x = fused_adjoint(z.z(), w, win, groups, x_shape, z.z().dtype()); x.defined()) return x;
  // Note [Fused kernels]
  if (Tensor x = fused_adjoint(z.z(), w, win, groups, x_shape, compute_type(z.z().dtype())); x.defined())
    return bias.defined() ? x + bias.view({1, x_shape[1], 1, 1}) : x;
  const Tensor& zcm = z.cm();
  Tensor cols = matmul_raw(w.reshape({groups, zcm.shape()[1], -1}).mT(), zcm);  // (G, C / G * K, N * P)
  Tensor x = new_like(zcm, x_shape, cols.dtype());
  if (bias.defined())
    backend_of(x).copy(broadcast_view(bias.view({1, x_shape[1], 1, 1}), x_shape), x);
  else
    backend_of(x).fill(x, 0.0);
  backend_of(x).col2im(cols, win, x);
  return x;
}

// Note [Transposed convolution without overlap]
// A transposed convolution whose stride equals its kernel, without padding or dilation (the 2x2,
// stride-2 upsampling of U-Net and PP-OCR's detector), writes each input pixel's product into its
// own kh x kw tile of the output. Per kernel row a, one GEMM of x as rows of channels (N H W, C) by
// the weight's row a as (C, kw C_out) gives output rows (N H of them, each W kw C_out long) whole:
// the bias is added to them and they are copied into every kh-th row of the channels-last output,
// all passes over long runs. The general path (the convolution's adjoint: oneDNN's backward-data
// kernel, or col2im) made the same sums with the machinery of overlapping windows, several times
// slower (measured: benchmarks/README.md, What changed what, run S). The output is channels-last where the input is
// or inference prefers it (Note [Channels-last activations in inference]), NCHW otherwise.
Tensor tiled_transpose(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win) {
  const bool x_cl = !x.is_contiguous() && x.is_channels_last();
  const bool keep_cl = channels_last_enabled() && !is_grad_enabled() && (x_cl || t_prefer_channels_last);
  NoGradGuard no_grad;  // the op records its own node
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), co = w.size(1), kh = win.kh, kw = win.kw,
                row = wd * kw * co;
  const Tensor rows = contiguous(x.permute({0, 2, 3, 1})).view({n * h * wd, c});
  const Tensor wm = contiguous(w.permute({2, 0, 3, 1})).view({kh, c, kw * co});  // (a, C, (b, co))
  // The bias along an output row: C_out values repeated for each of its W kw pixels.
  const Tensor bias_row = bias.defined() ? contiguous(bias.reshape({1, co}).expand({wd * kw, co})).view({row}) : Tensor();
  Tensor out = new_like(x, {n, h * kh, wd * kw, co}, x.dtype());  // channels-last memory
  const Tensor out_rows = out.view({n * h, kh, row});
  for (int64_t a = 0; a < kh; ++a) {
    Tensor g = matmul(rows, wm.select(0, a)).view({n * h, row});
    if (bias.defined()) g.add_(bias_row);
    out_rows.select(1, a).copy_(g);
  }
  Tensor y = out.permute({0, 3, 1, 2});
  return keep_cl ? y : contiguous(y);
}

// dL/dw (w_shape) from the convolution's input x (N, C, h, w) and g = dL/dy; half_gw: gw may be of
// their half dtype (Note [Half outputs]; a parameter's gradient is widened by the engine anyway).
Tensor conv_weight_grad(const Tensor& x, const ChannelMajor& g, const Window2d& win, const Shape& w_shape,
                        bool half_gw = false) {
  // The fused entry's gw of dtype dt, offered x and g in their own layouts first where either is
  // channels-last (Note [Channels-last training]); undefined where it declines.
  const auto fused = [&](DType dt) {
    FusedKernels& f = backend_of(x).fused();
    const Tensor& gy = g.z();
    if (is_channels_last_layout(x) || is_channels_last_layout(gy))
      if (Tensor gw = new_like(x, w_shape, dt); f.conv2d_backward_weight(x, gy, win, g.groups(), gw)) return gw;
    if (Tensor gw = new_like(x, w_shape, dt); f.conv2d_backward_weight(contiguous(x), contiguous(gy), win, g.groups(), gw))
      return gw;
    return Tensor();
  };
  if (half_gw && half_out(x, g.z(), x.dtype()))
    if (Tensor gw = fused(x.dtype()); gw.defined()) return gw;
  if (Tensor gw = fused(compute_type(x.dtype())); gw.defined()) return gw;  // Note [Fused kernels]
  return matmul_raw(g.cm(), im2col(x, win, g.groups()).mT()).view(w_shape);
}

// conv over 4-d x and w (checked), recorded as one node; under autocast the node saves the rounded
// operands and adds a float32 bias (Note [Autocast]).
// With an epilogue, fused into the convolution only where nothing records: no gradient is needed
// and no trace for export is active; otherwise the convolution's node and the activation's.
// rows: conv1d's (a height of 1), NCHW in training too: a 3-d tensor has no channels-last layout.
Tensor conv_recorded(const Tensor& x, const Tensor& w, const Tensor& bias_in, const Window2d& win, int64_t groups,
                     const Epilogue& epilogue = Epilogue(), bool rows = false) {
  // Whether a node records this convolution (a gradient wanted, or a trace for export active).
  const bool records = (is_grad_enabled() &&
                        (x.requires_grad() || w.requires_grad() || (bias_in.defined() && bias_in.requires_grad()))) ||
                       active_trace() != nullptr;
  if (epilogue.any() && records) return apply_epilogue(conv_recorded(x, w, bias_in, win, groups), epilogue);
  const bool amp = conv_autocasts(x, w, bias_in);
  // Nothing to record or trace: the operands as they are (detaching them makes three TensorImpls
  // that only backward would read; Note [Channels-last activations in inference] applies).
  if (!records && !amp)
    return cast_raw(conv_forward(x, w, bias_in, win, groups, epilogue, true, is_half(x.dtype())), x.dtype());
  const Tensor bias = amp && bias_in.defined() ? cast(bias_in, kFloat32) : bias_in;
  Tensor xs = operand(x, amp);
  const Tensor ws = operand(w, amp);
  const DType out_dtype = output_dtype(x, amp);
  // Note [Channels-last training]: where the backend's passes want NHWC, x is laid out so (once,
  // at the first convolution) and y follows; otherwise NHWC only where no node records.
  const bool nhwc = records && !rows && channels_last_enabled() &&
                    backend_of(x).fused().conv2d_prefers_channels_last(xs, ws, win, groups, true);
  if (nhwc) xs = as_channels_last(xs);
  Tensor out = conv_forward(xs, ws, bias.defined() ? bias.detach() : bias, win, groups, epilogue, !records || nhwc,
                            out_dtype == xs.dtype());
  out = cast_raw(out, out_dtype);
  traced("conv2d", out, {x, w, bias}, {{win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw, groups}, {}});
  // Note [Half outputs]: x's gradient in half where x itself is (the engine would round it so), w's
  // wherever the gradient is half.
  const bool x_half = x.dtype() == xs.dtype();
  return record("conv2d", out, {x, w, bias}, [xs, ws, win, groups, x_half](const Tensor& g_in, Grads& r) {
    const auto [x, w, g] = backward_operands(xs, ws, g_in);
    const bool half = is_half(g.dtype());
    const ChannelMajor gz(g, groups);
    if (r.needs(0)) r.set(0, conv_adjoint(gz, w, win, x.shape(), Tensor(), half && x_half));
    if (r.needs(1)) r.set(1, conv_weight_grad(x, gz, win, w.shape(), half));
    if (r.needs(2)) r.set(2, sum(g, {0, 2, 3}));
  });
}

// conv1d and conv2d after the tensor checks: the geometry per spatial axis (pads as {before, after}).
Tensor conv_nd(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, const std::vector<int64_t>& stride,
               const std::vector<int64_t>& pads, const std::vector<int64_t>& dilation, int64_t groups,
               const Epilogue& epilogue = Epilogue()) {
  check_positive(stride, op, "stride");
  check_positive(dilation, op, "dilation");
  check_non_negative(pads, op, "padding");
  const int64_t c = x.shape()[1], c_out = w.shape()[0], spatial = x.dim() - 2;
  BRAID_CHECK(c == w.shape()[1] * groups, op, ": input has ", c, " channels but weight expects ", w.shape()[1] * groups,
              " (groups=", groups, "), input shape ", shape_str(x.shape()), ", weight shape ", shape_str(w.shape()));
  BRAID_CHECK(c_out % groups == 0, op, ": weight has ", c_out, " output channels, not divisible by groups=", groups,
              " (weight shape ", shape_str(w.shape()), ")");
  // Per spatial axis (one or two; no allocation on this path, which every inference convolution takes).
  std::array<Axis, 2> axes{};
  std::array<int64_t, 2> padded{}, span{};
  bool fits = true;
  for (int64_t a = 0; a < spatial; ++a) {
    const auto i = static_cast<size_t>(a);
    const int64_t in = x.shape()[static_cast<size_t>(2 + a)], k = w.shape()[static_cast<size_t>(2 + a)];
    padded[i] = in + pads[2 * i] + pads[2 * i + 1];
    span[i] = dilation[i] * (k - 1) + 1;
    fits = fits && span[i] <= padded[i];
    axes[i] = {in, (padded[i] - span[i]) / stride[i] + 1, k, stride[i], pads[2 * i], dilation[i]};
  }
  if (!fits) {
    const Shape padded_v(padded.begin(), padded.begin() + spatial), span_v(span.begin(), span.begin() + spatial);
    throw ValueError(cat(op, ": the kernel (spanning ", shape_str(span_v), " with dilation ", shape_str(dilation),
                         ") is larger than the padded input ", shape_str(padded_v), " (input shape ",
                         shape_str(x.shape()), ", weight shape ", shape_str(w.shape()), ")"));
  }
  if (spatial == 2) return conv_recorded(x, w, bias, make_window(axes[0], axes[1]), groups, epilogue);
  const Axis unit{1, 1, 1, 1, 0, 1};  // conv1d is conv2d over a height of 1
  return conv_recorded(x.unsqueeze(2), w.unsqueeze(2), bias, make_window(unit, axes[0]), groups, epilogue, true)
      .squeeze(2);
}

}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  if (x.defined() && x.dim() == 2)
    return conv1d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  check_conv("conv1d", x, weight, bias, groups, 1, false);
  return conv_nd("conv1d", x, weight, bias, {stride}, {padding, padding}, {dilation}, groups);
}

namespace {

// conv2d after its unbatched form is batched: the checks and the padding forms, then conv_nd.
Tensor conv2d_with(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
                   const Epilogue& epilogue, const char* op) {
  check_conv(op, x, weight, bias, groups, 2, false);
  BRAID_CHECK(padding.size() == 1 || padding.size() == 2 || padding.size() == 4, op,
              ": padding must have 1, 2 or 4 values, got ", shape_str(padding));
  // Each of the three as two values per axis: the argument itself where it is (no copies on the path
  // every inference convolution takes), otherwise expanded here.
  std::vector<int64_t> expanded[3];
  const auto two = [&](const std::vector<int64_t>& v, size_t n, std::vector<int64_t>& out,
                       const char* name) -> const std::vector<int64_t>& {
    if (v.size() == n) return v;
    out = per_axis(v, 2, op, name);
    if (n == 4) out = {out[0], out[0], out[1], out[1]};
    return out;
  };
  return conv_nd(op, x, weight, bias, two(stride, 2, expanded[0], "stride"), two(padding, 4, expanded[1], "padding"),
                 two(dilation, 2, expanded[2], "dilation"), groups, epilogue);
}

}  // namespace

void set_channels_last(bool on) { g_channels_last.store(on ? 1 : 0); }
bool channels_last() { return channels_last_enabled(); }

ChannelsLastGuard::ChannelsLastGuard() : prev_(t_prefer_channels_last) { t_prefer_channels_last = true; }
ChannelsLastGuard::~ChannelsLastGuard() { t_prefer_channels_last = prev_; }
bool ChannelsLastGuard::active() { return t_prefer_channels_last; }

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
              const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups) {
  if (x.defined() && x.dim() == 3)
    return conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  return conv2d_with(x, weight, bias, stride, padding, dilation, groups, Epilogue(), "conv2d");
}

Epilogue detail::activation_epilogue(const std::string& name, double a, double b, const char* op) {
  static const std::pair<const char*, Epilogue::Kind> kKinds[] = {{"", Epilogue::Kind::None},
                                                                  {"relu", Epilogue::Kind::Relu},
                                                                  {"clip", Epilogue::Kind::Clip},
                                                                  {"hardswish", Epilogue::Kind::HardSwish},
                                                                  {"hardsigmoid", Epilogue::Kind::HardSigmoid}};
  for (const auto& [known, kind] : kKinds)
    if (name == known) return {kind, a, b};
  throw ValueError(cat(op, ": unknown activation '", name, "'; known: relu, clip, hardswish, hardsigmoid"));
}

Tensor detail::conv2d_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
                         const std::string& activation, double a, double b, double scale, double shift,
                         const Tensor& residual, bool residual_writable) {
  Epilogue e = activation_epilogue(activation, a, b, "conv2d_activation");
  BRAID_CHECK(e.kind != Epilogue::Kind::None, "conv2d_activation: unknown activation '", activation,
              "'; known: relu, clip, hardswish, hardsigmoid");
  e.scale = scale;
  e.shift = shift;
  e.residual = residual;
  e.residual_writable = residual_writable;
  if (x.defined() && x.dim() == 3)
    return conv2d_activation(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups, activation, a, b, scale,
                             shift, residual.defined() && residual.dim() == 3 ? residual.unsqueeze(0) : residual,
                             residual_writable)
        .squeeze(0);
  return conv2d_with(x, weight, bias, stride, padding, dilation, groups, e, "conv2d_activation");
}

std::vector<int64_t> conv_padding_same(const std::vector<int64_t>& kernel, const std::vector<int64_t>& dilation) {
  const std::vector<int64_t> d = per_axis(dilation, kernel.size(), "conv_padding_same", "dilation");
  check_positive(kernel, "conv_padding_same", "kernel");
  check_positive(d, "conv_padding_same", "dilation");
  std::vector<int64_t> pads;
  for (size_t a = 0; a < kernel.size(); ++a) {
    const int64_t total = d[a] * (kernel[a] - 1);
    pads.insert(pads.end(), {total / 2, total - total / 2});
  }
  return pads;
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                        const std::vector<int64_t>& output_padding_in, int64_t groups,
                        const std::vector<int64_t>& dilation_in) {
  const char* op = "conv_transpose2d";
  if (x.defined() && x.dim() == 3)
    return conv_transpose2d(x.unsqueeze(0), weight, bias, stride_in, padding_in, output_padding_in, groups, dilation_in)
        .squeeze(0);
  check_conv(op, x, weight, bias, groups, 2, true);
  const std::vector<int64_t> stride = per_axis(stride_in, 2, op, "stride"),
                             pad = per_axis(padding_in, 2, op, "padding");
  const std::vector<int64_t> out_pad = per_axis(output_padding_in, 2, op, "output_padding");
  const std::vector<int64_t> dilation = per_axis(dilation_in, 2, op, "dilation");
  check_positive(stride, op, "stride");
  check_positive(dilation, op, "dilation");
  check_non_negative(pad, op, "padding");
  check_non_negative(out_pad, op, "output_padding");
  const int64_t c = x.shape()[1], c_out = weight.shape()[1] * groups;
  BRAID_CHECK(c == weight.shape()[0], op, ": input has ", c, " channels but weight expects ", weight.shape()[0],
              " (weight shape (C_in, C_out / groups, kH, kW) = ", shape_str(weight.shape()), ", input shape ",
              shape_str(x.shape()), ")");
  BRAID_CHECK(c % groups == 0, op, ": input channels ", c, " are not divisible by groups=", groups);
  Axis axes[2];
  for (int a = 0; a < 2; ++a) {
    BRAID_CHECK(out_pad[a] < std::max(stride[a], dilation[a]), op, ": output_padding ", shape_str(out_pad),
                " must be smaller than either stride ", shape_str(stride), " or dilation ", shape_str(dilation));
    const int64_t in = x.shape()[2 + a], k = weight.shape()[2 + a];
    const int64_t out = (in - 1) * stride[a] - 2 * pad[a] + dilation[a] * (k - 1) + out_pad[a] + 1;
    BRAID_CHECK(out > 0, op, ": the output would be empty along axis ", a + 2, " (input shape ", shape_str(x.shape()),
                ", weight shape ", shape_str(weight.shape()), ", padding ", shape_str(pad), ")");
    // The window is that of the convolution this op is the adjoint of: output -> input.
    axes[a] = {out, in, k, stride[a], pad[a], dilation[a]};
  }
  const Window2d win = make_window(axes[0], axes[1]);
  const Shape out_shape{x.shape()[0], c_out, win.h, win.w};
  const bool amp = conv_autocasts(x, weight, bias);
  const Tensor b = amp && bias.defined() ? cast(bias, kFloat32) : bias;
  const Tensor xs = operand(x, amp), ws = operand(weight, amp);
  const bool tiles = groups == 1 && win.sh == win.kh && win.sw == win.kw && win.ph == 0 && win.pw == 0 && win.dh == 1 &&
                     win.dw == 1 && out_pad[0] == 0 && out_pad[1] == 0 && is_compute_type(xs.dtype());
  const DType out_dtype = output_dtype(x, amp);
  Tensor out = tiles ? tiled_transpose(xs, ws, b.defined() ? b.detach() : b, win)
                     : conv_adjoint(ChannelMajor(xs, groups), ws, win, out_shape, b.defined() ? b.detach() : b,
                                    out_dtype == xs.dtype());
  out = cast_raw(out, out_dtype);
  const bool x_half = x.dtype() == xs.dtype();  // as conv_recorded's (Note [Half outputs])
  return record(op, out, {x, weight, b}, [xs, ws, win, groups, x_half](const Tensor& g_in, Grads& r) {
    const auto [x, w, g] = backward_operands(xs, ws, g_in);
    const bool half = is_half(g.dtype());
    if (r.needs(0)) r.set(0, conv_forward(g, w, Tensor(), win, groups, Epilogue(), false, half && x_half));
    if (r.needs(1)) r.set(1, conv_weight_grad(g, ChannelMajor(x, groups), win, w.shape(), half));
    if (r.needs(2)) r.set(2, sum(g, {0, 2, 3}));
  });
}

}  // namespace braid
