// Random fills from the Philox-4x32-10 counter-based generator. Element i of out (row-major) uses
// block counter + i alone, so a draw is the same at any thread count and the generator's state is
// just (seed, counter); the ops layer advances the counter by out's numel per draw.
#include <cmath>
#include <cstdint>
#include <numbers>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loop.h"
#include "backend/philox.h"
#include "braid/parallel.h"

namespace braid::detail {
namespace {

using Block = PhiloxBlock;

// Calls out[i] = f(philox(counter + i)) over a contiguous out, in parallel when large.
template <typename T, typename F>
void generate(const Tensor& out, uint64_t seed, uint64_t counter, F f) {
  T* o = static_cast<T*>(out.raw_data());
  const int64_t n = out.numel();
  const int nt = n > kParallelGrain / 8 ? get_num_threads() : 1;  // ~10 rounds per element: worth threads sooner
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = f(philox(counter + static_cast<uint64_t>(i), seed));
}

}  // namespace

void CpuBackend::random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) {
  if (out.numel() == 0) return;
  BRAID_ASSERT(out.is_contiguous(), "random: out must be contiguous");
  dispatch_all(out.dtype(), "random", [&]<typename T>() {
    if (kind == RandomKind::Bernoulli) {  // any dtype; u = lane0 / 2^32 exactly
      return generate<T>(out, seed, counter,
                         [a](Block r) { return convert<T>(static_cast<double>(r.v[0]) * 0x1p-32 < a ? 1.0 : 0.0); });
    }
    if constexpr (std::is_same_v<T, double>) {
      if (kind == RandomKind::Uniform)
        return generate<T>(out, seed, counter, [a, b](Block r) { return a + philox_unit53(r.v[0], r.v[1]) * (b - a); });
      return generate<T>(out, seed, counter, [a, b](Block r) {  // Box-Muller, cos branch; u1 in (0, 1]
        const double u1 = philox_unit53(r.v[0], r.v[1]) + 0x1p-53, u2 = philox_unit53(r.v[2], r.v[3]);
        return a + b * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      });
    } else if constexpr (std::is_floating_point_v<T> || kIsHalfType<T>) {  // computed in float
      const float fa = static_cast<float>(a), fb = static_cast<float>(b);
      if (kind == RandomKind::Uniform)
        return generate<T>(out, seed, counter, [a, b](Block r) {
          return convert<T>(static_cast<float>(a + static_cast<double>(r.v[0] >> 8) * 0x1p-24 * (b - a)));
        });
      return generate<T>(out, seed, counter, [fa, fb](Block r) {
        const float u1 = static_cast<float>((static_cast<double>(r.v[0]) + 1.0) * 0x1p-32);  // (0, 1]
        const float u2 = static_cast<float>(r.v[1] >> 8) * 0x1p-24f;                         // [0, 1)
        const float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(2.0f * std::numbers::pi_v<float> * u2);
        return convert<T>(fa + fb * z);
      });
    } else if constexpr (kIsInt<T>) {
      BRAID_CHECK_T(TypeError, kind == RandomKind::Uniform, "random: normal samples need a floating dtype, got ",
                    dtype_name(out.dtype()));
      return generate<T>(out, seed, counter, [a, b](Block r) {  // integers uniform on [a, b)
        const double v = std::floor(a + philox_unit53(r.v[0], r.v[1]) * (b - a));
        return convert<T>(v < b ? v : b - 1);
      });
    } else {
      unsupported_dtype(kind == RandomKind::Uniform ? "uniform" : "normal", out.dtype());
    }
  });
}

}  // namespace braid::detail
