// 2-d max and average pooling (and average pooling's adjoint) over (N, C, h, w) planes. Threads
// split the N * C planes, so each writes only its own planes. Max pooling's backward is a
// scatter_add through the indices it returns, so it needs no kernel here.
#include <omp.h>

#include <vector>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "core/internal.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {
namespace {

int threads_for(int64_t work) { return work > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1; }

// Note [2x2 max pooling in two passes]
// The 2x2 window of stride 2 without padding or dilation, the pooling of most CNNs: every window is
// inside the plane, so the taps need no bounds. Taken one output at a time (four taps, three
// dependent selects) it was a fifth of the model zoo's CNN step, four times what two passes take
// (measured: benchmarks/README.md, What changed what, CPU training steps). For float32 planes of even width it runs in two passes over
// each plane instead: first the pairs along every row (the larger of x[2i] and x[2i + 1], and which),
// one flat loop over the plane that the compiler vectorises, then the two rows of each window. The
// taps meet in row-major order either way, the first largest winning a tie and the last NaN
// winning over numbers (PyTorch's rule), so values and positions are the same as one output at a
// time: the second of a pair wins exactly where it would win against the first, and the lower row
// of a window wins exactly where its pair's winner would beat every tap above it.
BRAID_VECTOR_CLONES void max_pool_2x2_plane(const float* x, float* out, int64_t* at, int64_t h, int64_t w, int64_t oh,
                                            float* pair, int32_t* second) {
  const int64_t ow = w / 2, pairs = h * ow;
  for (int64_t i = 0; i < pairs; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    const bool m = (b > a) | (b != b);
    pair[i] = select(m, b, a);
    second[i] = m;
  }
  for (int64_t oy = 0; oy < oh; ++oy) {
    const float* p0 = pair + 2 * oy * ow;
    const float* p1 = p0 + ow;
    const int32_t* s0 = second + 2 * oy * ow;
    const int32_t* s1 = s0 + ow;
    float* o = out + oy * ow;
    int64_t* a = at + oy * ow;
    const int64_t top = 2 * oy * w;
    for (int64_t ox = 0; ox < ow; ++ox) {
      const float u = p0[ox], v = p1[ox];
      const bool m = (v > u) | (v != v);
      o[ox] = select(m, v, u);
      a[ox] = top + 2 * ox + select<int64_t>(m, w + s1[ox], s0[ox]);
    }
  }
}

// Same order and NaN rule as the general kernel below, one output at a time (other dtypes, odd
// widths).
template <typename T>
void max_pool_2x2_kernel(const T* x, T* out, int64_t* indices, int64_t planes, const Window2d& win) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;  // T's bits
  if constexpr (std::is_same_v<T, float>) {
    if (win.w % 2 == 0) {  // Note [2x2 max pooling in two passes]
      const int64_t plane = win.h * win.w, p = win.oh * win.ow, half = win.h * win.ow;
      parallel_for(threads_for(planes * p * 4), planes, [&](int64_t t) {
        thread_local std::vector<float> pair;
        thread_local std::vector<int32_t> second;
        thread_local std::vector<int64_t> unkept;  // the positions when no indices are wanted
        if (pair.size() < static_cast<size_t>(half)) pair.resize(static_cast<size_t>(half));
        if (second.size() < static_cast<size_t>(half)) second.resize(static_cast<size_t>(half));
        if (indices == nullptr && unkept.size() < static_cast<size_t>(p)) unkept.resize(static_cast<size_t>(p));
        max_pool_2x2_plane(x + t * plane, out + t * p, indices != nullptr ? indices + t * p : unkept.data(), win.h,
                           win.w, win.oh, pair.data(), second.data());
      });
      return;
    }
  }
  const int64_t rows = planes * win.oh, w = win.w;
  const int nt = threads_for(rows * win.ow * 4);
  parallel_for(nt, rows, [&](int64_t r) {
    const int64_t t = r / win.oh, oy = r % win.oh;
    const int64_t top = 2 * oy * w;  // the window's first row, within the plane
    const T* r0 = x + t * win.h * w + top;
    const T* r1 = r0 + w;
    T* o = out + r * win.ow;
    thread_local std::vector<int64_t> unkept;  // the positions when no indices are wanted
    if (indices == nullptr && unkept.size() < static_cast<size_t>(win.ow)) unkept.resize(static_cast<size_t>(win.ow));
    int64_t* at = indices != nullptr ? indices + r * win.ow : unkept.data();
    for (int64_t ox = 0; ox < win.ow; ++ox) {
      const int64_t c = 2 * ox;
      // Selects by bit masks: GCC compiles `take ? a : b` on floats to a branch here, and random data
      // mispredicts half of them (the kernel ran at 6 ns an output).
      const T t0 = r0[c], t1 = r0[c + 1], t2 = r1[c], t3 = r1[c + 1];
      T best = t0;
      int64_t tap = 0;
      const auto take = [&best, &tap](T v, int64_t where) {
        const U m = U(0) - static_cast<U>((v > best) | (v != v));  // NaN propagates, as in PyTorch
        best = std::bit_cast<T>((std::bit_cast<U>(v) & m) | (std::bit_cast<U>(best) & ~m));
        const int64_t mi = -static_cast<int64_t>(m & 1);
        tap = (where & mi) | (tap & ~mi);
      };
      take(t1, 1);
      take(t2, w);
      take(t3, w + 1);
      o[ox] = best;
      at[ox] = top + c + tap;
    }
  });
}

