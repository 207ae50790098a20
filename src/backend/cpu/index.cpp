// gather and scatter_add along one axis (torch.gather / torch.scatter_add_). Both run a strided
// loop over the index's shape in which the data operand's axis stride is set to 0, so each run
// finds its element as base + index * axis_stride. scatter_add never lets two threads share an
// output element: threads split the positions off the axis, and each walks the whole axis itself.
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {
namespace {

// Gathering moves bytes only, so every dtype of one width shares a kernel.
template <typename U>
void gather_bits(const StridedLoop& loop, int64_t axis_stride) {
  loop.run([axis_stride](char* const* p, const int64_t* s, int64_t n) {
    U* o = reinterpret_cast<U*>(p[0]);                            // (n) outputs
    const int64_t* idx = reinterpret_cast<const int64_t*>(p[1]);  // (n) positions along the axis
    const U* x = reinterpret_cast<const U*>(p[2]);                // (n) row starts in x
    if (s[1] == 0 && s[0] == 1 && s[2] == 1) {  // one position for a contiguous run (index_select's rows)
      std::copy_n(x + idx[0] * axis_stride, n, o);
      return;
    }
    for (int64_t i = 0; i < n; ++i) o[i * s[0]] = x[i * s[2] + idx[i * s[1]] * axis_stride];
  });
}

template <typename T>
void accumulate(T& dst, T v) {
  if constexpr (std::is_same_v<T, bool>)
    dst = dst | v;
  else
    dst = wrap_add(dst, v);
}

}  // namespace

void CpuBackend::gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  BRAID_ASSERT(
      index.dtype() == kInt64 && index.shape() == out.shape() && x.dtype() == out.dtype() && x.dim() == out.dim(),
      "gather: index must be int64 of out's shape");
  Shape xs = x.strides();
  const int64_t axis_stride = xs[axis];
  xs[axis] = 0;
  StridedLoop loop(out.shape(), {loop_operand(out), loop_operand(index),
                                 LoopOperand{static_cast<char*>(x.raw_data()), xs.data(), x.element_size()}});
  switch (x.element_size()) {
    case 1:
      return gather_bits<uint8_t>(loop, axis_stride);
    case 2:
      return gather_bits<uint16_t>(loop, axis_stride);
    case 4:
      return gather_bits<uint32_t>(loop, axis_stride);
    case 8:
      return gather_bits<uint64_t>(loop, axis_stride);
    default:
      unsupported_dtype("gather", x.dtype());
  }
}

void CpuBackend::scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) {
  BRAID_ASSERT(
      index.dtype() == kInt64 && index.shape() == src.shape() && src.dtype() == out.dtype() && src.dim() == out.dim(),
      "scatter_add: index must be int64 of src's shape");
  const int64_t len = src.shape()[axis];
  if (src.numel() == 0) return;
  Shape rest = src.shape();  // the positions off the axis
  rest[axis] = 1;
  const int64_t out_stride = out.strides()[axis], idx_stride = index.strides()[axis], src_stride = src.strides()[axis];
  StridedLoop loop(rest, {loop_operand(out), loop_operand(index), loop_operand(src)});
  // Walk the axis innermost when it is src's fastest axis, else one whole slice per axis position.
  const bool axis_inner = loop.numel() == 1 || std::llabs(src_stride) < std::llabs(loop.inner_stride(2));
  dispatch_compute(src.dtype(), "scatter_add", [&]<typename T>() {
    if (axis_inner) {
      loop.run(
          [=](char* const* p, const int64_t* s, int64_t n) {
            T* o = reinterpret_cast<T*>(p[0]);
            const int64_t* idx = reinterpret_cast<const int64_t*>(p[1]);
            const T* x = reinterpret_cast<const T*>(p[2]);
            for (int64_t i = 0; i < n; ++i)
              for (int64_t a = 0; a < len; ++a)
                accumulate(o[i * s[0] + idx[i * s[1] + a * idx_stride] * out_stride], x[i * s[2] + a * src_stride]);
          },
          len);
      return;
    }
    auto slice = [=](char* const* p, const int64_t* s, int64_t n) {  // (n) positions at one axis position
      T* o = reinterpret_cast<T*>(p[0]);
      const int64_t* idx = reinterpret_cast<const int64_t*>(p[1]);
      const T* x = reinterpret_cast<const T*>(p[2]);
      for (int64_t i = 0; i < n; ++i) accumulate(o[i * s[0] + idx[i * s[1]] * out_stride], x[i * s[2]]);
    };
    const int64_t positions = loop.numel();
    const int nt = positions * len > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
      auto [begin, end] = thread_range(positions, omp_get_thread_num(), omp_get_num_threads());
      for (int64_t a = 0; a < len; ++a) {
        char* base[3] = {loop.base()[0], loop.base()[1] + a * idx_stride * 8,
                         loop.base()[2] + a * src_stride * static_cast<int64_t>(sizeof(T))};
        loop.run_range(base, begin, end, slice);
      }
    }
  });
}

}  // namespace braid::detail
