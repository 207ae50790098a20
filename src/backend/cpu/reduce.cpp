// Reductions over any set of axes into the keepdim-shaped out. Two loops: the K loop walks the
// outputs (kept axes), the R loop walks one output's inputs (reduced axes). When the reduced run is
// contiguous (row sums) each output is reduced with 8 independent accumulators, which GCC
// vectorises; when the kept innermost axis is contiguous (column sums, bias gradients) a block of
// outputs is accumulated row by row. Few outputs with many inputs split the inputs over threads.
#include <omp.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/internal.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {
namespace {

template <typename T>
bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return x != x;
  else
    return false;
}

// Floats accumulate in double, so that a float32 sum of millions of terms keeps float precision;
// integers and bools in uint64, which wraps like int64 without undefined overflow.
template <typename T>
using WideAcc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;

template <typename T>
struct SumR {
  using Acc = WideAcc<T>;
  static constexpr int kLanes = 8;  // partial sums in reduce_run: the rounding of float sums depends on it
  static Acc init() { return Acc(0); }
  static Acc step(Acc a, T x) { return a + static_cast<Acc>(x); }
  static Acc combine(Acc a, Acc b) { return a + b; }
  static T finish(Acc a) { return static_cast<T>(a); }
};

template <typename T>
struct ProdR {
  using Acc = WideAcc<T>;
  static constexpr int kLanes = 8;
  static Acc init() { return Acc(1); }
  static Acc step(Acc a, T x) { return a * static_cast<Acc>(x); }
  static Acc combine(Acc a, Acc b) { return a * b; }
  static T finish(Acc a) { return static_cast<T>(a); }
};

// Max and Min propagate NaN: a NaN x is taken (every comparison with it is false) and a NaN
// accumulator is kept. Written with the accumulator first, the form GCC vectorises.
template <typename T>
struct MaxR {
  using Acc = T;
  static constexpr int kLanes = 32;  // exact in any order: enough independent chains to hide the latency
  static Acc init() {
    if constexpr (std::is_floating_point_v<T>)
      return -std::numeric_limits<T>::infinity();
    else
      return std::numeric_limits<T>::lowest();
  }
  static Acc step(Acc a, T x) { return (a > x) | is_nan(a) ? a : x; }
  static Acc combine(Acc a, Acc b) { return step(a, b); }
  static T finish(Acc a) { return a; }
};

template <typename T>
struct MinR {
  using Acc = T;
  static constexpr int kLanes = 32;
  static Acc init() {
    if constexpr (std::is_floating_point_v<T>)
      return std::numeric_limits<T>::infinity();
    else
      return std::numeric_limits<T>::max();
  }
  static Acc step(Acc a, T x) { return (a < x) | is_nan(a) ? a : x; }
  static Acc combine(Acc a, Acc b) { return step(a, b); }
  static T finish(Acc a) { return a; }
};

// Reduces x (n, stride s) into acc; contiguous runs through R::kLanes independent partial results.
template <typename R, typename T>
typename R::Acc reduce_run(typename R::Acc acc, const T* x, int64_t s, int64_t n) {
  using Acc = typename R::Acc;
  constexpr int kLanes = R::kLanes;
  if (s == 1 && n >= 2 * kLanes) {
    Acc lanes[kLanes];
    for (Acc& l : lanes) l = R::init();
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lanes[k] = R::step(lanes[k], x[i + k]);
    for (; i < n; ++i) acc = R::step(acc, x[i]);
    for (const Acc& l : lanes) acc = R::combine(acc, l);
  } else {
    for (int64_t i = 0; i < n; ++i) acc = R::step(acc, x[i * s]);
  }
  return acc;
}

template <typename R, typename T>
class Reduction {
 public:
  using Acc = typename R::Acc;

  Reduction(const Tensor& x, const StridedLoop& kloop, const StridedLoop& rloop) : kloop_(kloop), rloop_(rloop), x_(x) {
    // Column mode when the reduced run is not contiguous but the run of outputs is.
    column_ = rloop.inner_stride(0) != 1 && kloop.inner_stride(1) == 1;
  }

