// The CPU's fused primitives (Note [Fused kernels] in backend/backend.h). Adam's update is one
// pass over the parameter, its gradient and its two or three state tensors, where the composite in
// src/optim/adam.cpp makes thirteen; its arithmetic is the composite's, operation for operation and
// rounded to the parameter's dtype at the same points, so the two agree bit for bit. BatchNorm's
// statistics, gradient sums and per-channel affine maps (src/ops/norm.cpp) are one pass each,
// accumulating in double as the composite's reductions do.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"
#include "core/knob_read.h"

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

// BRAID_CPU_FUSED=0 turns these primitives off, so that the ops compose what they compute: the path
// every backend without them takes, tested on the CPU in CI (tests/meson.build, the *_composite runs).
// A CompositeOnly guard does the same on its thread, so that one test compares each fused kernel
// with its composite (tests/test_fused_values.cpp).
namespace {
thread_local int composite_only = 0;
}  // namespace

bool fused_on() {
  static const bool on = detail::knob_flag("BRAID_CPU_FUSED");
  return on && composite_only == 0;
}

bool composite_only_active() { return composite_only != 0; }
CompositeOnly::CompositeOnly() { ++composite_only; }
CompositeOnly::~CompositeOnly() { --composite_only; }

namespace {

// The channels of x (N, C, S) are the unit of work for the per-channel sums; (n, c) rows for maps.
struct Ncs {
  int64_t n, c, s;
};

Ncs ncs_of(const Tensor& x) { return {x.shape()[0], x.shape()[1], x.shape()[2]}; }

int threads_over(int64_t units, int64_t work) {
  return work > kParallelGrain && !omp_in_parallel() ? static_cast<int>(std::min<int64_t>(units, get_num_threads()))
                                                     : 1;
}

// Note [Sums in lanes]
// A sum into one double waits for its previous addition at every element, a latency-bound loop that
// ran BatchNorm's statistics at a quarter of memory speed. Eight independent partial sums per row,
// added at the end, keep the adders busy and let the compiler vectorise; the order of additions is
// fixed (a function of the row length only), so results do not depend on threads.
constexpr int kLanes = 8;

// The sum over i < n of f(i), in double, in kLanes partial sums.
template <typename F>
double lane_sum(int64_t n, F f) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  double total = 0;
  for (; i < n; ++i) total += f(i);
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

template <typename T>
void moments_kernel(const T* x, T* mean, T* var, Ncs d) {
  const double count = static_cast<double>(d.n * d.s);
  parallel_for(threads_over(d.c, 2 * d.n * d.c * d.s), d.c, [&](int64_t c) {
    double sum = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const T* row = x + (n * d.c + c) * d.s;
      sum += lane_sum(d.s, [row](int64_t i) { return static_cast<double>(row[i]); });
    }
    const T m = static_cast<T>(sum / count);
    double sq = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const T* row = x + (n * d.c + c) * d.s;
      sq += lane_sum(d.s, [row, m](int64_t i) {
        const T centred = row[i] - m;
        return static_cast<double>(centred * centred);
      });
    }
    mean[c] = m;
    var[c] = static_cast<T>(sq / count);
  });
}

template <typename T>
void grad_sums_kernel(const T* g, const T* x, const T* mean, T* sum_g, T* sum_gxc, Ncs d) {
  parallel_for(threads_over(d.c, 2 * d.n * d.c * d.s), d.c, [&](int64_t c) {
    double sg = 0, sgx = 0;
    const T m = mean[c];
    for (int64_t n = 0; n < d.n; ++n) {
      const T* gr = g + (n * d.c + c) * d.s;
      const T* xr = x + (n * d.c + c) * d.s;
      sg += lane_sum(d.s, [gr](int64_t i) { return static_cast<double>(gr[i]); });
      sgx += lane_sum(d.s, [gr, xr, m](int64_t i) { return static_cast<double>(gr[i] * (xr[i] - m)); });
    }
    sum_g[c] = static_cast<T>(sg);
    sum_gxc[c] = static_cast<T>(sgx);
  });
}

template <typename T>
void affine_kernel(const T* a, const T* sa, const T* shift, const T* b, const T* b_mean, const T* sb, T* out, Ncs d) {
  if (d.s == 1 && b == nullptr) {
    // Channels innermost (channels-last memory as (N*H*W, C, 1)): a row of C per step, the same
    // arithmetic, in vectors along the channels.
    parallel_for(threads_over(d.n, 2 * d.n * d.c), d.n, [&](int64_t r) {
      const T* x = a + r * d.c;
      T* y = out + r * d.c;
      for (int64_t c = 0; c < d.c; ++c) y[c] = x[c] * sa[c] + shift[c];
    });
    return;
  }
  parallel_for(threads_over(d.n * d.c, 2 * d.n * d.c * d.s), d.n * d.c, [&](int64_t r) {
    const int64_t c = r % d.c, at = r * d.s;
    const T k = sa[c], t = shift[c];
    if (b) {
      const T bm = b_mean[c], kb = sb[c];
      for (int64_t i = 0; i < d.s; ++i) out[at + i] = (a[at + i] * k + t) + (b[at + i] - bm) * kb;
    } else {
      for (int64_t i = 0; i < d.s; ++i) out[at + i] = a[at + i] * k + t;
    }
  });
}