template <typename T>
void max_pool_kernel(const T* x, T* out, int64_t* indices, int64_t planes, const Window2d& win) {
  // (In ceil mode the last window of an odd row or column overhangs the plane: the general kernel
  // clips it.)
  if (win.kh == 2 && win.kw == 2 && win.sh == 2 && win.sw == 2 && win.ph == 0 && win.pw == 0 && win.dh == 1 &&
      win.dw == 1 && 2 * win.oh <= win.h && 2 * win.ow <= win.w)
    return max_pool_2x2_kernel(x, out, indices, planes, win);
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;  // T's bits
  const int64_t plane = win.h * win.w, p = win.oh * win.ow;
  const int nt = threads_for(planes * p * win.kh * win.kw);
  parallel_for(nt, planes, [&](int64_t t) {
    const T* src = x + t * plane;   // (h, w)
    T* o = out + t * p;             // (oh, ow)
    thread_local std::vector<int64_t> unkept;  // one row of positions when no indices are wanted
    if (indices == nullptr && unkept.size() < static_cast<size_t>(win.ow)) unkept.resize(static_cast<size_t>(win.ow));
    for (int64_t oy = 0; oy < win.oh; ++oy) {
      const int64_t y0 = oy * win.sh - win.ph;
      const auto [ilo, ihi] = window_taps(y0, win.dh, win.kh, win.h);
      T* orow = o + oy * win.ow;
      int64_t* arow = indices != nullptr ? indices + t * p + oy * win.ow : unkept.data();  // (oh, ow)
      // Selected by bit masks as in the 2x2 kernel (a branch mispredicts on real data).
      const auto take = [](T& best, int64_t& best_at, T v, int64_t where) {
        const U m = U(0) - static_cast<U>((v > best) | (v != v));  // NaN propagates, as in PyTorch
        best = std::bit_cast<T>((std::bit_cast<U>(v) & m) | (std::bit_cast<U>(best) & ~m));
        const int64_t mi = -static_cast<int64_t>(m & 1);
        best_at = (where & mi) | (best_at & ~mi);
      };
      // Columns whose window the plane clips: one output at a time over its taps.
      const auto clipped = [&](int64_t ox) {
        const int64_t x0 = ox * win.sw - win.pw;
        const auto [jlo, jhi] = window_taps(x0, win.dw, win.kw, win.w);
        int64_t best_at = (y0 + ilo * win.dh) * win.w + x0 + jlo * win.dw;
        T best = src[best_at];
        for (int64_t i = ilo; i < ihi; ++i)
          for (int64_t j = jlo; j < jhi; ++j) {
            const int64_t where = (y0 + i * win.dh) * win.w + x0 + j * win.dw;
            take(best, best_at, src[where], where);
          }
        orow[ox] = best;
        arow[ox] = best_at;
      };
      // [a, b): the columns whose window lies inside the plane's width. There the taps go outermost
      // and the columns innermost, so that consecutive outputs are independent (one output's chain
      // of dependent compares ran at 31 ns an output in ResNet-18's 3x3 stride-2 pooling); each
      // output still sees its taps in the same order, so ties and NaN resolve as above.
      int64_t a = 0, b = win.ow;
      while (a < b && a * win.sw - win.pw < 0) ++a;
      while (b > a && (b - 1) * win.sw - win.pw + (win.kw - 1) * win.dw >= win.w) --b;
      for (int64_t ox = 0; ox < a; ++ox) clipped(ox);
      for (int64_t ox = b; ox < win.ow; ++ox) clipped(ox);
      if (a == b) continue;
      const int64_t first = (y0 + ilo * win.dh) * win.w - win.pw;
      for (int64_t ox = a; ox < b; ++ox) {
        orow[ox] = src[first + ox * win.sw];
        arow[ox] = first + ox * win.sw;
      }
      for (int64_t i = ilo; i < ihi; ++i)
        for (int64_t j = i == ilo ? 1 : 0; j < win.kw; ++j) {
          const int64_t tap = (y0 + i * win.dh) * win.w - win.pw + j * win.dw;
          if (indices == nullptr) {
            // Values alone (inference): a select the compiler vectorises, several times faster
            // than tracking positions (measured: benchmarks/README.md, What changed what, pooling).
            const T* in = src + tap;
            for (int64_t ox = a; ox < b; ++ox) {
              const T v = in[ox * win.sw], best = orow[ox];
              const U m = U(0) - static_cast<U>((v > best) | (v != v));
              orow[ox] = std::bit_cast<T>((std::bit_cast<U>(v) & m) | (std::bit_cast<U>(best) & ~m));
            }
            continue;
          }
          for (int64_t ox = a; ox < b; ++ox) take(orow[ox], arow[ox], src[tap + ox * win.sw], tap + ox * win.sw);
        }
    }
  });
}

