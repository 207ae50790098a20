// im2col and its adjoint col2im: the CPU primitives under convolution (src/ops/conv.cpp turns a
// convolution into one GEMM over their columns). Both split the work so that no two threads write
// one element: im2col over (column row, sample) pairs, col2im over (sample, channel) planes.
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/epilogue.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

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

}  // namespace braid::detail
