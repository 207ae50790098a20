// What every .cu file of the CUDA backend shares: launch sizes, the grid-stride elementwise kernel
// over a strided Indexer, and dtype dispatch on the host (a tag per element type, so that each
// kernel is instantiated once per dtype it supports and an unsupported one is a TypeError).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"

namespace braid::detail::cuda {

constexpr int kThreads = 256;
/// Grids stop growing here; kernels loop over the rest (grid-stride loops, 64-bit indices).
constexpr int64_t kMaxBlocks = 32768;

inline unsigned grid_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, kMaxBlocks)));
}

__device__ inline int64_t global_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }

/// f(off) for every flat index below n, off holding the N operands' element offsets.
template <int N, typename F>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(Indexer<N> ix, int64_t n, F f) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    int64_t off[N];
    ix.offsets(i, off);
    f(off);
  }
}

template <int N, typename F>
void launch_elementwise(const Indexer<N>& ix, int64_t n, const F& f, cudaStream_t stream, const char* op) {
  if (n <= 0) return;
  elementwise_kernel<N, F><<<grid_for(n), kThreads, 0, stream>>>(ix, n, f);
  check_launch(op, "elementwise_kernel");
}

/// Storage types of float16 and bfloat16 elements (bits only; converted through float).
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <typename T>
struct Tag {
  using type = T;
};

[[noreturn]] inline void unsupported_dtype(const char* op, DType t) {
  throw TypeError(cat(op, ": dtype ", dtype_name(t), " is not supported by the CUDA backend"));
}

/// f(Tag<T>{}) for the compute types (float, double, int64, int32, bool).
template <typename F>
void dispatch_compute(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32:
      return f(Tag<float>{});
    case DType::Float64:
      return f(Tag<double>{});
    case DType::Int64:
      return f(Tag<int64_t>{});
    case DType::Int32:
      return f(Tag<int32_t>{});
    case DType::Bool:
      return f(Tag<bool>{});
    default:
      break;
  }
  unsupported_dtype(op, t);
}

/// dispatch_compute plus float16 and bfloat16, which the arithmetic kernels (unary, binary, reduce)
/// load and compute in float32 and round once on the store (Note [Half arithmetic] in
/// src/backend/backend.h).
template <typename F>
void dispatch_arith(DType t, const char* op, F&& f) {
  if (t == DType::Float16) return f(Tag<F16>{});
  if (t == DType::BFloat16) return f(Tag<BF16>{});
  dispatch_compute(t, op, f);
}

/// dispatch_compute plus the storage types float16, bfloat16, int8 and uint8.
template <typename F>
void dispatch_all(DType t, const char* op, F&& f) {
  if (t == DType::Float16) return f(Tag<F16>{});
  if (t == DType::BFloat16) return f(Tag<BF16>{});
  if (t == DType::Int8) return f(Tag<int8_t>{});
  if (t == DType::UInt8) return f(Tag<uint8_t>{});
  dispatch_compute(t, op, f);
}

/// f(Tag<T>{}) for float and double only (the floating compute types).
template <typename F>
void dispatch_floating(DType t, const char* op, F&& f) {
  if (t == DType::Float32) return f(Tag<float>{});
  if (t == DType::Float64) return f(Tag<double>{});
  unsupported_dtype(op, t);
}

/// f(Tag<U>{}) with U the unsigned type of element_size bytes.
template <typename F>
void dispatch_bits(int element_size, const char* op, F&& f) {
  switch (element_size) {
    case 1:
      return f(Tag<uint8_t>{});
    case 2:
      return f(Tag<uint16_t>{});
    case 4:
      return f(Tag<uint32_t>{});
    case 8:
      return f(Tag<uint64_t>{});
    default:
      throw TypeError(cat(op, ": elements of ", element_size, " bytes are not supported by the CUDA backend"));
  }
}

}  // namespace braid::detail::cuda
