// The CPU's channel gate (Note [Channel gates as one op] in src/ops/gate.cpp): the channel means in one pass over x, the two small products and
// their activations per sample (the gate), and x times the gate in a second pass, in x's layout.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/epilogue.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {

namespace {

// The sum of the n values at a in double, over sixteen running sums.
inline double sum(const float* a, int64_t n) {
  double l0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, l1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  double acc = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 8; ++k) {
      l0[k] += static_cast<double>(a[i + k]);
      l1[k] += static_cast<double>(a[i + 8 + k]);
    }
  for (; i < n; ++i) acc += static_cast<double>(a[i]);
  for (int k = 0; k < 8; ++k) acc += l0[k] + l1[k];
  return acc;
}

// means[k] = the mean of the run of r values at x + k * r, for k in [begin, end).
BRAID_VECTOR_CLONES void run_means(const float* x, int64_t begin, int64_t end, int64_t r, float* means) {
  const double inv = 1.0 / static_cast<double>(r);
  for (int64_t k = begin; k < end; ++k) means[k] = static_cast<float>(sum(x + k * r, r) * inv);
}

// acc[c] += x[r * c_count + c] over rows [begin, end): channels-last rows of C values, eight rows
// summed before each update of acc.
BRAID_VECTOR_CLONES void add_rows(const float* x, int64_t begin, int64_t end, int64_t c_count, double* acc) {
  int64_t r = begin;
  for (; r + 8 <= end; r += 8) {
    const float* p = x + r * c_count;
    const int64_t s = c_count;
    for (int64_t c = 0; c < c_count; ++c) {
      const double a = (static_cast<double>(p[c]) + static_cast<double>(p[s + c])) +
                       (static_cast<double>(p[2 * s + c]) + static_cast<double>(p[3 * s + c]));
      const double b = (static_cast<double>(p[4 * s + c]) + static_cast<double>(p[5 * s + c])) +
                       (static_cast<double>(p[6 * s + c]) + static_cast<double>(p[7 * s + c]));
      acc[c] += a + b;
    }
  }
  for (; r < end; ++r) {
    const float* row = x + r * c_count;
    for (int64_t c = 0; c < c_count; ++c) acc[c] += static_cast<double>(row[c]);
  }
}

// y = x * the gate of its channel, over rows [begin, end): channels-last rows of c values (a gate
// row per r rows), or runs of r values of one channel each (a gate value per run).
BRAID_VECTOR_CLONES void scale_rows(const float* x, const float* gate, float* y, int64_t begin, int64_t end, int64_t r,
                                    int64_t c, bool channels_last) {
  if (channels_last) {
    for (int64_t i = begin; i < end; ++i) {
      const float* g = gate + (i / r) * c;
      for (int64_t k = 0; k < c; ++k) y[i * c + k] = x[i * c + k] * g[k];
    }
  } else {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      for (int64_t k = 0; k < r; ++k) y[i * r + k] = x[i * r + k] * g;
    }
  }
}

constexpr int kDenseRows = 4;

// y[begin, end) of y (rows) = e(w (rows, cols) x + b), a 1x1 convolution of one sample: each row's
// products summed in double (eight running sums, four rows at a time sharing x), rounded, then the
// bias added in float and the activation applied as the convolution's epilogue does. begin is a
// multiple of kDenseRows, so that a row's sum does not depend on how the rows are split.
BRAID_VECTOR_CLONES void dense(const float* w, const float* b, const float* x, int64_t begin, int64_t end, int64_t cols,
                               const Epilogue& e, float* y) {
  constexpr int kRows = kDenseRows, kLanes = 8;
  const int64_t rows = end;
  for (int64_t r0 = begin; r0 < rows; r0 += kRows) {
    const int q_end = static_cast<int>(std::min<int64_t>(kRows, rows - r0));
    double acc[kRows][kLanes] = {};
    int64_t k = 0;
    if (q_end == kRows)
      for (; k + kLanes <= cols; k += kLanes)
        for (int q = 0; q < kRows; ++q)
          for (int l = 0; l < kLanes; ++l)
            acc[q][l] += static_cast<double>(w[(r0 + q) * cols + k + l]) * static_cast<double>(x[k + l]);
    for (int q = 0; q < q_end; ++q) {
      double s = 0;
      for (int64_t t = k; t < cols; ++t) s += static_cast<double>(w[(r0 + q) * cols + t]) * static_cast<double>(x[t]);
      const double* l = acc[q];
      s += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
      const float v = static_cast<float>(s);
      y[r0 + q] = b != nullptr ? v + b[r0 + q] : v;
    }
  }
  epilogue_run(e, nullptr, y + begin, end - begin);
}

// The t-th of parts shares of [0, rows), split at multiples of kDenseRows.
int64_t dense_split(int64_t rows, int t, int parts) {
  const int64_t groups = (rows + kDenseRows - 1) / kDenseRows;
  return std::min(rows, groups * t / parts * kDenseRows);
}

}  // namespace

