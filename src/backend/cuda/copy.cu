// Data movement kernels: copy with dtype conversion between any layouts (any of the nine dtypes to
// any other), fill with a bit pattern, and iota. Copies within one dtype move bits, so dtypes of
// one width share a kernel; conversions are one kernel per (destination, source) pair.
// The CudaBackend methods, which unpack the tensors for them (host.h), follow the kernels.
#include <cstring>

#include "backend/cpu/dispatch.h"  // fill converts its value as the CPU does
#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

template <typename D, typename S>
struct CopyFn {
  D* dst;
  const S* src;
  __device__ void operator()(const int64_t* off) const { dst[off[0]] = convert<D>(src[off[1]]); }
};

template <typename U>
struct CopyBitsFn {
  U* dst;
  const U* src;
  __device__ void operator()(const int64_t* off) const { dst[off[0]] = src[off[1]]; }
};

template <typename U>
struct FillFn {
  U* dst;
  U value;
  __device__ void operator()(const int64_t* off) const { dst[off[0]] = value; }
};

// Explicit roundings: start + i * step exactly as the CPU computes it, never fused into an fma.
template <typename T>
__global__ void __launch_bounds__(kThreads) iota_kernel(T* dst, int64_t n, double start, double step) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    dst[i] = convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
}

void launch_copy(DType dst_type, DType src_type, const Indexer<2>& ix, int64_t n, void* dst, const void* src,
                 cudaStream_t stream) {
  if (dst_type == src_type) {
    return dispatch_bits(static_cast<int>(dtype_size(dst_type)), "copy", [&](auto tag) {
      using U = typename decltype(tag)::type;
      launch_elementwise(ix, n, CopyBitsFn<U>{static_cast<U*>(dst), static_cast<const U*>(src)}, stream, "copy");
    });
  }
  dispatch_all(dst_type, "copy", [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_all(src_type, "copy", [&](auto stag) {
      using S = typename decltype(stag)::type;
      if constexpr (!std::is_same_v<D, S>)
        launch_elementwise(ix, n, CopyFn<D, S>{static_cast<D*>(dst), static_cast<const S*>(src)}, stream, "copy");
    });
  });
}

void launch_fill(int element_size, uint64_t bits, const Indexer<1>& ix, int64_t n, void* dst, cudaStream_t stream) {
  dispatch_bits(element_size, "fill", [&](auto tag) {
    using U = typename decltype(tag)::type;
    launch_elementwise(ix, n, FillFn<U>{static_cast<U*>(dst), static_cast<U>(bits)}, stream, "fill");
  });
}

void launch_iota(DType type, int64_t n, void* dst, double start, double step, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch_all(type, "iota", [&](auto tag) {
    using T = typename decltype(tag)::type;
    iota_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst), n, start, step);
    check_launch("iota", "iota_kernel");
  });
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  BRAID_ASSERT(src.shape() == dst.shape(), "copy: shapes ", shape_str(src.shape()), " and ", shape_str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  cuda::Launch l("copy", dst, {src});
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (cuda::ptr(src) != cuda::ptr(dst))
      cuda::check(cudaMemcpyAsync(cuda::ptr(dst), cuda::ptr(src), static_cast<size_t>(n * dst.element_size()),
                                  cudaMemcpyDeviceToDevice, l.stream),
                  "copy", "cudaMemcpyAsync");
    return;
  }
  cuda::launch_copy(dst.dtype(), src.dtype(), cuda::indexer<2>(dst.shape(), {&dst, &src}), n, cuda::ptr(dst),
                    cuda::ptr(src), l.stream);
}

void CudaBackend::fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  cuda::Launch l("fill", dst, {});
  uint64_t bits = 0;  // the value's element, converted as the CPU converts it
  dispatch_all(dst.dtype(), "fill", [&]<typename T>() {
    const T v = convert<T>(value);
    std::memcpy(&bits, &v, sizeof(T));
  });
  cuda::launch_fill(static_cast<int>(dst.element_size()), bits, cuda::indexer<1>(dst.shape(), {&dst}), dst.numel(),
                    cuda::ptr(dst), l.stream);
}

void CudaBackend::iota(const Tensor& dst, double start, double step) {
  if (dst.numel() == 0) return;
  BRAID_ASSERT(dst.is_contiguous(), "iota: dst must be contiguous");
  cuda::Launch l("iota", dst, {});
  cuda::launch_iota(dst.dtype(), dst.numel(), cuda::ptr(dst), start, step, l.stream);
}

}  // namespace braid::detail
