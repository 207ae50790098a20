// 2-d max and average pooling and average pooling's adjoint over contiguous (N, C, h, w) planes,
// one thread per output (per input element for the adjoint, a gather over the windows that hold
// it, so no atomics). Window clipping, divisors, NaN handling and summation order are those of
// src/backend/cpu/pool.cpp, so results equal the CPU's bit for bit. Channels-last max pooling (the
// fused entry of inference, Note [Fused kernels]) takes one thread per output, channels innermost.
// float16 and bfloat16 planes load each element as float32 and round once on the store (Note [Half
// arithmetic] in backend/backend.h): a maximum is exact, an average sums and divides in float32, as
// the CPU's float32 kernels on the widened planes.
// The CudaBackend methods that unpack the tensors and launch them follow the kernels (host.h).
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

__device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// window_taps (backend.h): the taps [lo, hi) of a window at start that fall in [0, size).
__device__ inline void taps(int64_t start, int64_t dilation, int64_t k, int64_t size, int64_t& lo, int64_t& hi) {
  lo = start >= 0 ? 0 : imin(k, (-start + dilation - 1) / dilation);
  hi = imax(lo, start >= size ? 0 : imin(k, (size - 1 - start) / dilation + 1));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_pool_kernel(const T* x, T* out, int64_t* indices, int64_t planes, Window2d win) {
  const int64_t p = win.oh * win.ow, total = planes * p;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t t = idx / p, q = idx % p, oy = q / win.ow, ox = q % win.ow;
    const T* src = x + t * win.h * win.w;  // (h, w)
    const int64_t y0 = oy * win.sh - win.ph, x0 = ox * win.sw - win.pw;
    int64_t ilo, ihi, jlo, jhi;
    taps(y0, win.dh, win.kh, win.h, ilo, ihi);
    taps(x0, win.dw, win.kw, win.w, jlo, jhi);
    int64_t best_at = (y0 + ilo * win.dh) * win.w + x0 + jlo * win.dw;
    Compute<T> best = cast<Compute<T>>(src[best_at]);
    for (int64_t i = ilo; i < ihi; ++i) {
      const int64_t row = (y0 + i * win.dh) * win.w + x0;
      for (int64_t j = jlo; j < jhi; ++j) {
        const Compute<T> v = cast<Compute<T>>(src[row + j * win.dw]);
        if (v > best || v != v) {  // NaN propagates (the last NaN's index, as the CPU's scan)
          best = v;
          best_at = row + j * win.dw;
        }
      }
    }
    out[idx] = cast<T>(best);
    if (indices != nullptr) indices[idx] = best_at;  // null when no gradient needs them
  }
}

// The window of output (oy, ox) clipped to the input, and its divisor (the CPU's avg_window).
struct AvgWindow {
  int64_t y0, y1, x0, x1;
  double divisor;
};

__device__ inline AvgWindow avg_window(const Window2d& win, int64_t oy, int64_t ox, bool count_include_pad) {
  const int64_t ys = oy * win.sh - win.ph, xs = ox * win.sw - win.pw;
  const int64_t ye = imin(ys + win.kh, win.h + win.ph), xe = imin(xs + win.kw, win.w + win.pw);
  AvgWindow a{imax(ys, 0), imin(ye, win.h), imax(xs, 0), imin(xe, win.w), 0};
  a.divisor = static_cast<double>(count_include_pad ? (ye - ys) * (xe - xs) : (a.y1 - a.y0) * (a.x1 - a.x0));
  return a;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_pool_kernel(const T* x, T* out, int64_t planes, Window2d win, bool count_include_pad) {
  const int64_t p = win.oh * win.ow, total = planes * p;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t t = idx / p, q = idx % p;
    const T* src = x + t * win.h * win.w;
    const AvgWindow a = avg_window(win, q / win.ow, q % win.ow, count_include_pad);
    using C = Compute<T>;
    C sum = 0;
    for (int64_t y = a.y0; y < a.y1; ++y)
      for (int64_t xx = a.x0; xx < a.x1; ++xx) sum += cast<C>(src[y * win.w + xx]);
    out[idx] = cast<T>(sum / static_cast<C>(a.divisor));
  }
}