bool CpuBackend::channel_gate(const Tensor& x, bool channels_last, const Tensor& w1, const Tensor& b1,
                                const Epilogue& e1, const Tensor& w2, const Tensor& b2, const Epilogue& e2,
                                const Tensor& gate_out, const Tensor& out) {
  if (!fused_on() || x.dtype() != kFloat32 || !x.is_contiguous() || x.dim() != 4 || e1.scale != 1 || e1.shift != 0 ||
      e2.scale != 1 || e2.shift != 0 || e1.residual.defined() || e2.residual.defined() ||
      gate_out.dtype() != kFloat32 || !gate_out.is_contiguous() ||
      (out.defined() && (out.dtype() != kFloat32 || !out.is_contiguous())))
    return false;
  const int64_t n = x.size(0), c = channels_last ? x.size(3) : x.size(1);
  const int64_t r = channels_last ? x.size(1) * x.size(2) : x.size(2) * x.size(3);  // values per channel
  const int64_t mid = w1.size(0);
  if (w1.size(1) != c || w2.size(0) != c || w2.size(1) != mid || r == 0 || gate_out.numel() != n * c) return false;
  const float* px = x.data<float>();
  float* py = out.defined() ? out.data<float>() : nullptr;
  float* gate = gate_out.data<float>();
  const float *pw1 = w1.data<float>(), *pw2 = w2.data<float>();
  const float* pb1 = b1.defined() ? b1.data<float>() : nullptr;
  const float* pb2 = b2.defined() ? b2.data<float>() : nullptr;
  // The work: two passes over x and the two products (c * mid multiply-adds each per sample).
  const int64_t work = 2 * x.numel() + 2 * n * c * mid;
  const int nt = work > kParallelGrain && !omp_in_parallel() ? get_num_threads() : 1;
  // Per thread, the channels-last sums of its rows (N * C each); then the means (N * C) and the
  // hidden values (N * C_mid). The calling thread's, kept between calls.
  thread_local std::vector<double> partial;
  thread_local std::vector<float> values;
  if (channels_last) partial.assign(static_cast<size_t>(nt * n * c), 0.0);
  values.resize(static_cast<size_t>(n * (c + mid)));
  double* sums = partial.data();
  float *means = values.data(), *hidden = means + n * c;
  // Each pass as work-sharing constructs of the team that runs it (or of no team: one thread).
  // One team for the three passes (a region costs a fork and a join), with barriers between them.
  in_team(nt, [&](int t, int parts) {
    // The means.
    if (channels_last) {  // rows (N * H * W) of C values, split evenly over the threads
      const int64_t rows = n * r, begin = rows * t / parts, end = rows * (t + 1) / parts;
      double* acc = sums + static_cast<int64_t>(t) * n * c;
      for (int64_t i = begin; i < end;) {
        const int64_t sample = i / r, stop = std::min(end, (sample + 1) * r);
        add_rows(px, i, stop, c, acc + sample * c);
        i = stop;
      }
#pragma omp barrier
      const double inv = 1.0 / static_cast<double>(r);
#pragma omp for schedule(static)
      for (int64_t k = 0; k < n * c; ++k) {
        double s = 0;
        for (int p = 0; p < parts; ++p) s += sums[p * n * c + k];
        means[k] = static_cast<float>(s * inv);
      }
    } else {  // runs of H * W values, one per (sample, channel)
      const int64_t runs = n * c;
      run_means(px, runs * t / parts, runs * (t + 1) / parts, r, means);
    }
#pragma omp barrier
    // The gates: a sample per thread, or at fewer samples than threads (batch 1) each sample's
    // rows split over the threads.
    if (n >= parts) {
#pragma omp for schedule(static)
      for (int64_t s = 0; s < n; ++s) {
        dense(pw1, pb1, means + s * c, 0, mid, c, e1, hidden + s * mid);
        dense(pw2, pb2, hidden + s * mid, 0, c, mid, e2, gate + s * c);
      }
    } else {
      for (int64_t s = 0; s < n; ++s) {
        dense(pw1, pb1, means + s * c, dense_split(mid, t, parts), dense_split(mid, t + 1, parts), c, e1,
              hidden + s * mid);
#pragma omp barrier
        dense(pw2, pb2, hidden + s * mid, dense_split(c, t, parts), dense_split(c, t + 1, parts), mid, e2,
              gate + s * c);
#pragma omp barrier
      }
    }
    if (py == nullptr) return;
    // x times the gate.
    const int64_t rows = channels_last ? n * r : n * c;
    scale_rows(px, gate, py, rows * t / parts, rows * (t + 1) / parts, r, c, channels_last);
  });
  return true;
}

}  // namespace braid::detail