// Whether every defined tensor is contiguous and of dtype; the kernels take float32 and float64. So
// the batch-norm passes decline a float16/bfloat16 x with float32 per-channel tensors (the mixed
// dtypes of backend.h), and batch_norm_training takes its float32 detour here.
bool fusable(DType dtype, std::initializer_list<const Tensor*> ts) {
  if (!fused_on() || (dtype != kFloat32 && dtype != kFloat64)) return false;
  for (const Tensor* t : ts)
    if (t->defined() && (!t->is_contiguous() || t->dtype() != dtype)) return false;
  return true;
}

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

bool CpuBackend::channel_moments(const Tensor& x, const Tensor& mean, const Tensor& var) {
  if (x.dim() != 3 || !fusable(x.dtype(), {&x, &mean, &var})) return false;
  dispatch_compute(x.dtype(), "channel_moments", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>) moments_kernel<T>(x.data<T>(), mean.data<T>(), var.data<T>(), ncs_of(x));
  });
  return true;
}

bool CpuBackend::channel_grad_sums(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,
                                   const Tensor& sum_gxc) {
  if (x.dim() != 3 || g.shape() != x.shape() || !fusable(x.dtype(), {&g, &x, &mean, &sum_g, &sum_gxc})) return false;
  dispatch_compute(x.dtype(), "channel_grad_sums", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      grad_sums_kernel<T>(g.data<T>(), x.data<T>(), mean.data<T>(), sum_g.data<T>(), sum_gxc.data<T>(), ncs_of(x));
  });
  return true;
}

bool CpuBackend::channel_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b,
                                const Tensor& b_mean, const Tensor& sb, const Tensor& out) {
  if (a.dim() != 3 || out.shape() != a.shape() || (b.defined() && b.shape() != a.shape()) ||
      !fusable(a.dtype(), {&a, &sa, &shift, &b, &b_mean, &sb, &out}))
    return false;
  dispatch_compute(a.dtype(), "channel_affine", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      affine_kernel<T>(a.data<T>(), sa.data<T>(), shift.data<T>(), data_or_null<T>(b), data_or_null<T>(b_mean),
                       data_or_null<T>(sb), out.data<T>(), ncs_of(a));
  });
  return true;
}

namespace {
bool adam_fusable(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v) {
  return fused_on() && p.is_contiguous() && contiguous_like(g, p) && contiguous_like(m, p) && contiguous_like(v, p) &&
         (!max_v.defined() || contiguous_like(max_v, p)) && (p.dtype() == kFloat32 || p.dtype() == kFloat64);
}
}  // namespace

// The CPU's multi-tensor step is its single-tensor kernel on each parameter (a loop costs no
// launches here), after checking that it takes every one of them.
bool CpuBackend::adam_steps(const std::vector<AdamTensors>& params, const AdamStep& s) {
  for (const AdamTensors& t : params)
    if (!adam_fusable(t.p, t.g, t.m, t.v, t.max_v)) return false;
  for (const AdamTensors& t : params) adam_step(t.p, t.g, t.m, t.v, t.max_v, s);
  return true;
}

bool CpuBackend::adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                           const AdamStep& s) {
  if (!adam_fusable(p, g, m, v, max_v)) return false;
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

// quantize in one pass: the value, then the cast.
template <typename Q>
inline void quantize_range(const float* x, Q* out, int64_t n, float scale, float zero) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<Q>(static_cast<int32_t>(quantized_value<std::is_same_v<Q, int8_t>>(x[i], scale, zero)));
}
BRAID_VECTOR_CLONES void quantize_u8(const float* x, uint8_t* out, int64_t n, float scale, float zero) {
  quantize_range(x, out, n, scale, zero);
}
BRAID_VECTOR_CLONES void quantize_s8(const float* x, int8_t* out, int64_t n, float scale, float zero) {
  quantize_range(x, out, n, scale, zero);
}

BRAID_VECTOR_CLONES void fake_quantize_u8(const float* x, float* out, int64_t n, float scale, float zero) {
  fake_quantize_range<false>(x, out, n, scale, zero);
}
BRAID_VECTOR_CLONES void fake_quantize_s8(const float* x, float* out, int64_t n, float scale, float zero) {
  fake_quantize_range<true>(x, out, n, scale, zero);
}

