// The host entry points of the kernels that matmul.cpp and matmul_lt.cpp (built by g++, beside
// cuBLAS) call: each validates its arguments, launches on the given stream and checks the launch.
// Every other kernel is launched from its own .cu file, whose CudaBackend methods unpack the
// tensors (host.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/strided.h"

namespace braid::detail::cuda {

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

// ---- epilogue.cu ----
constexpr size_t kMaxEpilogueSteps = 8;
/// One step of matmul_epilogue's pass: out = out (+ - * /) the operand, whose `size` floats are one
/// value (1), one per column (n) or one per element (m * n, row-major); k where data is null.
struct EpilogueOperand {
  ChainStep::Kind kind;
  const float* data;
  int64_t size;
  float k;
};
struct EpilogueSteps {
  int count = 0;
  EpilogueOperand step[kMaxEpilogueSteps];
};
/// Applies the steps in order to out (m, n) float32 contiguous, each one float32 operation.
void launch_epilogue_steps(float* out, int64_t m, int64_t n, const EpilogueSteps& steps, cudaStream_t stream);

}  // namespace braid::detail::cuda
