// Batched matrix multiply. float32 goes to oneDNN's sgemm where it is built in (Note [sgemm through
// oneDNN]), float32 otherwise and float64 to OpenBLAS gemm, reading each operand in place when
// its last two strides are a row- or column-major layout (so transposed views cost no copy) and
// packing it otherwise; integer types use a plain loop. A weight shared by every batch (stride-0
// batch axes) against a contiguous input is folded into one gemm with batch * M rows. Half operands
// (autocast) are widened to float32 scratch and go to sgemm, which accumulates in float32.
#include <cblas.h>
#include <omp.h>

#include "braid/config.h"
#ifdef BRAID_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#include <algorithm>
#include <cctype>
#include <climits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/blas_layout.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"
#include "core/internal.h"

namespace braid::detail {
namespace {

using Layout = BlasLayout;

// One operand's matrices: rows, cols, their strides, and the element offset of each batch.
struct Operand {
  int64_t rows, cols, rs, cs;
  std::vector<int64_t> batch_offsets;
  Layout layout;
};

Operand describe(const Tensor& t, int64_t batches) {
  const int64_t nd = t.dim();
  Operand op{t.shape()[nd - 2], t.shape()[nd - 1], t.strides()[nd - 2], t.strides()[nd - 1], {}, {}};
  op.layout = blas_layout(op.rows, op.cols, op.rs, op.cs);
  op.batch_offsets.resize(static_cast<size_t>(batches));
  std::vector<int64_t> idx(static_cast<size_t>(nd - 2), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < batches; ++i) {  // odometer over the batch axes, row-major
    op.batch_offsets[i] = off;
    for (int64_t d = nd - 3; d >= 0; --d) {
      off += t.strides()[d];
      if (++idx[d] < t.shape()[d]) break;
      off -= idx[d] * t.strides()[d];
      idx[d] = 0;
    }
  }
  return op;
}

// True when a's batch axes continue its rows (a is a stack of row-major matrices with one row
// stride), so that all batches form one (batch * rows, cols) matrix.
bool rows_fold(const Tensor& a, const Operand& op) {
  if (op.layout.trans || !op.layout.in_place) return false;
  int64_t span = op.rows * op.layout.ld;
  for (int64_t d = a.dim() - 3; d >= 0; --d) {
    if (a.shape()[d] == 1) continue;
    if (a.strides()[d] != span) return false;
    span *= a.shape()[d];
  }
  return true;
}

bool shared_across_batches(const Tensor& b) {
  for (int64_t d = 0; d + 2 < b.dim(); ++d)
    if (b.shape()[d] != 1 && b.strides()[d] != 0) return false;
  return true;
}

int blas_int(int64_t v) {
  BRAID_CHECK_T(NotImplementedError, v <= INT_MAX, "matmul: size ", v, " exceeds the BLAS integer range");
  return static_cast<int>(v);
}

// Note [sgemm through oneDNN]
// Debian's OpenBLAS 0.3.21 picks its kernels by the CPU's model number: on x86 cores newer than it
// knows it runs an older kernel than the CPU can (Haswell's AVX2 kernel on some AVX-512 cores, the
// SSE3 Prescott kernel on others, such as this project's VM, family 6 model 207). oneDNN's sgemm (the
// same library as the convolutions, the same libgomp pool) picks its kernel by the CPU's features.
// float64 stays on OpenBLAS, and BRAID_ONEDNN=0 sends float32 back to it too. So do small products,
// where OpenBLAS's kernel is as fast or faster and needs no signal guard (Note [Signals and oneDNN's
// kernels]): below 2^16 multiply-adds where OpenBLAS runs an AVX2 or AVX-512 kernel, below 2^12
// where it runs an older one on a CPU with AVX2 (an attention head's 32x32 products then go to
// oneDNN). (measured: benchmarks/README.md, What changed what, the sgemm lines and run W)
#ifdef BRAID_HAVE_DNNL
int64_t onednn_min_macs() {
  static const int64_t macs = [] {
    std::string core = openblas_get_corename();
    std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* wide : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"})
      if (core == wide) return int64_t{1} << 16;
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned avx2 = static_cast<unsigned>(dnnl_cpu_isa_avx2);
    return (isa & avx2) == avx2 ? int64_t{1} << 12 : int64_t{1} << 16;
  }();
  return macs;
}

// Note [Products by a weight through oneDNN's matmul] takes a B of at least this many columns: with
// fewer the brgemm kernel is a poor matrix-vector product (a 1x1 convolution at one pixel, its
// weight as A), slower than dnnl_sgemm (measured: benchmarks/README.md, What changed what, run X).
constexpr int64_t kMinWeightColumns = 16;
#endif

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc) {
#ifdef BRAID_HAVE_DNNL
  if (onednn_enabled() && m * n * k >= onednn_min_macs()) {
    OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc) == dnnl_success) return;
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blas_int(m), blas_int(n),
              blas_int(k), 1.0f, a, blas_int(lda), b, blas_int(ldb), 0.0f, c, blas_int(ldc));
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb,
          double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blas_int(m), blas_int(n),
              blas_int(k), 1.0, a, blas_int(lda), b, blas_int(ldb), 0.0, c, blas_int(ldc));
}

// The matrix of batch i, in place or packed row-major into buf.
template <typename T>
const T* matrix(const T* base, const Operand& op, int64_t i, std::vector<T>& buf) {
  const T* p = base + op.batch_offsets[i];
  if (op.layout.in_place) return p;
  buf.resize(static_cast<size_t>(op.rows * op.cols));
  for (int64_t r = 0; r < op.rows; ++r)
    for (int64_t c = 0; c < op.cols; ++c) buf[r * op.cols + c] = p[r * op.rs + c * op.cs];
  return buf.data();
}

