// The strided N-d loop every elementwise CPU kernel runs on. It coalesces the operands' dimensions,
// splits the flat index range over OpenMP threads when the work is large, and hands a kernel one
// run of the innermost dimension at a time, so that the kernel's inner loop is a plain indexed loop
// that GCC vectorises when every operand has stride 1.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <utility>

#include "braid/tensor.h"

namespace braid::detail {

/// A non-owning reference to a callable; cheaper to compile than std::function and never allocates.
template <typename Sig>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  // Not a copy constructor: a FunctionRef passed on is copied, not wrapped.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): passed as a lambda at every call site
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

constexpr int kMaxOperands = 4;
constexpr int kMaxLoopDims = 16;
/// The most dimensions a loop accepts before coalescing.
constexpr int kMaxRank = 64;
/// Below this many elements (times the per-element work) a loop runs on the calling thread.
constexpr int64_t kParallelGrain = 32768;

/// One operand of a loop: the address of its first element and its strides (in elements) over the
/// loop's shape. A stride of 0 broadcasts.
struct LoopOperand {
  char* data;
  const int64_t* strides;
  int64_t elem_size;
};

inline LoopOperand loop_operand(const Tensor& t) {
  return {static_cast<char*>(t.raw_data()), t.strides().data(), t.element_size()};
}

/// A kernel's view of one run: ptrs[k] is operand k's first element of the run, strides[k] its step
/// in elements, n the run length.
using RunFn = FunctionRef<void(char* const* ptrs, const int64_t* strides, int64_t n)>;
/// A block of rows: `rows` runs of n elements each, run r of operand k starting outer[k] * r bytes
/// after ptrs[k] (the loop's second-innermost dimension). For kernels whose runs are short (a
/// channels-last tensor of few channels), where a call per run would cost more than the run.
using RowsFn =
    FunctionRef<void(char* const* ptrs, const int64_t* strides, int64_t n, const int64_t* outer, int64_t rows)>;

class StridedLoop {
 public:
  StridedLoop(const Shape& shape, std::initializer_list<LoopOperand> operands);

  int64_t numel() const { return numel_; }
  /// Dimensions left after coalescing (at least 1).
  int ndim() const { return ndim_; }
  /// Operand k's step along the innermost (coalesced) dimension, in elements.
  int64_t inner_stride(int k) const { return inner_strides_[k]; }
  char* const* base() const { return base_.data(); }

  /// Calls fn on every run; in parallel when numel * work_per_element exceeds kParallelGrain.
  void run(RunFn fn, int64_t work_per_element = 1) const;
  /// Calls fn on blocks of whole runs (a run per row; one row when the loop has one dimension); in
  /// parallel as run does.
  void run_rows(RowsFn fn, int64_t work_per_element = 1) const;
  /// The length of the innermost runs.
  int64_t inner_size() const { return shape_[ndim_ - 1]; }
  /// Calls fn, on this thread, on the runs covering flat indices [begin, end), with the operands
  /// starting at base instead of at their own data.
  void run_range(char* const* base, int64_t begin, int64_t end, RunFn fn) const;

 private:
  int nops_ = 0;
  int ndim_ = 0;
  int64_t numel_ = 0;
  std::array<char*, kMaxOperands> base_{};
  // Written for the ndim_ dimensions in use only: a small op's loop is built for every call, and
  // clearing all of them was most of its cost.
  std::array<int64_t, kMaxLoopDims> shape_;                              // coalesced, outermost first
  std::array<std::array<int64_t, kMaxOperands>, kMaxLoopDims> bytes_;    // byte strides [dim][operand]
  std::array<int64_t, kMaxOperands> inner_strides_{};                    // element strides of the last dim
};

/// Runs body(t, parts) on every thread of a team of nt (an OpenMP parallel region), or as body(0, 1)
/// on this thread alone when nt is 1: a region costs about a quarter of a microsecond even for one
/// thread, which a small op at batch 1 notices.
template <typename F>
void in_team(int nt, const F& body) {
  if (nt <= 1) {
    body(0, 1);
    return;
  }
#pragma omp parallel num_threads(nt)
  body(omp_get_thread_num(), omp_get_num_threads());
}

/// body(i) for every i in [0, n), in static chunks on a team of nt, or in a plain loop on this
/// thread when nt is 1 (no region: see in_team).
template <typename F>
void parallel_for(int nt, int64_t n, const F& body) {
  if (nt <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

/// [begin, end) of thread t of nt over n items, in chunks that are multiples of 16 elements so
/// that two threads rarely write one cache line.
inline std::pair<int64_t, int64_t> thread_range(int64_t n, int t, int nt) {
  int64_t chunk = (n + nt - 1) / nt;
  chunk = (chunk + 15) / 16 * 16;
  int64_t begin = std::min<int64_t>(n, chunk * t);
  return {begin, std::min<int64_t>(n, begin + chunk)};
}

}  // namespace braid::detail
