// Random fills from Philox-4x32-10, the same stream as src/backend/cpu/random.cpp: element i of a
// contiguous out uses block counter + i alone, so a draw is the same on every device. The bits, and
// uniform, bernoulli and integer draws derived from them by exact arithmetic, equal the CPU's bit
// for bit; every rounding step is an explicit _rn intrinsic so that no multiply-add is fused.
// Normal draws go through log and cos, whose CUDA versions may differ from glibc's in the last ulp.
// The CudaBackend methods, which unpack the tensors for them (host.h), follow the kernels.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"
#include "backend/philox.h"

namespace braid::detail::cuda {
namespace {

using Block = PhiloxBlock;  // Note [Philox] in src/backend/philox.h

__device__ constexpr double kPi = 3.14159265358979323846;
constexpr float kPiF = 3.14159265358979323846f;

template <typename T>
__device__ T sample(RandomKind kind, const Block& r, double a, double b) {
  if (kind == RandomKind::Bernoulli)  // any dtype; u = lane0 / 2^32 exactly
    return convert<T>(static_cast<double>(r.v[0]) * 0x1p-32 < a ? 1.0 : 0.0);
  if constexpr (std::is_same_v<T, double>) {
    if (kind == RandomKind::Uniform) return __dadd_rn(a, __dmul_rn(philox_unit53(r.v[0], r.v[1]), __dsub_rn(b, a)));
    const double u1 = philox_unit53(r.v[0], r.v[1]) + 0x1p-53, u2 = philox_unit53(r.v[2], r.v[3]);  // u1 in (0, 1]
    const double radius = sqrt(__dmul_rn(-2.0, log(u1)));
    return __dadd_rn(a, __dmul_rn(__dmul_rn(b, radius), cos(__dmul_rn(2.0 * kPi, u2))));
  } else if constexpr (std::is_same_v<T, float> || kIsHalf<T>) {  // computed in float
    if (kind == RandomKind::Uniform) {
      const double u = static_cast<double>(r.v[0] >> 8) * 0x1p-24;  // exact
      return convert<T>(__double2float_rn(__dadd_rn(a, __dmul_rn(u, __dsub_rn(b, a)))));
    }
    const float u1 = __double2float_rn((static_cast<double>(r.v[0]) + 1.0) * 0x1p-32);  // (0, 1]
    const float u2 = static_cast<float>(r.v[1] >> 8) * 0x1p-24f;                        // [0, 1), exact
    const float z = __fmul_rn(sqrtf(__fmul_rn(-2.0f, logf(u1))), cosf(__fmul_rn(2.0f * kPiF, u2)));
    return convert<T>(__fadd_rn(__double2float_rn(a), __fmul_rn(__double2float_rn(b), z)));
  } else {  // integers uniform on [a, b); the host refused normal
    const double v = floor(__dadd_rn(a, __dmul_rn(philox_unit53(r.v[0], r.v[1]), __dsub_rn(b, a))));
    return convert<T>(v < b ? v : __dsub_rn(b, 1.0));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    random_kernel(RandomKind kind, T* out, int64_t n, uint64_t seed, uint64_t counter, double a, double b) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    out[i] = sample<T>(kind, philox(counter + static_cast<uint64_t>(i), seed), a, b);
}

void launch_random(RandomKind kind, DType type, int64_t n, void* out, uint64_t seed, uint64_t counter, double a,
                   double b, cudaStream_t stream) {
  if (n <= 0) return;
  // The CPU's refusals: normal needs a floating dtype, and bool takes only bernoulli.
  if (kind != RandomKind::Bernoulli) {
    BRAID_CHECK_T(TypeError, kind == RandomKind::Uniform || is_floating(type) || type == DType::Bool,
                  "random: normal samples need a floating dtype, got ", dtype_name(type));
    if (type == DType::Bool) unsupported_dtype(kind == RandomKind::Uniform ? "uniform" : "normal", type);
  }
  dispatch_all(type, "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(kind, static_cast<T*>(out), n, seed, counter, a, b);
    check_launch("random", "random_kernel");
  });
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) {
  if (out.numel() == 0) return;
  BRAID_ASSERT(out.is_contiguous(), "random: out must be contiguous");
  cuda::Launch l("random", out, {});
  cuda::launch_random(kind, out.dtype(), out.numel(), cuda::ptr(out), seed, counter, a, b, l.stream);
}

}  // namespace braid::detail
