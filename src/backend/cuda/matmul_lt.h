// A matrix product as cuBLAS and cuBLASLt see it (column-major, Note [Products through cuBLASLt] in
// matmul_lt.cpp), shared by matmul.cpp (the product primitive) and matmul_lt.cpp (cuBLASLt and
// matmul_epilogue).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace braid::detail::cuda {

/// C (m, n) = op(A) (m, k) @ op(B) (k, n) for each of `batches` matrices, column-major: A, B and C
/// with leading dimensions lda, ldb, ldc and sa, sb, sc elements between batch matrices.
struct Gemm {
  cudaDataType_t ab, c;
  cublasComputeType_t compute;
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batches;
  const void* A;
  const void* B;
  void* C;
};

/// The compute type of float32 products: float32 throughout, or TF32 inputs where
/// braid::float32_matmul_precision() is "high" or "medium".
cublasComputeType_t float32_compute();

/// g through cuBLASLt on device, plus bias (m values of C's type, one per row of C: one per column
/// of braid's row-major result) when not null. False where cuBLASLt has no algorithm for it (its
/// heuristic returns none), so that the caller runs cuBLAS; any other failure throws.
bool lt_gemm(int device, const Gemm& g, const void* bias);

}  // namespace braid::detail::cuda
