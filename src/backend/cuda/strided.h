// The strided indexer every elementwise CUDA kernel runs on: a tensor shape with up to four
// operands' element strides, coalesced on the host (as the CPU's StridedLoop coalesces) and passed
// to kernels by value, so that thread i finds each operand's element from its flat index alone.
// Shared by host code (built by g++; strided_host.h fills it) and device code.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif

namespace braid::detail::cuda {

/// Dimensions left after coalescing; more need a contiguous() first (as on the CPU).
constexpr int kMaxDims = 16;

/// N operands over one shape: dims innermost first, strides in elements (0 broadcasts, any sign).
template <int N>
struct Indexer {
  int ndim = 0;         // 0: a single element
  bool narrow = false;  // every flat index fits 32 bits, so the divisions can be 32-bit ones
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims][N] = {};

  /// off[k] = operand k's element offset of flat (row-major over the coalesced shape) index i.
  BRAID_HD void offsets(int64_t i, int64_t (&off)[N]) const {
    if (ndim == 1) {  // contiguous, 1-d strided and scalar-broadcast operands: no division
      for (int k = 0; k < N; ++k) off[k] = i * strides[0][k];
      return;
    }
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = 0; d < ndim; ++d) {
      int64_t q, r;
      if (narrow) {
        const auto i32 = static_cast<uint32_t>(i), s32 = static_cast<uint32_t>(sizes[d]);
        q = i32 / s32;
        r = i32 - static_cast<uint32_t>(q) * s32;
      } else {
        q = i / sizes[d];
        r = i - q * sizes[d];
      }
      for (int k = 0; k < N; ++k) off[k] += r * strides[d][k];
      i = q;
    }
  }

  /// Operand 0's offset alone (the common one-operand case).
  BRAID_HD int64_t offset(int64_t i) const {
    int64_t off[N];
    offsets(i, off);
    return off[0];
  }
};

}  // namespace braid::detail::cuda
