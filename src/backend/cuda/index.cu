// gather and scatter_add along one axis. The data operand's axis stride is zeroed in the indexer,
// so each element finds its partner as base + index * axis_stride (as src/backend/cpu/index.cpp).
// scatter_add accumulates with atomics, so float sums may add in another order than the CPU's.
// The CudaBackend methods, which unpack the tensors for them (host.h), follow the kernels.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

template <typename U>
struct GatherFn {
  U* out;                // over the index's shape
  const int64_t* index;  // positions along the axis
  const U* x;            // row starts, axis stride zeroed
  int64_t axis_stride;
  __device__ void operator()(const int64_t* off) const { out[off[0]] = x[off[2] + index[off[1]] * axis_stride]; }
};

__device__ inline void atomic_accumulate(float* p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_accumulate(double* p, double v) { atomicAdd(p, v); }
__device__ inline void atomic_accumulate(int32_t* p, int32_t v) { atomicAdd(p, v); }  // wraps
__device__ inline void atomic_accumulate(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));  // wraps
}
// bool accumulates as or: set the byte's bit in its (allocation-internal, 4-byte aligned) word.
__device__ inline void atomic_accumulate(bool* p, bool v) {
  if (!v) return;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  atomicOr(reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3}), 1u << ((addr & 3u) * 8u));
}

template <typename T>
struct ScatterAddFn {
  T* out;                // row starts, axis stride zeroed
  const int64_t* index;  // over src's shape
  const T* src;
  int64_t axis_stride;
  __device__ void operator()(const int64_t* off) const {
    atomic_accumulate(out + off[0] + index[off[1]] * axis_stride, src[off[2]]);
  }
};

void launch_gather(int element_size, const Indexer<3>& ix, int64_t n, int64_t axis_stride, void* out,
                   const int64_t* index, const void* x, cudaStream_t stream) {
  dispatch_bits(element_size, "gather", [&](auto tag) {
    using U = typename decltype(tag)::type;
    launch_elementwise(ix, n, GatherFn<U>{static_cast<U*>(out), index, static_cast<const U*>(x), axis_stride}, stream,
                       "gather");
  });
}

void launch_scatter_add(DType type, const Indexer<3>& ix, int64_t n, int64_t axis_stride, void* out,
                        const int64_t* index, const void* src, cudaStream_t stream) {
  dispatch_compute(type, "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(ix, n, ScatterAddFn<T>{static_cast<T*>(out), index, static_cast<const T*>(src), axis_stride},
                       stream, "scatter_add");
  });
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  BRAID_ASSERT(
      index.dtype() == kInt64 && index.shape() == out.shape() && x.dtype() == out.dtype() && x.dim() == out.dim(),
      "gather: index must be int64 of out's shape");
  if (out.numel() == 0) return;
  cuda::Launch l("gather", out, {x, index});
  Shape xs = x.strides();
  const int64_t axis_stride = xs[axis];
  xs[axis] = 0;
  const auto ix = cuda::make_indexer<3>(out.shape(), {out.strides().data(), index.strides().data(), xs.data()});
  cuda::launch_gather(static_cast<int>(x.element_size()), ix, out.numel(), axis_stride, cuda::ptr(out),
                      static_cast<const int64_t*>(cuda::ptr(index)), cuda::ptr(x), l.stream);
}

void CudaBackend::scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) {
  BRAID_ASSERT(
      index.dtype() == kInt64 && index.shape() == src.shape() && src.dtype() == out.dtype() && src.dim() == out.dim(),
      "scatter_add: index must be int64 of src's shape");
  if (src.numel() == 0) return;
  cuda::Launch l("scatter_add", out, {index, src});
  Shape os = out.strides();
  const int64_t axis_stride = os[axis];
  os[axis] = 0;
  const auto ix = cuda::make_indexer<3>(src.shape(), {os.data(), index.strides().data(), src.strides().data()});
  cuda::launch_scatter_add(src.dtype(), ix, src.numel(), axis_stride, cuda::ptr(out),
                           static_cast<const int64_t*>(cuda::ptr(index)), cuda::ptr(src), l.stream);
}

}  // namespace braid::detail