// Note [Channels-last activations in inference] (ops/conv.cpp): max pooling of channels-last x into
// channels-last out, values only. Each output pixel sees its taps in the order the NCHW kernel
// gives them (rows, then columns, the clipped ones skipped), so ties and NaN resolve as there, and
// each tap is a select over the channels, contiguous in memory, which the compiler vectorises. A
// vector clone per output row (Note [Vector clones]), so the selects run at AVX-512 width
// (measured: benchmarks/README.md, What changed what, pooling).
template <typename T>
inline void max_pool_nhwc_row(const T* plane, T* orow, int64_t c, int64_t y0, const Window2d& win) {
  const auto [ilo, ihi] = window_taps(y0, win.dh, win.kh, win.h);
  for (int64_t ox = 0; ox < win.ow; ++ox) {
    const int64_t x0 = ox * win.sw - win.pw;
    const auto [jlo, jhi] = window_taps(x0, win.dw, win.kw, win.w);
    T* o = orow + ox * c;
    for (int64_t i = ilo; i < ihi; ++i)
      for (int64_t j = jlo; j < jhi; ++j) {
        const T* in = plane + ((y0 + i * win.dh) * win.w + x0 + j * win.dw) * c;
        if (i == ilo && j == jlo) {
          for (int64_t k = 0; k < c; ++k) o[k] = in[k];
          continue;
        }
        for (int64_t k = 0; k < c; ++k) o[k] = select((in[k] > o[k]) | (in[k] != in[k]), in[k], o[k]);
      }
  }
}