  /// Reduces inputs [rb, re) of the R loop for the outputs of one K-loop run: (n) outputs at p[0]
  /// (type D: T, or Acc for partial results) with stride s[0], their first inputs at p[1], stride s[1].
  template <typename D>
  void run(char* const* p, const int64_t* s, int64_t n, int64_t rb, int64_t re) const {
    D* out = reinterpret_cast<D*>(p[0]);
    const int64_t xs = s[1] * static_cast<int64_t>(sizeof(T));
    if (!column_) {
      const int64_t rs = rloop_.inner_stride(0);
      for (int64_t i = 0; i < n; ++i) {
        Acc acc = R::init();
        char* base = p[1] + i * xs;
        if (rloop_.ndim() == 1) {  // one run per output (the common case): no walker
          acc = reduce_run<R>(acc, reinterpret_cast<const T*>(base) + rb * rs, rs, re - rb);
        } else {
          rloop_.run_range(&base, rb, re, [&acc](char* const* q, const int64_t* qs, int64_t m) {
            acc = reduce_run<R>(acc, reinterpret_cast<const T*>(q[0]), qs[0], m);
          });
        }
        out[i * s[0]] = store<D>(acc);
      }
      return;
    }
    constexpr int64_t kBlock = 256;
    Acc acc[kBlock];
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t m = std::min(kBlock, n - j0);
      for (int64_t j = 0; j < m; ++j) acc[j] = R::init();
      char* base = p[1] + j0 * xs;
      rloop_.run_range(&base, rb, re, [&acc, m](char* const* q, const int64_t* qs, int64_t len) {
        for (int64_t r = 0; r < len; ++r) {
          const T* __restrict row = reinterpret_cast<const T*>(q[0]) + r * qs[0];
          for (int64_t j = 0; j < m; ++j) acc[j] = R::step(acc[j], row[j]);  // (m) contiguous outputs
        }
      });
      for (int64_t j = 0; j < m; ++j) out[(j0 + j) * s[0]] = store<D>(acc[j]);
    }
  }

  void operator()(const Tensor& out) const {
    const int64_t nout = kloop_.numel(), nred = rloop_.numel();
    const int nt = get_num_threads();
    const bool few_outputs =
        nout <= 64 * static_cast<int64_t>(nt) && nred > kParallelGrain / std::max<int64_t>(nout, 1);
    if (nt <= 1 || !few_outputs || omp_in_parallel()) {
      kloop_.run([this, nred](char* const* p, const int64_t* s, int64_t n) { run<T>(p, s, n, 0, nred); }, nred);
      return;
    }
    // Each thread reduces a slice of the inputs of every output into its own partial results.
    // (nt, nout); a unique_ptr rather than a vector, since vector<bool> has no data().
    auto partial = std::make_unique<Acc[]>(static_cast<size_t>(nt * nout));
    std::fill_n(partial.get(), nt * nout, R::init());
    StridedLoop ploop(out.shape(), {LoopOperand{reinterpret_cast<char*>(partial.get()), out.strides().data(),
                                                static_cast<int64_t>(sizeof(Acc))},
                                    loop_operand(x_)});
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), count = omp_get_num_threads();
      const int64_t rb = nred * t / count, re = nred * (t + 1) / count;
      char* base[2] = {reinterpret_cast<char*>(partial.get() + t * nout), ploop.base()[1]};
      ploop.run_range(base, 0, nout, [&](char* const* p, const int64_t* s, int64_t n) { run<Acc>(p, s, n, rb, re); });
    }
    T* o = static_cast<T*>(out.raw_data());
    for (int64_t i = 0; i < nout; ++i) {
      Acc acc = partial[i];
      for (int t = 1; t < nt; ++t) acc = R::combine(acc, partial[t * nout + i]);
      o[i] = R::finish(acc);
    }
  }

 private:
  template <typename D>
  static D store(Acc acc) {
    if constexpr (std::is_same_v<D, T>)
      return R::finish(acc);
    else
      return acc;
  }

  const StridedLoop& kloop_;
  const StridedLoop& rloop_;
  const Tensor& x_;
  bool column_ = false;
};