template <typename Q>
void quantize_kernel(const float* x, Q* out, int64_t n, float scale, float zero) {
  const int nt = 4 * n > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;  // a division each
  in_team(nt, [&](int t, int parts) {
    const int64_t begin = n * t / parts, end = n * (t + 1) / parts;
    if constexpr (std::is_same_v<Q, uint8_t>)
      quantize_u8(x + begin, out + begin, end - begin, scale, zero);
    else
      quantize_s8(x + begin, out + begin, end - begin, scale, zero);
  });
}

bool CpuBackend::quantize(const Tensor& x, double scale, int64_t zero, const Tensor& out) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous()) return false;
  const float s = static_cast<float>(scale), z = static_cast<float>(zero);
  if (out.dtype() == kUInt8)
    quantize_kernel(x.data<float>(), out.data<uint8_t>(), x.numel(), s, z);
  else
    quantize_kernel(x.data<float>(), out.data<int8_t>(), x.numel(), s, z);
  return true;
}

bool CpuBackend::fake_quantize(const Tensor& x, double scale, int64_t zero, DType qtype, const Tensor& out) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous() || (qtype != kInt8 && qtype != kUInt8)) return false;
  const float s = static_cast<float>(scale), z = static_cast<float>(zero);
  const float* px = x.data<float>();
  float* py = out.data<float>();
  const int64_t n = x.numel();
  const int nt = 4 * n > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;  // a division each
  in_team(nt, [&](int t, int parts) {
    const int64_t begin = n * t / parts, end = n * (t + 1) / parts;
    if (qtype == kUInt8)
      fake_quantize_u8(px + begin, py + begin, end - begin, s, z);
    else
      fake_quantize_s8(px + begin, py + begin, end - begin, s, z);
  });
  return true;
}

// Softmax rows in one pass each (three sweeps over a row that stays in cache), with the composite's
// arithmetic: the max (NaN propagating), exp(x - max) by exp_f32, the sum in double over eight
// partial sums as the composite's reduction adds a row (reduce.cpp), and the division in float.
// Where the composite's reduction would split one long row over threads it rounds its sum
// differently: the two agree to float32 reassociation there, and bit for bit elsewhere.
// A row's max as a vector max (which any order gives: which zero wins does not matter, as
// exp(x - 0) = exp(x + 0)), with NaN counted apart and winning at the end, as in the composite.
[[gnu::always_inline]] inline float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  if (nan) m = std::numeric_limits<float>::quiet_NaN();
  return m;
}

BRAID_VECTOR_CLONES void softmax_row(const float* x, float* y, int64_t n) {
  const float m = row_max(x, n);
  for (int64_t i = 0; i < n; ++i) y[i] = exp_f32(x[i] - m);
  double acc = 0;
  int64_t i = 0;
  if (n >= 16) {
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) lanes[k] += static_cast<double>(y[i + k]);
    for (; i < n; ++i) acc += static_cast<double>(y[i]);
    for (double l : lanes) acc += l;
  } else {
    for (; i < n; ++i) acc += static_cast<double>(y[i]);
  }
  const float s = static_cast<float>(acc);
  for (int64_t j = 0; j < n; ++j) y[j] = y[j] / s;
}

bool CpuBackend::softmax_rows(const Tensor& x, const Tensor& out) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous() || x.dim() == 0) return false;
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const float* px = x.data<float>();
  float* py = out.data<float>();
  // An exponential and three sweeps per element: worth a team sooner than a plain elementwise pass.
  const int nt = 8 * x.numel() > kParallelGrain && rows > 1 && !omp_in_parallel() ? get_num_threads() : 1;
  parallel_for(nt, rows, [&](int64_t r) { softmax_row(px + r * n, py + r * n, n); });
  return true;
}

// log_softmax rows: the max as softmax_row's, s = x - m, the sum of exp(s) in double, then s -
// log(sum): three sweeps over a row that stays in cache where the composite makes six passes.
BRAID_VECTOR_CLONES void log_softmax_row(const float* x, float* y, int64_t n) {
  const float m = row_max(x, n);
  for (int64_t i = 0; i < n; ++i) y[i] = exp_f32(x[i] - m);
  const float lse = std::log(static_cast<float>(lane_sum(n, [y](int64_t i) { return static_cast<double>(y[i]); })));
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
}

// log_softmax's gradient rows: the sum of g in double, then g - exp(y) * sum.
BRAID_VECTOR_CLONES void log_softmax_backward_row(const float* g, const float* y, float* gx, int64_t n) {
  const float s = static_cast<float>(lane_sum(n, [g](int64_t i) { return static_cast<double>(g[i]); }));
  for (int64_t i = 0; i < n; ++i) gx[i] = g[i] - exp_f32(y[i]) * s;
}

