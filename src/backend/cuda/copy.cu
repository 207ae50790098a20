// Data movement kernels: copy with dtype conversion between any layouts (any of the nine dtypes to
// any other), fill with a bit pattern, and iota. Copies within one dtype move bits, so dtypes of
// one width share a kernel; conversions are one kernel per (destination, source) pair.
#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"

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

}  // namespace

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

}  // namespace braid::detail::cuda
