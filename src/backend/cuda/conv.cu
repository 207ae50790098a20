// im2col, its adjoint col2im, and depthwise convolution: the primitives under convolution
// (src/ops/conv.cpp runs a convolution as im2col + one GEMM, here on cuBLAS). One thread per
// output element, each a gather, so nothing needs atomics: col2im sums into each x element the
// taps that read it, in the CPU's tap order, and depthwise accumulates its taps in the CPU's order,
// so both agree with the CPU bit for bit (no fused multiply-adds: see meson.build's -fmad=false).
// The CudaBackend methods that unpack the tensors and launch them follow the kernels (host.h).
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

// im2col moves bits: cols (C * kh * kw, N * oh * ow), row (c, i, j), column (b, oy, ox).
template <typename U>
__global__ void __launch_bounds__(kThreads) im2col_kernel(const U* x, U* cols, int64_t n, int64_t c, Window2d win) {
  const int64_t p = win.oh * win.ow, ncols = n * p, total = c * win.kh * win.kw * ncols;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t row = idx / ncols, col = idx - row * ncols;
    const int64_t b = col / p, q = col - b * p, oy = q / win.ow, ox = q - oy * win.ow;
    const int64_t ch = row / (win.kh * win.kw), t = row - ch * win.kh * win.kw, i = t / win.kw, j = t - i * win.kw;
    const int64_t iy = oy * win.sh - win.ph + i * win.dh, ix = ox * win.sw - win.pw + j * win.dw;
    const bool inside = iy >= 0 && iy < win.h && ix >= 0 && ix < win.w;
    cols[idx] = inside ? x[((b * c + ch) * win.h + iy) * win.w + ix] : U(0);
  }
}

// x (N, C, h, w) += col2im(cols): each element adds the columns that im2col copied it into.
template <typename T>
__global__ void __launch_bounds__(kThreads) col2im_kernel(const T* cols, T* x, int64_t n, int64_t c, Window2d win) {
  const int64_t p = win.oh * win.ow, ncols = n * p, total = n * c * win.h * win.w;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t xx = idx % win.w, y = idx / win.w % win.h, plane = idx / (win.w * win.h);
    const int64_t ch = plane % c, b = plane / c;
    T acc = x[idx];
    for (int64_t i = 0; i < win.kh; ++i) {
      const int64_t ty = y + win.ph - i * win.dh;  // oy * sh
      if (ty < 0 || ty % win.sh != 0 || ty / win.sh >= win.oh) continue;
      const int64_t oy = ty / win.sh;
      for (int64_t j = 0; j < win.kw; ++j) {
        const int64_t tx = xx + win.pw - j * win.dw;  // ox * sw
        if (tx < 0 || tx % win.sw != 0 || tx / win.sw >= win.ow) continue;
        const int64_t row = (ch * win.kh + i) * win.kw + j;
        acc += cols[row * ncols + b * p + oy * win.ow + tx / win.sw];
      }
    }
    x[idx] = acc;
  }
}

// y (N, C * mult, oh, ow): bias, then each tap's weight times its input, in the CPU's tap order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    depthwise_kernel(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t c, int64_t mult, Window2d win) {
  const int64_t p = win.oh * win.ow, c_out = c * mult, total = n * c_out * p;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t q = idx % p, plane = idx / p, co = plane % c_out, b = plane / c_out;
    const int64_t oy = q / win.ow, ox = q % win.ow;
    const T* src = x + (b * c + co / mult) * win.h * win.w;  // (h, w)
    const T* wk = w + co * win.kh * win.kw;                  // (kh, kw)
    T acc = bias != nullptr ? bias[co] : T(0);
    for (int64_t i = 0; i < win.kh; ++i) {
      const int64_t iy = oy * win.sh - win.ph + i * win.dh;
      if (iy < 0 || iy >= win.h) continue;
      for (int64_t j = 0; j < win.kw; ++j) {
        const int64_t ix = ox * win.sw - win.pw + j * win.dw;
        if (ix >= 0 && ix < win.w) acc += wk[i * win.kw + j] * src[iy * win.w + ix];
      }
    }
    y[idx] = acc;
  }
}

