// gather and scatter_add along one axis. The data operand's axis stride is zeroed in the indexer,
// so each element finds its partner as base + index * axis_stride (as src/backend/cpu/index.cpp).
// scatter_add accumulates with atomics, so float sums may add in another order than the CPU's.
#include <cstdint>

#include "backend/cuda/common.cuh"

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

}  // namespace

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

}  // namespace braid::detail::cuda
