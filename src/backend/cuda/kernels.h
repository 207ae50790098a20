// The CUDA kernels' host entry points: what the backend's host code (cuda_backend.cpp,
// primitives.cpp, matmul.cpp, built by g++) calls after unpacking tensors into pointers, strided
// indexers and sizes. Each is defined in the .cu file of its kind, validates the dtype (TypeError
// naming the op for one the CPU backend refuses too), launches on the given stream and checks the
// launch. Pointers are device addresses of the first element; strides and offsets are in elements.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/strided.h"

namespace braid::detail::cuda {

// ---- copy.cu ----
/// dst = convert(src) over (dst, src), any two dtypes (float16/bfloat16 included).
void launch_copy(DType dst_type, DType src_type, const Indexer<2>& ix, int64_t n, void* dst, const void* src,
                 cudaStream_t stream);
/// Every element of dst (element_size 1, 2, 4 or 8 bytes) set to the bit pattern bits.
void launch_fill(int element_size, uint64_t bits, const Indexer<1>& ix, int64_t n, void* dst, cudaStream_t stream);
/// dst[i] = convert(start + i * step) over a contiguous dst.
void launch_iota(DType type, int64_t n, void* dst, double start, double step, cudaStream_t stream);

// ---- unary.cu ----
/// out = op(x) over (out, x); out is bool for LogicalNot and IsNan, else x's dtype.
void launch_unary(UnaryOp op, DType type, const Indexer<2>& ix, int64_t n, void* out, const void* x, double p0,
                  double p1, cudaStream_t stream);

// ---- binary.cu ----
/// out = op(a, b) over (out, a, b). Integer division by zero and negative integer powers are
/// reported (ValueError, as on the CPU) after the kernel, through a flag read back from the device.
void launch_binary(BinaryOp op, DType type, const Indexer<3>& ix, int64_t n, void* out, const void* a, const void* b,
                   int device, cudaStream_t stream);
/// out = cond ? a : b over (out, cond, a, b).
void launch_where(DType type, const Indexer<4>& ix, int64_t n, void* out, const bool* cond, const void* a,
                  const void* b, cudaStream_t stream);

// ---- reduce.cu ----
/// A reduction's two index spaces: the kept positions (row-major over out's shape, which is
/// contiguous, with x's strides) and the reduced ones (x's strides over the reduced axes).
struct ReduceShape {
  Indexer<1> kept;
  Indexer<1> reduced;
  int64_t nout;
  int64_t nred;
};
void launch_reduce(ReduceOp op, DType type, const ReduceShape& shape, const void* x, void* out, int device,
                   cudaStream_t stream);
/// argmax / argmin along one axis (len elements, stride apart) for each kept position.
void launch_arg_reduce(bool is_max, DType type, const Indexer<1>& kept, int64_t nout, int64_t len, int64_t stride,
                       const void* x, int64_t* out, cudaStream_t stream);

// ---- index.cu ----
/// out = x[..index..] over (out, index, x-with-its-axis-stride-zeroed); by element size.
void launch_gather(int element_size, const Indexer<3>& ix, int64_t n, int64_t axis_stride, void* out,
                   const int64_t* index, const void* x, cudaStream_t stream);
/// out[..index..] += src over (out-with-its-axis-stride-zeroed, index, src), with atomics.
void launch_scatter_add(DType type, const Indexer<3>& ix, int64_t n, int64_t axis_stride, void* out,
                        const int64_t* index, const void* src, cudaStream_t stream);

// ---- random.cu ----
/// A contiguous out from the Philox stream, element i from block counter + i (as random.cpp).
void launch_random(RandomKind kind, DType type, int64_t n, void* out, uint64_t seed, uint64_t counter, double a,
                   double b, cudaStream_t stream);

// ---- matmul_int.cu ----
/// One operand of an integer matmul: its first element and its (rows, cols) strides.
struct IntMatrix {
  const void* data;
  int64_t rs, cs;
};
/// out (batches, m, n) contiguous = a (m, k) @ b (k, n) per batch, wrapping; int32 or int64.
/// batch maps a flat batch index (row-major over out's batch axes) to a's and b's element offsets.
void launch_int_matmul(DType type, const IntMatrix& a, const IntMatrix& b, const Indexer<2>& batch, void* out,
                       int64_t batches, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace braid::detail::cuda