void launch_im2col(DType type, const void* x, void* cols, int64_t n, int64_t c, const Window2d& win,
                   cudaStream_t stream) {
  BRAID_CHECK_T(TypeError, is_floating(type), "im2col: dtype ", dtype_name(type),
                " is not supported by the CUDA backend");
  const int64_t total = c * win.kh * win.kw * n * win.oh * win.ow;
  if (total == 0) return;
  dispatch_bits(static_cast<int>(dtype_size(type)), "im2col", [&](auto tag) {
    using U = typename decltype(tag)::type;
    im2col_kernel<U>
        <<<grid_for(total), kThreads, 0, stream>>>(static_cast<const U*>(x), static_cast<U*>(cols), n, c, win);
    check_launch("im2col", "im2col_kernel");
  });
}

void launch_col2im(DType type, const void* cols, void* x, int64_t n, int64_t c, const Window2d& win,
                   cudaStream_t stream) {
  const int64_t total = n * c * win.h * win.w;
  if (total == 0) return;
  dispatch_floating(type, "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    col2im_kernel<T>
        <<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(cols), static_cast<T*>(x), n, c, win);
    check_launch("col2im", "col2im_kernel");
  });
}

void launch_depthwise_conv2d(DType type, const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t c,
                             int64_t mult, const Window2d& win, cudaStream_t stream) {
  const int64_t total = n * c * mult * win.oh * win.ow;
  if (total == 0) return;
  dispatch_floating(type, "depthwise_conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    depthwise_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                                  static_cast<const T*>(bias), static_cast<T*>(y), n, c,
                                                                  mult, win);
    check_launch("depthwise_conv2d", "depthwise_kernel");
  });
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::im2col(const Tensor& x, const Window2d& win, const Tensor& cols) {
  BRAID_ASSERT(x.dim() == 4 && x.is_contiguous() && cols.is_contiguous() && x.dtype() == cols.dtype(),
               "im2col: x (N, C, h, w) and cols must be contiguous and of one dtype");
  if (cols.numel() == 0) return;
  cuda::Launch l("im2col", cols, {x});
  cuda::launch_im2col(x.dtype(), cuda::ptr(x), cuda::ptr(cols), x.shape()[0], x.shape()[1], win, l.stream);
}

void CudaBackend::col2im(const Tensor& cols, const Window2d& win, const Tensor& x) {
  BRAID_ASSERT(x.dim() == 4 && x.is_contiguous() && cols.is_contiguous() && x.dtype() == cols.dtype(),
               "col2im: x (N, C, h, w) and cols must be contiguous and of one dtype");
  if (cols.numel() == 0) return;
  cuda::Launch l("col2im", x, {cols});
  cuda::launch_col2im(x.dtype(), cuda::ptr(cols), cuda::ptr(x), x.shape()[0], x.shape()[1], win, l.stream);
}

void CudaBackend::depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                                   const Tensor& y) {
  BRAID_ASSERT(x.dim() == 4 && w.dim() == 4 && y.dim() == 4 && x.is_contiguous() && w.is_contiguous() &&
                   y.is_contiguous() && (!bias.defined() || bias.is_contiguous()) && x.dtype() == w.dtype() &&
                   x.dtype() == y.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
               "depthwise_conv2d: x, w, y (and bias) must be contiguous and of one dtype");
  if (y.numel() == 0) return;
  cuda::Launch l("depthwise_conv2d", y, {x, w, bias});
  const int64_t c = x.shape()[1];
  cuda::launch_depthwise_conv2d(x.dtype(), cuda::ptr(x), cuda::ptr(w), cuda::ptr(bias), cuda::ptr(y), x.shape()[0], c,
                                w.shape()[0] / c, win, l.stream);
}

}  // namespace braid::detail