template <typename T>
void blas_matmul(const Tensor& a, const Tensor& b, const Tensor& out, int64_t batches) {
  const Operand oa = describe(a, batches), ob = describe(b, batches);
  const int64_t m = oa.rows, k = oa.cols, n = ob.cols;
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());
  if (ob.layout.in_place && shared_across_batches(b) && rows_fold(a, oa)) {
#ifdef BRAID_HAVE_DNNL
    // Note [Products by a weight through oneDNN's matmul]
    if constexpr (std::is_same_v<T, float>)
      if (onednn_enabled() && n >= kMinWeightColumns && batches * m * n * k >= onednn_min_macs() &&
          weight_sgemm(b, ob.layout.trans, batches * m, n, k, pa, oa.layout.ld, ob.layout.ld, pc))
        return;
#endif
    gemm(false, ob.layout.trans, batches * m, n, k, pa, oa.layout.ld, pb, ob.layout.ld, pc, n);
    return;
  }
#ifdef BRAID_HAVE_DNNL
  // One guard for the batch: the products' own guards make no calls inside it (Note [Signals and
  // oneDNN's kernels]).
  std::optional<OneDnnSignalGuard> no_signals;
  if (std::is_same_v<T, float> && batches > 1 && onednn_enabled() && m * n * k >= onednn_min_macs())
    no_signals.emplace();
#endif
  auto one = [&](int64_t i, std::vector<T>& abuf, std::vector<T>& bbuf) {
    gemm(oa.layout.trans, ob.layout.trans, m, n, k, matrix(pa, oa, i, abuf), oa.layout.ld, matrix(pb, ob, i, bbuf),
         ob.layout.ld, pc + i * m * n, n);
  };
  // OpenBLAS runs a gemm below 2^18 multiply-adds on one thread; parallelise over such batches.
  const int nt = get_num_threads();
  const bool small = m * n * k < (int64_t{1} << 18);
  if (batches > 1 && small && nt > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads(nt)
    {
      std::vector<T> abuf, bbuf;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < batches; ++i) one(i, abuf, bbuf);
    }
    return;
  }
  std::vector<T> abuf, bbuf;
  for (int64_t i = 0; i < batches; ++i) one(i, abuf, bbuf);
}

// (batches * M) output rows, each a sum over K of a row of a times b; wrapping integer arithmetic.
template <typename T>
void loop_matmul(const Tensor& a, const Tensor& b, const Tensor& out, int64_t batches) {
  const Operand oa = describe(a, batches), ob = describe(b, batches);
  const int64_t m = oa.rows, k = oa.cols, n = ob.cols;
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());
  const int64_t rows = batches * m;
  const int nt = rows * n * k > kParallelGrain ? get_num_threads() : 1;
  parallel_for(nt, rows, [&](int64_t row) {
    const int64_t i = row / m, r = row % m;
    const T* arow = pa + oa.batch_offsets[i] + r * oa.rs;  // (K) with stride cs
    const T* bmat = pb + ob.batch_offsets[i];              // (K, N)
    T* crow = pc + row * n;                                // (N)
    std::fill(crow, crow + n, T(0));
    for (int64_t kk = 0; kk < k; ++kk) {
      const T av = arow[kk * oa.cs];
      const T* brow = bmat + kk * ob.rs;
      for (int64_t j = 0; j < n; ++j) crow[j] = wrap_add(crow[j], wrap_mul(av, brow[j * ob.cs]));
    }
  });
}

}  // namespace

// Only the elements t reads are converted: its broadcast (stride-0) axes stay broadcast, so a weight
// shared by every batch is widened once, and its matrices keep their layout up to a transpose (a
// transposed view becomes row-major).
Tensor widen_to_float32(const Tensor& t) {
  Shape compact = t.shape(), strides = t.strides();
  for (size_t d = 0; d < compact.size(); ++d)
    if (strides[d] == 0) compact[d] = 1;
  Tensor f = new_tensor(compact, kFloat32, t.device());
  cpu_backend().copy(as_strided(t, compact, strides, t.offset()), f);
  Shape fs = f.strides();
  for (size_t d = 0; d < compact.size(); ++d)
    if (strides[d] == 0) fs[d] = 0;
  return as_strided(f, t.shape(), fs, 0);
}

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t nd = out.dim();
  if (out.numel() == 0) return;
  const bool half = !is_compute_type(a.dtype());
  BRAID_ASSERT(nd >= 2 && a.dim() == nd && b.dim() == nd && out.is_contiguous() && a.dtype() == b.dtype() &&
                   (half ? out.dtype() == kFloat32 || out.dtype() == a.dtype() : a.dtype() == out.dtype()),
               "matmul: operands must be batch-broadcast, of one dtype, into a contiguous out of that dtype "
               "(or float32 for half operands)");
  const int64_t batches = shape_numel(Shape(out.shape().begin(), out.shape().end() - 2));
  const int64_t k = a.shape()[nd - 1];
  if (k == 0) return fill(out, 0.0);  // an empty sum; BLAS need not write C when K is 0
  if (half && out.dtype() != kFloat32) {  // accumulated in float32, rounded once
    Tensor f = new_tensor(out.shape(), kFloat32, out.device());
    matmul(a, b, f);
    return copy(f, out);
  }
  if (half) return blas_matmul<float>(widen_to_float32(a), widen_to_float32(b), out, batches);
  dispatch_compute(out.dtype(), "matmul", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      blas_matmul<T>(a, b, out, batches);
    else if constexpr (kIsInt<T>)
      loop_matmul<T>(a, b, out, batches);
    else
      unsupported_dtype("matmul", out.dtype());
  });
}

}  // namespace braid::detail