BRAID_VECTOR_CLONES void max_pool_nhwc_row_f32(const float* plane, float* orow, int64_t c, int64_t y0,
                                               const Window2d& win) {
  max_pool_nhwc_row(plane, orow, c, y0, win);
}
BRAID_VECTOR_CLONES void max_pool_nhwc_row_f64(const double* plane, double* orow, int64_t c, int64_t y0,
                                               const Window2d& win) {
  max_pool_nhwc_row(plane, orow, c, y0, win);
}

template <typename T>
void max_pool_nhwc_kernel(const T* x, T* out, int64_t n, int64_t c, const Window2d& win) {
  const int64_t rows = n * win.oh;
  const int nt = threads_for(rows * win.ow * c * win.kh * win.kw);
  parallel_for(nt, rows, [&](int64_t r) {
    const int64_t b = r / win.oh, oy = r % win.oh;
    const T* plane = x + b * win.h * win.w * c;
    T* orow = out + r * win.ow * c;
    if constexpr (std::is_same_v<T, float>)
      max_pool_nhwc_row_f32(plane, orow, c, oy * win.sh - win.ph, win);
    else
      max_pool_nhwc_row_f64(plane, orow, c, oy * win.sh - win.ph, win);
  });
}

// One average-pooling window: its clipped bounds in the input and the divisor (PyTorch's rule: the
// window clipped to the padded input when count_include_pad, else to the input itself).
struct AvgWindow {
  int64_t y0, y1, x0, x1;
  double divisor;
};

AvgWindow avg_window(const Window2d& win, int64_t oy, int64_t ox, bool count_include_pad) {
  const int64_t ys = oy * win.sh - win.ph, xs = ox * win.sw - win.pw;
  const int64_t ye = std::min(ys + win.kh, win.h + win.ph), xe = std::min(xs + win.kw, win.w + win.pw);
  AvgWindow a{std::max<int64_t>(ys, 0), std::min(ye, win.h), std::max<int64_t>(xs, 0), std::min(xe, win.w), 0};
  a.divisor = static_cast<double>(count_include_pad ? (ye - ys) * (xe - xs) : (a.y1 - a.y0) * (a.x1 - a.x0));
  return a;
}

template <typename T>
void avg_pool_kernel(const T* x, T* out, int64_t planes, const Window2d& win, bool count_include_pad) {
  const int64_t plane = win.h * win.w, p = win.oh * win.ow;
  const int nt = threads_for(planes * p * win.kh * win.kw);
  parallel_for(nt, planes, [&](int64_t t) {
    const T* src = x + t * plane;  // (h, w)
    T* o = out + t * p;            // (oh, ow)
    for (int64_t oy = 0; oy < win.oh; ++oy) {
      for (int64_t ox = 0; ox < win.ow; ++ox) {
        const AvgWindow a = avg_window(win, oy, ox, count_include_pad);
        T sum = 0;
        for (int64_t y = a.y0; y < a.y1; ++y)
          for (int64_t xx = a.x0; xx < a.x1; ++xx) sum += src[y * win.w + xx];
        o[oy * win.ow + ox] = sum / static_cast<T>(a.divisor);
      }
    }
  });
}

template <typename T>
void avg_pool_backward_kernel(const T* grad, T* gx, int64_t planes, const Window2d& win, bool count_include_pad) {
  const int64_t plane = win.h * win.w, p = win.oh * win.ow;
  const int nt = threads_for(planes * p * win.kh * win.kw);
  parallel_for(nt, planes, [&](int64_t t) {
    const T* g = grad + t * p;  // (oh, ow)
    T* dst = gx + t * plane;    // (h, w)
    for (int64_t oy = 0; oy < win.oh; ++oy) {
      for (int64_t ox = 0; ox < win.ow; ++ox) {
        const AvgWindow a = avg_window(win, oy, ox, count_include_pad);
        const T share = g[oy * win.ow + ox] / static_cast<T>(a.divisor);
        for (int64_t y = a.y0; y < a.y1; ++y)
          for (int64_t xx = a.x0; xx < a.x1; ++xx) dst[y * win.w + xx] += share;
      }
    }
  });
}

