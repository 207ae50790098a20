// Data movement primitives: copy with dtype conversion between any layouts, fill and iota, plus
// the float16/bfloat16 <-> float conversions that tensor.h declares (round to nearest even, with
// inf, NaN and subnormals kept). Copies of one contiguous block use memcpy, split over threads.
#include <omp.h>

#include <bit>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {

// Note [Half conversions]
// float -> half follows F. Giesen's float_to_half_fast3_rtne: normal results are rebiased and
// rounded with integer adds; results below 2^-14 are rounded by the FPU itself by adding 0.5f,
// whose ulp (2^-24) is the half subnormal step.
uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x47800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));  // >= 65536
  if (x < 0x38800000u) {  // below 2^-14: subnormal or zero
    const float r = std::bit_cast<float>(x) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // exponent bias 127 -> 15, and round half to even
  return static_cast<uint16_t>(sign | (x >> 13));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 0x1p-24f;  // exact: subnormal halves are multiples of 2^-24
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // keep NaN quiet
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bfloat16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

namespace {

void parallel_memcpy(void* dst, const void* src, int64_t nbytes) {
  const int nt = get_num_threads();
  if (nt <= 1 || nbytes <= 4 * kParallelGrain || omp_in_parallel()) {
    std::memcpy(dst, src, static_cast<size_t>(nbytes));
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    // Chunks of whole 64-byte lines; thread_range works in units of 16, so count in 4-byte words.
    auto [begin, end] = thread_range((nbytes + 3) / 4, omp_get_thread_num(), omp_get_num_threads());
    begin = std::min(begin * 4, nbytes);
    end = std::min(end * 4, nbytes);
    if (end > begin)
      std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                  static_cast<size_t>(end - begin));
  }
}

// Same-dtype strided copy: only the element's bytes matter, so dtypes share an unsigned type.
template <typename U>
void copy_bits(const StridedLoop& loop) {
  if (loop.ndim() >= 2 && loop.inner_size() < 64) {  // short runs: a call per block of them
    loop.run_rows([](char* const* p, const int64_t* s, int64_t n, const int64_t* outer, int64_t rows) {
      for (int64_t r = 0; r < rows; ++r) {
        U* __restrict d = reinterpret_cast<U*>(p[0] + r * outer[0]);
        const U* __restrict x = reinterpret_cast<const U*>(p[1] + r * outer[1]);
        if (s[0] == 1 && s[1] == 1) {
          for (int64_t i = 0; i < n; ++i) d[i] = x[i];
        } else {
          for (int64_t i = 0; i < n; ++i) d[i * s[0]] = x[i * s[1]];
        }
      }
    });
    return;
  }
  loop.run([](char* const* p, const int64_t* s, int64_t n) {
    U* __restrict d = reinterpret_cast<U*>(p[0]);
    const U* __restrict x = reinterpret_cast<const U*>(p[1]);
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) d[i] = x[i];
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * s[0]] = x[i * s[1]];
    }
  });
}

}  // namespace

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  BRAID_ASSERT(src.shape() == dst.shape(), "copy: shapes ", shape_str(src.shape()), " and ", shape_str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  const bool same_type = src.dtype() == dst.dtype();
  if (same_type && src.is_contiguous() && dst.is_contiguous()) {
    if (src.raw_data() != dst.raw_data()) parallel_memcpy(dst.raw_data(), src.raw_data(), n * dst.element_size());
    return;
  }
  StridedLoop loop(dst.shape(), {loop_operand(dst), loop_operand(src)});
  if (same_type) {
    switch (dst.element_size()) {
      case 1:
        return copy_bits<uint8_t>(loop);
      case 2:
        return copy_bits<uint16_t>(loop);
      case 4:
        return copy_bits<uint32_t>(loop);
      case 8:
        return copy_bits<uint64_t>(loop);
      default:
        unsupported_dtype("copy", dst.dtype());
    }
  }
  dispatch_all(dst.dtype(), "copy", [&]<typename D>() {
    dispatch_all(src.dtype(), "copy", [&]<typename S>() {
      loop.run([](char* const* p, const int64_t* s, int64_t m) {
        D* __restrict d = reinterpret_cast<D*>(p[0]);
        const S* __restrict x = reinterpret_cast<const S*>(p[1]);
        if (s[0] == 1 && s[1] == 1) {
          for (int64_t i = 0; i < m; ++i) d[i] = convert<D>(x[i]);
        } else {
          for (int64_t i = 0; i < m; ++i) d[i * s[0]] = convert<D>(x[i * s[1]]);
        }
      });
    });
  });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  StridedLoop loop(dst.shape(), {loop_operand(dst)});
  dispatch_all(dst.dtype(), "fill", [&]<typename T>() {
    const T v = convert<T>(value);
    loop.run([v](char* const* p, const int64_t* s, int64_t n) {
      T* __restrict d = reinterpret_cast<T*>(p[0]);
      if (s[0] == 1) {
        for (int64_t i = 0; i < n; ++i) d[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * s[0]] = v;
      }
    });
  });
}

void CpuBackend::iota(const Tensor& dst, double start, double step) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  BRAID_ASSERT(dst.is_contiguous(), "iota: dst must be contiguous");
  const int nt = n > kParallelGrain ? get_num_threads() : 1;
  dispatch_all(dst.dtype(), "iota", [&]<typename T>() {
    T* d = static_cast<T*>(dst.raw_data());
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = convert<T>(start + static_cast<double>(i) * step);
  });
}

}  // namespace braid::detail