// grad_x += the shares of the outputs whose windows hold each element, in the CPU's output order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_pool_backward_kernel(const T* grad, T* gx, int64_t planes, Window2d win, bool count_include_pad) {
  const int64_t plane = win.h * win.w, total = planes * plane;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t t = idx / plane, y = idx % plane / win.w, xx = idx % win.w;
    const T* g = grad + t * win.oh * win.ow;  // (oh, ow)
    // Outputs o with o * s - p <= y < o * s - p + k.
    const int64_t ylo = y + win.ph - win.kh + 1, xlo = xx + win.pw - win.kw + 1;
    const int64_t oy0 = ylo <= 0 ? 0 : (ylo + win.sh - 1) / win.sh, oy1 = imin(win.oh - 1, (y + win.ph) / win.sh);
    const int64_t ox0 = xlo <= 0 ? 0 : (xlo + win.sw - 1) / win.sw, ox1 = imin(win.ow - 1, (xx + win.pw) / win.sw);
    using C = Compute<T>;
    C acc = cast<C>(gx[idx]);
    for (int64_t oy = oy0; oy <= oy1; ++oy) {
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const AvgWindow a = avg_window(win, oy, ox, count_include_pad);
        if (y >= a.y0 && y < a.y1 && xx >= a.x0 && xx < a.x1)
          acc += cast<C>(g[oy * win.ow + ox]) / static_cast<C>(a.divisor);
      }
    }
    gx[idx] = cast<T>(acc);
  }
}

// f(Tag<T>{}) for the dtypes the pooling kernels take: float, double, float16 and bfloat16.
template <typename F>
void dispatch_pooled(DType t, const char* op, F&& f) {
  if (t == DType::Float16) return f(Tag<F16>{});
  if (t == DType::BFloat16) return f(Tag<BF16>{});
  dispatch_floating(t, op, f);
}

void launch_max_pool2d(DType type, const void* x, void* out, int64_t* indices, int64_t planes, const Window2d& win,
                       cudaStream_t stream) {
  const int64_t total = planes * win.oh * win.ow;
  if (total == 0) return;
  dispatch_pooled(type, "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out),
                                                                 indices, planes, win);
    check_launch("max_pool2d", "max_pool_kernel");
  });
}

void launch_avg_pool2d(DType type, const void* x, void* out, int64_t planes, const Window2d& win,
                       bool count_include_pad, cudaStream_t stream) {
  const int64_t total = planes * win.oh * win.ow;
  if (total == 0) return;
  dispatch_pooled(type, "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), planes,
                                                                 win, count_include_pad);
    check_launch("avg_pool2d", "avg_pool_kernel");
  });
}

void launch_avg_pool2d_backward(DType type, const void* grad, void* grad_x, int64_t planes, const Window2d& win,
                                bool count_include_pad, cudaStream_t stream) {
  const int64_t total = planes * win.h * win.w;
  if (total == 0) return;
  dispatch_pooled(type, "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool_backward_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(grad), static_cast<T*>(grad_x), planes, win, count_include_pad);
    check_launch("avg_pool2d_backward", "avg_pool_backward_kernel");
  });
}

// ---- channels-last max pooling ----

// out (N, oh, ow, C in memory) = the max of each window of x (N, h, w, C in memory), NaN winning,
// padding excluded, and, where indices is given, its position y * w + x in the plane, as
// max_pool_kernel's: one thread per output, channels innermost so that a warp reads neighbours.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_pool_nhwc_kernel(const T* x, T* out, int64_t* indices, int64_t n, int64_t c, Window2d win) {
  const int64_t total = n * win.oh * win.ow * c;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t ch = idx % c, q = idx / c, ox = q % win.ow, oy = q / win.ow % win.oh, b = q / (win.ow * win.oh);
    const T* src = x + b * win.h * win.w * c + ch;
    const int64_t y0 = oy * win.sh - win.ph, x0 = ox * win.sw - win.pw;
    const int64_t ilo = y0 >= 0 ? 0 : imin(win.kh, (-y0 + win.dh - 1) / win.dh);
    const int64_t ihi = imax(ilo, y0 >= win.h ? 0 : imin(win.kh, (win.h - 1 - y0) / win.dh + 1));
    const int64_t jlo = x0 >= 0 ? 0 : imin(win.kw, (-x0 + win.dw - 1) / win.dw);
    const int64_t jhi = imax(jlo, x0 >= win.w ? 0 : imin(win.kw, (win.w - 1 - x0) / win.dw + 1));
    int64_t at = (y0 + ilo * win.dh) * win.w + x0 + jlo * win.dw;
    Compute<T> best = cast<Compute<T>>(src[at * c]);
    for (int64_t i = ilo; i < ihi; ++i)
      for (int64_t j = jlo; j < jhi; ++j) {
        const int64_t p = (y0 + i * win.dh) * win.w + x0 + j * win.dw;
        const Compute<T> v = cast<Compute<T>>(src[p * c]);
        if (v > best || v != v) best = v, at = p;  // NaN propagates (the last NaN's index, as max_pool_kernel)
      }
    out[idx] = cast<T>(best);
    if (indices) indices[idx] = at;
  }
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

