// cuBLASLt on the host: layouts with batch count and stride, transposes, the bias epilogue (its bias
// of D's type, cuBLASLt's default), TF32
// operands, half operands into a float32 or a same-type half C/D (float32 compute, one rounding);
// the heuristic offers one algorithm that asks for a workspace (1 MiB, or the limit).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include "cublasLt.h"
namespace braid::detail {
float half_to_float(uint16_t); float bfloat16_to_float(uint16_t); uint16_t float_to_half(float); uint16_t float_to_bfloat16(float);
}
namespace {
std::atomic<long> heuristic_calls{0}, matmul_calls{0}, bias_calls{0};
std::atomic<size_t> last_workspace{0};
constexpr size_t kWorkspace = size_t{1} << 20;
size_t esize(cudaDataType_t t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }
float load(const void* p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  if (t == CUDA_R_16F) return braid::detail::half_to_float(static_cast<const uint16_t*>(p)[i]);
  return braid::detail::bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
}
// The problem's sizes when the descriptors agree (else an abort), or NOT_SUPPORTED.
cublasStatus_t shape(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                     cublasLtMatrixLayout_t d, int64_t& m, int64_t& n, int64_t& k) {
  const bool tf32 = op->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (op->scale != CUDA_R_32F || (op->compute != CUBLAS_COMPUTE_32F && !tf32) || a->type != b->type ||
      (c->type != CUDA_R_32F && c->type != a->type) || d->type != c->type || a->type == CUDA_R_64F ||
      (tf32 && a->type != CUDA_R_32F) || (op->epilogue != CUBLASLT_EPILOGUE_DEFAULT && op->epilogue != CUBLASLT_EPILOGUE_BIAS))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  m = static_cast<int64_t>(op->transa ? a->cols : a->rows);
  k = static_cast<int64_t>(op->transa ? a->rows : a->cols);
  n = static_cast<int64_t>(op->transb ? b->rows : b->cols);
  const int64_t kb = static_cast<int64_t>(op->transb ? b->cols : b->rows);
  bool ok = kb == k && static_cast<int64_t>(c->rows) == m && static_cast<int64_t>(c->cols) == n && c->rows == d->rows &&
            c->cols == d->cols && c->ld == d->ld && a->batch == b->batch && a->batch == c->batch && c->batch == d->batch;
  for (cublasLtMatrixLayout_t l : {a, b, c}) ok = ok && l->ld >= std::max<int64_t>(1, static_cast<int64_t>(l->rows)) && l->batch >= 1;
  if (!ok) {
    // braid takes any refusal of the heuristic for "no algorithm": a bad description must not pass unseen.
    std::fprintf(stderr, "EMU cublasLt: inconsistent layouts m %ld n %ld k %ld/%ld\n", long(m), long(n), long(k), long(kb));
    std::abort();
  }
  return CUBLAS_STATUS_SUCCESS;
}
void check_extent(const void* p, cublasLtMatrixLayout_t l) {
  if (l->rows == 0 || l->cols == 0) return;
  const int64_t last = (l->batch - 1) * l->stride + static_cast<int64_t>(l->cols - 1) * l->ld + static_cast<int64_t>(l->rows) - 1;
  emu_check_device(p, static_cast<size_t>(last + 1) * esize(l->type));
}
void check_align(const void* p, uint64_t align, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    std::fprintf(stderr, "EMU cublasLt: %s at %p is not aligned to the %lu bytes the algorithm was chosen for\n", what, p,
                 static_cast<unsigned long>(align));
    std::abort();
  }
}
}  // namespace
extern "C" long emu_lt_heuristic_calls() { return heuristic_calls.load(); }
extern "C" long emu_lt_matmul_calls() { return matmul_calls.load(); }
extern "C" long emu_lt_bias_calls() { return bias_calls.load(); }  // the products with a bias epilogue
extern "C" size_t emu_lt_last_workspace() { return last_workspace.load(); }
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { *h = new EmuLtHandle{0}; return CUBLAS_STATUS_SUCCESS; }
const char* cublasLtGetStatusName(cublasStatus_t s) { return cublasGetStatusName(s); }
const char* cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  *d = new EmuLtDesc{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t n) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: if (n != 4) break; std::memcpy(&d->transa, buf, 4); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB: if (n != 4) break; std::memcpy(&d->transb, buf, 4); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: if (n != 4) break; std::memcpy(&d->epilogue, buf, 4); return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: if (n != sizeof(void*)) break; std::memcpy(&d->bias, buf, n); return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
  *l = new EmuLtLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void* buf, size_t n) {
  if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && n == 4) std::memcpy(&l->batch, buf, 4);
  else if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && n == 8) std::memcpy(&l->stride, buf, 8);
  else return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) { *p = new EmuLtPref; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* buf, size_t n) {
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == 8) std::memcpy(&p->max_workspace, buf, 8);
  else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && n == 4)
    std::memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
  else return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* count) {
  ++heuristic_calls;
  *count = 0;
  int64_t m, n, k;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t s = shape(op, a, b, c, d, m, n, k)) return s;
  if (std::getenv("EMU_LT_DECLINE")) return CUBLAS_STATUS_NOT_SUPPORTED;
  cublasLtMatmulHeuristicResult_t r{};
  for (int i = 0; i < 4; ++i) r.algo.data[i] = pref->align[i];
  r.workspaceSize = std::min<size_t>(kWorkspace, pref->max_workspace);
  r.algo.data[4] = r.workspaceSize;
  r.state = CUBLAS_STATUS_SUCCESS;
  results[0] = r;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  int64_t m, n, k;
  if (cublasStatus_t st = shape(op, a, b, c, d, m, n, k)) return st;
  if (!s || !algo || workspace_bytes < algo->data[4]) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo->data[4] > 0) emu_check_device(workspace, algo->data[4]);
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (be != 0 && C != D) return CUBLAS_STATUS_NOT_SUPPORTED;
  check_extent(A, a); check_extent(B, b); check_extent(D, d);
  check_align(A, algo->data[0], "A"); check_align(B, algo->data[1], "B"); check_align(D, algo->data[3], "D");
  const bool tf32 = op->compute == CUBLAS_COMPUTE_32F_FAST_TF32, bias = op->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (bias) emu_check_device(op->bias, static_cast<size_t>(m) * esize(d->type));  // of D's type
  ++matmul_calls;
  if (bias) ++bias_calls;
  last_workspace = workspace_bytes;
  for (int64_t t = 0; t < d->batch; ++t)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          float x = load(A, a->type, t * a->stride + (op->transa ? l + i * a->ld : i + l * a->ld));
          float y = load(B, b->type, t * b->stride + (op->transb ? j + l * b->ld : l + j * b->ld));
          if (tf32) { x = emu_tf32(x); y = emu_tf32(y); }
          sum += static_cast<double>(x) * y;
        }
        const int64_t at = t * d->stride + i + j * d->ld;
        float v = static_cast<float>(al * sum + (be != 0 ? be * static_cast<double>(load(D, d->type, at)) : 0.0));
        if (bias) v = v + load(op->bias, d->type, i);
        if (d->type == CUDA_R_32F) static_cast<float*>(D)[at] = v;
        else static_cast<uint16_t*>(D)[at] = d->type == CUDA_R_16F ? braid::detail::float_to_half(v) : braid::detail::float_to_bfloat16(v);
      }
  return CUBLAS_STATUS_SUCCESS;
}