bool CpuBackend::log_softmax_rows(const Tensor& x, const Tensor& out) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous() || x.dim() == 0 || x.numel() == 0) return false;
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const float* px = x.data<float>();
  float* py = out.data<float>();
  const int nt = 8 * x.numel() > kParallelGrain && rows > 1 && !omp_in_parallel() ? get_num_threads() : 1;
  parallel_for(nt, rows, [&](int64_t r) { log_softmax_row(px + r * n, py + r * n, n); });
  return true;
}

bool CpuBackend::log_softmax_backward_rows(const Tensor& g, const Tensor& y, const Tensor& gx) {
  auto f32 = [&](const Tensor& t) { return t.dtype() == kFloat32 && t.is_contiguous() && t.shape() == y.shape(); };
  if (!fused_on() || y.dim() == 0 || y.numel() == 0 || !f32(g) || !f32(y) || !f32(gx)) return false;
  const int64_t n = y.size(-1), rows = y.numel() / n;
  const float *pg = g.data<float>(), *py = y.data<float>();
  float* pgx = gx.data<float>();
  const int nt = 4 * y.numel() > kParallelGrain && rows > 1 && !omp_in_parallel() ? get_num_threads() : 1;
  parallel_for(nt, rows, [&](int64_t r) { log_softmax_backward_row(pg + r * n, py + r * n, pgx + r * n, n); });
  return true;
}

// Layer normalisation rows (Note [Fused kernels]): the mean, then the biased variance as the
// mean of the float squares (x - mean)^2, both summed in double as the composite's reductions do, and the affine in
// float in the composite's order, (x - m) * inv * w + b; three sweeps over a row that stays in cache
// instead of the composite's seven passes and temporaries. Agrees with it to float32 reassociation.
BRAID_VECTOR_CLONES void layer_norm_row(const float* x, const float* w, const float* b, float eps, float* y,
                                        float* mean, float* inv, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  const float m = static_cast<float>(s / static_cast<double>(n));
  double q = 0;
#pragma omp simd reduction(+ : q)
  for (int64_t i = 0; i < n; ++i) {
    const float d = x[i] - m;
    q += static_cast<double>(d * d);
  }
  const float r = 1.0f / std::sqrt(static_cast<float>(q / static_cast<double>(n)) + eps);
  if (w != nullptr && b != nullptr)
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * r * w[i] + b[i];
  else if (w != nullptr)
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * r * w[i];
  else if (b != nullptr)
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * r + b[i];
  else
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * r;
  if (mean != nullptr) *mean = m;
  if (inv != nullptr) *inv = r;
}

bool CpuBackend::layer_norm_rows(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,
                                 const Tensor& out, const Tensor& mean, const Tensor& inv) {
  auto f32 = [](const Tensor& t) { return !t.defined() || (t.dtype() == kFloat32 && t.is_contiguous()); };
  if (!fused_on() || n <= 0 || !f32(x) || !f32(weight) || !f32(bias) || !f32(out) || !f32(mean) || !f32(inv))
    return false;
  const int64_t rows = x.numel() / n;
  const float* px = x.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  float* py = out.data<float>();
  float* pm = mean.defined() ? mean.data<float>() : nullptr;
  float* pi = inv.defined() ? inv.data<float>() : nullptr;
  const float e = static_cast<float>(eps);
  const int nt =
      3 * x.numel() > kParallelGrain && rows > 1 && !omp_in_parallel() ? get_num_threads() : 1;  // three sweeps
  parallel_for(nt, rows, [&](int64_t r) {
    layer_norm_row(px + r * n, pw, pb, e, py + r * n, pm ? pm + r : nullptr, pi ? pi + r : nullptr, n);
  });
  return true;
}

// dequantize's composite, (float(x) - zero) * scale, in one pass.
template <typename Q>
void dequantize_kernel(const Q* x, float* out, int64_t n, float scale, float zero) {
  const int nt = n > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;
  in_team(nt, [&](int t, int parts) {
    for (int64_t i = n * t / parts, end = n * (t + 1) / parts; i < end; ++i)
      out[i] = (static_cast<float>(x[i]) - zero) * scale;
  });
}

bool CpuBackend::dequantize(const Tensor& x, double scale, int64_t zero, const Tensor& out) {
  if (!fused_on() || !x.is_contiguous()) return false;
  const float s = static_cast<float>(scale), z = static_cast<float>(zero);
  if (x.dtype() == kUInt8)
    dequantize_kernel(x.data<uint8_t>(), out.data<float>(), x.numel(), s, z);
  else if (x.dtype() == kInt8)
    dequantize_kernel(x.data<int8_t>(), out.data<float>(), x.numel(), s, z);
  else
    return false;
  return true;
}

}  // namespace braid::detail
