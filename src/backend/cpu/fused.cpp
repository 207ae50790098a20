// The CPU's fused optimizer step (Note [Optional primitives] in backend/backend.h): Adam's update as
// one pass over the parameter, its gradient and its two or three state tensors, where the composite
// in src/optim/adam.cpp makes thirteen. The arithmetic is the composite's, operation for operation
// and rounded to the parameter's dtype at the same points, so the two agree bit for bit.
#include <omp.h>

#include <cmath>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {
namespace {

// p, g, m, v (and mv, the amsgrad maximum, when kAmsgrad) of n elements each.
template <typename T, bool kAmsgrad>
void adam_kernel(T* p, const T* g, T* m, T* v, T* mv, int64_t n, const AdamStep& s) {
  // The composite's numbers, each a tensor of the parameter's dtype there.
  const T decay = static_cast<T>(s.decay), beta1 = static_cast<T>(s.beta1), beta2 = static_cast<T>(s.beta2);
  const T one_minus_beta1 = static_cast<T>(1 - s.beta1), one_minus_beta2 = static_cast<T>(1 - s.beta2);
  const T sqrt_bc2 = static_cast<T>(s.sqrt_bias_correction2), eps = static_cast<T>(s.eps);
  const T neg_step = static_cast<T>(-s.step_size);
  const bool decays = s.decay != 1;
  const int nt = 3 * n > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;
#pragma omp parallel for simd num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T pi = decays ? p[i] * decay : p[i];
    const T gi = g[i];
    const T mi = m[i] * beta1 + gi * one_minus_beta1;
    const T vi = v[i] * beta2 + (gi * gi) * one_minus_beta2;
    m[i] = mi;
    v[i] = vi;
    T si = vi;
    if constexpr (kAmsgrad) {
      const T a = mv[i];
      si = (a > vi) | (a != a) ? a : vi;  // NaN wins, as the composite's maximum
      mv[i] = si;
    }
    p[i] = pi + (mi / (std::sqrt(si) / sqrt_bc2 + eps)) * neg_step;
  }
}

bool contiguous_like(const Tensor& t, const Tensor& p) {
  return t.is_contiguous() && t.dtype() == p.dtype() && t.shape() == p.shape();
}

}  // namespace

bool CpuBackend::adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                           const AdamStep& s) {
  if (!p.is_contiguous() || !contiguous_like(g, p) || !contiguous_like(m, p) || !contiguous_like(v, p) ||
      (max_v.defined() && !contiguous_like(max_v, p)))
    return false;
  if (p.dtype() != kFloat32 && p.dtype() != kFloat64) return false;
  dispatch_compute(p.dtype(), "adam_step", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>) {
      if (max_v.defined())
        adam_kernel<T, true>(p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(), max_v.data<T>(), p.numel(), s);
      else
        adam_kernel<T, false>(p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(), nullptr, p.numel(), s);
    }
  });
  return true;
}

}  // namespace braid::detail
