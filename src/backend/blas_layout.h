// How a GEMM (OpenBLAS's cblas or cuBLAS) reads a strided matrix in place: shared by the CPU and
// CUDA backends' matmul, so both read transposed views without copying under the same rule.
#pragma once

#include <algorithm>
#include <cstdint>

namespace braid::detail {

/// A (rows, cols) matrix with row stride rs and column stride cs (elements), as GEMM sees it:
/// row-major (no transpose, ld = row stride) or column-major (transposed, ld = column stride); not
/// in place otherwise (to be packed row-major, ld = cols). A size-1 axis's stride is never used.
struct BlasLayout {
  bool in_place;
  bool trans;
  int64_t ld;
};

inline BlasLayout blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const bool one_row = rows == 1, one_col = cols == 1;
  const int64_t min_row_ld = std::max<int64_t>(cols, 1), min_col_ld = std::max<int64_t>(rows, 1);
  if ((cs == 1 || one_col) && (one_row || rs >= min_row_ld)) return {true, false, one_row ? min_row_ld : rs};
  if ((rs == 1 || one_row) && (one_col || cs >= min_col_ld)) return {true, true, one_col ? min_col_ld : cs};
  return {false, false, min_row_ld};
}

}  // namespace braid::detail