void check_planes(const Tensor& x, const Tensor& out, const char* op) {
  BRAID_ASSERT(x.dim() == 4 && out.dim() == 4 && x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype() &&
                   x.shape()[0] * x.shape()[1] == out.shape()[0] * out.shape()[1],
               op, ": operands must be contiguous (N, C, *, *) tensors of one dtype");
}

}  // namespace

void CpuBackend::max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) {
  check_planes(x, out, "max_pool2d");
  BRAID_ASSERT(
      !indices.defined() || (indices.dtype() == kInt64 && indices.is_contiguous() && indices.shape() == out.shape()),
      "max_pool2d: indices must be contiguous int64 of out's shape");
  const int64_t planes = out.shape()[0] * out.shape()[1];
  if (out.numel() == 0) return;
  if (is_half(x.dtype())) {  // Note [Half arithmetic]: the float32 kernel on widened scratch (a max rounds nothing)
    const Tensor f = new_tensor(out.shape(), kFloat32, out.device());
    max_pool2d(widen_to_float32(x), win, f, indices);
    copy(f, out);
    return;
  }
  dispatch_compute(x.dtype(), "max_pool2d", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      max_pool_kernel<T>(x.data<T>(), out.data<T>(), indices.defined() ? indices.data<int64_t>() : nullptr, planes,
                         win);
    else
      unsupported_dtype("max_pool2d", x.dtype());
  });
}

// Values only: training (indices wanted) takes the composite, as the CPU's training keeps NCHW
// convolutions anyway (Note [Channels-last training] in src/ops/conv.cpp).
bool CpuBackend::max_pool2d_channels_last(const Tensor& x, const Window2d& win, const Tensor& out,
                                          const Tensor& indices) {
  if (composite_only_active() || indices.defined()) return false;  // the composite of tests/test_fused_values.cpp
  if (x.dim() != 4 || out.dim() != 4 || !x.is_channels_last() || !out.is_channels_last() || x.dtype() != out.dtype() ||
      x.shape()[0] != out.shape()[0] || x.shape()[1] != out.shape()[1] ||
      (x.dtype() != kFloat32 && x.dtype() != kFloat64))
    return false;
  if (out.numel() == 0) return true;
  dispatch_compute(x.dtype(), "max_pool2d", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      max_pool_nhwc_kernel<T>(x.data<T>(), out.data<T>(), x.shape()[0], x.shape()[1], win);
  });
  return true;
}

void CpuBackend::avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) {
  check_planes(x, out, "avg_pool2d");
  const int64_t planes = out.shape()[0] * out.shape()[1];
  if (out.numel() == 0) return;
  if (is_half(x.dtype())) {  // Note [Half arithmetic]: float32 sums on widened scratch, rounded once
    const Tensor f = new_tensor(out.shape(), kFloat32, out.device());
    avg_pool2d(widen_to_float32(x), win, count_include_pad, f);
    copy(f, out);
    return;
  }
  dispatch_compute(x.dtype(), "avg_pool2d", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      avg_pool_kernel<T>(x.data<T>(), out.data<T>(), planes, win, count_include_pad);
    else
      unsupported_dtype("avg_pool2d", x.dtype());
  });
}

void CpuBackend::avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                                     const Tensor& grad_x) {
  check_planes(grad_x, grad, "avg_pool2d_backward");
  const int64_t planes = grad.shape()[0] * grad.shape()[1];
  if (grad.numel() == 0) return;
  if (is_half(grad.dtype())) {  // float32 accumulation into widened grad_x, rounded once
    const Tensor f = widen_to_float32(grad_x);
    avg_pool2d_backward(widen_to_float32(grad), win, count_include_pad, f);
    copy(f, grad_x);
    return;
  }
  dispatch_compute(grad.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      avg_pool_backward_kernel<T>(grad.data<T>(), grad_x.data<T>(), planes, win, count_include_pad);
    else
      unsupported_dtype("avg_pool2d_backward", grad.dtype());
  });
}

}  // namespace braid::detail