// First occurrence of the extreme along axis; a NaN counts as the extreme, as in PyTorch.
template <typename T, bool kMax>
void arg_reduce(const Tensor& x, int64_t axis, const Tensor& out) {
  const int64_t len = x.shape()[axis], stride = x.strides()[axis];
  BRAID_CHECK(len > 0, kMax ? "argmax" : "argmin", ": cannot reduce an empty axis");
  StridedLoop loop(out.shape(), {loop_operand(out), loop_operand(x)});
  loop.run(
      [len, stride](char* const* p, const int64_t* s, int64_t n) {
        int64_t* o = reinterpret_cast<int64_t*>(p[0]);
        for (int64_t i = 0; i < n; ++i) {
          const T* v = reinterpret_cast<const T*>(p[1]) + i * s[1];  // (len) with stride
          T best = v[0];
          int64_t at = 0;
          for (int64_t k = 1; k < len && !is_nan(best); ++k) {
            const T c = v[k * stride];
            if ((kMax ? c > best : c < best) || is_nan(c)) {
              best = c;
              at = k;
            }
          }
          o[i * s[0]] = at;
        }
      },
      len);
}

template <typename R, typename T>
void reduce_with(const Tensor& x, const Shape& rshape, const Tensor& out) {
  StridedLoop kloop(out.shape(), {loop_operand(out), loop_operand(x)});
  StridedLoop rloop(rshape, {loop_operand(x)});
  if (rloop.numel() == 0) {  // an empty reduction gives the identity (sum 0, prod 1)
    T* o = static_cast<T*>(out.raw_data());
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = R::finish(R::init());
    return;
  }
  if (kloop.numel() == 0) return;
  Reduction<R, T>(x, kloop, rloop)(out);
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "argmax", "argmin"};
  const char* name = kNames[static_cast<int>(op)];
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  if (out.numel() == 0) return;
  BRAID_ASSERT(out.is_contiguous() && out.dtype() == (arg ? kInt64 : x.dtype()) && out.dim() == x.dim(), name,
               ": out must be contiguous, keepdim-shaped and of the result dtype");
  // rshape: x's shape over the reduced axes, 1 over the kept ones (the R loop's shape).
  Shape rshape(x.shape().size(), 1);
  for (int64_t a : axes) rshape[a] = x.shape()[a];
  if (arg) BRAID_ASSERT(axes.size() == 1, name, " reduces exactly one axis");
  if (is_half(x.dtype())) {  // Note [Half arithmetic]: accumulated in float32, rounded once
    const Tensor f = arg ? out : new_tensor(out.shape(), kFloat32, out.device());
    reduce(op, widen_to_float32(x), axes, f);
    if (!arg) copy(f, out);
    return;
  }
  dispatch_compute(x.dtype(), name, [&]<typename T>() {
    switch (op) {
      case ReduceOp::Sum:
        return reduce_with<SumR<T>, T>(x, rshape, out);
      case ReduceOp::Prod:
        return reduce_with<ProdR<T>, T>(x, rshape, out);
      case ReduceOp::Max:
        return reduce_with<MaxR<T>, T>(x, rshape, out);
      case ReduceOp::Min:
        return reduce_with<MinR<T>, T>(x, rshape, out);
      case ReduceOp::ArgMax:
        return arg_reduce<T, true>(x, axes[0], out);
      case ReduceOp::ArgMin:
        return arg_reduce<T, false>(x, axes[0], out);
    }
  });
}