namespace {
void check_planes(const Tensor& x, const Tensor& out, const char* op) {
  BRAID_ASSERT(x.dim() == 4 && out.dim() == 4 && x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype() &&
                   x.shape()[0] * x.shape()[1] == out.shape()[0] * out.shape()[1],
               op, ": operands must be contiguous (N, C, *, *) tensors of one dtype");
}
}  // namespace

void CudaBackend::max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) {
  check_planes(x, out, "max_pool2d");
  BRAID_ASSERT(
      !indices.defined() || (indices.dtype() == kInt64 && indices.is_contiguous() && indices.shape() == out.shape()),
      "max_pool2d: indices must be contiguous int64 of out's shape");
  if (out.numel() == 0) return;
  cuda::Launch l("max_pool2d", out, {x, indices});
  cuda::launch_max_pool2d(x.dtype(), cuda::ptr(x), cuda::ptr(out),
                          static_cast<int64_t*>(cuda::ptr(indices)),  // null when undefined
                          out.shape()[0] * out.shape()[1], win, l.stream);
}

bool CudaBackend::max_pool2d_channels_last(const Tensor& x, const Window2d& win, const Tensor& out,
                                           const Tensor& indices) {
  if (x.dim() != 4 || !x.is_channels_last() || !out.is_channels_last() || out.dtype() != x.dtype() ||
      (indices.defined() && (indices.dtype() != kInt64 || indices.shape() != out.shape() || !indices.is_channels_last())))
    return false;
  const int64_t n = x.size(0), c = x.size(1), total = n * c * win.oh * win.ow;
  cuda::Launch l("max_pool2d", x, {out, indices});
  auto run = [&]<typename T>(cuda::Tag<T>) {
    if (total == 0) return true;
    cuda::max_pool_nhwc_kernel<T><<<cuda::grid_for(total), cuda::kThreads, 0, l.stream>>>(
        static_cast<const T*>(cuda::ptr(x)), static_cast<T*>(cuda::ptr(out)),
        static_cast<int64_t*>(cuda::ptr(indices)), n, c, win);  // indices null when undefined
    cuda::check_launch("max_pool2d", "max_pool_nhwc_kernel");
    return true;
  };
  if (x.dtype() == kFloat32) return run(cuda::Tag<float>{});
  if (x.dtype() == kFloat64) return run(cuda::Tag<double>{});
  if (x.dtype() == kFloat16) return run(cuda::Tag<cuda::F16>{});
  if (x.dtype() == kBFloat16) return run(cuda::Tag<cuda::BF16>{});
  return false;  // the composite (a contiguous copy, then max_pool2d) for the other dtypes
}

void CudaBackend::avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) {
  check_planes(x, out, "avg_pool2d");
  if (out.numel() == 0) return;
  cuda::Launch l("avg_pool2d", out, {x});
  cuda::launch_avg_pool2d(x.dtype(), cuda::ptr(x), cuda::ptr(out), out.shape()[0] * out.shape()[1], win,
                          count_include_pad, l.stream);
}

void CudaBackend::avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                                      const Tensor& grad_x) {
  check_planes(grad_x, grad, "avg_pool2d_backward");
  if (grad.numel() == 0) return;
  cuda::Launch l("avg_pool2d_backward", grad_x, {grad});
  cuda::launch_avg_pool2d_backward(grad.dtype(), cuda::ptr(grad), cuda::ptr(grad_x), grad.shape()[0] * grad.shape()[1],
                                   win, count_include_pad, l.stream);
}

}  // namespace braid::detail
