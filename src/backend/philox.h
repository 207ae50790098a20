// The Philox-4x32-10 block function and the 53-bit uniform, shared by the CPU backend
// (src/backend/cpu/random.cpp) and the CUDA backend's kernels (src/backend/cuda/random.cu), so
// that every device draws the same bits for the same (seed, counter) by construction.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BRAID_HOST_DEVICE __host__ __device__
#else
#define BRAID_HOST_DEVICE
#endif

namespace braid::detail {

struct PhiloxBlock {
  uint32_t v[4];
};

// Note [Philox]
// Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11), with the Random123
// constants; the key is the seed's two 32-bit halves, the counter (block, 0, 0) in 32-bit words.
BRAID_HOST_DEVICE inline PhiloxBlock philox(uint64_t block, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0, p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// Uniform on [0, 1) from the top 53 bits of two words (exact).
BRAID_HOST_DEVICE inline double philox_unit53(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * 0x1p-53;
}

}  // namespace braid::detail