namespace {

// The minimum and maximum of x[0, n) in 64 lanes of vector min/max (a compiler does not reorder a
// float min reduction by itself), with NaN counted apart (a NaN wins at the end, as in amin and
// amax); one clone per vector width (Note [Vector clones]).
BRAID_VECTOR_CLONES void min_max_range(const float* x, int64_t n, float* lo, float* hi, int* nan) {
  constexpr int kLanes = 64;  // four vector registers at AVX-512 width, so that no comparison waits on the last
  float mn[kLanes], mx[kLanes], bad[kLanes];  // bad: 1 where a lane met NaN
  for (int l = 0; l < kLanes; ++l) {
    mn[l] = std::numeric_limits<float>::infinity();
    mx[l] = -std::numeric_limits<float>::infinity();
    bad[l] = 0;
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float v = x[i + l];
      mn[l] = select(v < mn[l], v, mn[l]);
      mx[l] = select(v > mx[l], v, mx[l]);
      bad[l] = select(v != v, 1.0f, bad[l]);
    }
  for (; i < n; ++i) {
    mn[0] = select(x[i] < mn[0], x[i], mn[0]);
    mx[0] = select(x[i] > mx[0], x[i], mx[0]);
    bad[0] = select(x[i] != x[i], 1.0f, bad[0]);
  }
  for (int l = 1; l < kLanes; ++l) {
    mn[0] = select(mn[l] < mn[0], mn[l], mn[0]);
    mx[0] = select(mx[l] > mx[0], mx[l], mx[0]);
    bad[0] = select(bad[l] != 0, 1.0f, bad[0]);
  }
  *lo = mn[0], *hi = mx[0], *nan = bad[0] != 0;
}

}  // namespace

// Each thread's share of a range (min_max_range over its part of n values), and the whole.
struct Ranges {
  static constexpr int kMaxParts = 64;
  float lo[kMaxParts], hi[kMaxParts];
  int nan[kMaxParts];
  int parts = 1;
  void take(const float* x, int64_t n, int t, int count) {
    const int64_t begin = n * t / count, end = n * (t + 1) / count;
    min_max_range(x + begin, end - begin, &lo[t], &hi[t], &nan[t]);
    if (t == 0) parts = count;
  }
  // The minimum and maximum of all parts, both NaN where one met a NaN.
  std::pair<float, float> whole() const {
    float mn = lo[0], mx = hi[0];
    int bad = nan[0];
    for (int t = 1; t < parts; ++t) {
      mn = std::min(mn, lo[t]);
      mx = std::max(mx, hi[t]);
      bad |= nan[t];
    }
    if (bad) mn = mx = std::numeric_limits<float>::quiet_NaN();
    return {mn, mx};
  }
};

bool CpuBackend::aminmax(const Tensor& x, const Tensor& lo, const Tensor& hi) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous() || x.numel() == 0) return false;
  const float* px = x.data<float>();
  const int64_t n = x.numel();
  const int nt = n > kParallelGrain && !omp_in_parallel() ? std::min(get_num_threads(), Ranges::kMaxParts) : 1;
  Ranges r;
  in_team(nt, [&](int t, int parts) { r.take(px, n, t, parts); });
  const auto [mn, mx] = r.whole();
  *lo.data<float>() = mn;
  *hi.data<float>() = mx;
  return true;
}

// DynamicQuantizeLinear in one team: each thread's minimum and maximum, then, from the combined
// range, the scale and zero point (every thread the same numbers) and each thread's share of the
// values (quantize's kernel), where aminmax and quantize would take a team each and the ops between
// them four small tensors.
bool CpuBackend::dynamic_quantize(const Tensor& x, const Tensor& out, float& scale, int64_t& zero) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous() || x.numel() == 0 || out.dtype() != kUInt8 ||
      !out.is_contiguous())
    return false;
  const float* px = x.data<float>();
  uint8_t* py = out.data<uint8_t>();
  const int64_t n = x.numel();
  const int nt = 4 * n > kParallelGrain && !omp_in_parallel() ? std::min(get_num_threads(), Ranges::kMaxParts) : 1;
  Ranges r;
  float s = 0;
  int64_t z = 0;
  in_team(nt, [&](int t, int parts) {
    r.take(px, n, t, parts);
#pragma omp barrier
    const auto [mn, mx] = r.whole();
    const int64_t begin = n * t / parts, end = n * (t + 1) / parts;
    float ts;
    int64_t tz;
    dynamic_quantize_params(mn, mx, ts, tz);
    quantize_u8(px + begin, py + begin, end - begin, ts, static_cast<float>(tz));
    if (t == 0) s = ts, z = tz;
  });
  scale = s;
  zero = z;
  return true;
}

}  // namespace braid::detail
