// Matrix products through cuBLASLt (float32, float16 and bfloat16 operands into a float32 result,
// or half operands into a result of their dtype)
// and matmul_epilogue, the product with its bias in cuBLASLt's epilogue and its other steps in one
// more pass (epilogue.cu).
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul_lt.h"
#include "backend/cuda/runtime.h"
#include "braid/device.h"
#include "core/internal.h"

namespace braid::detail {

// Note [Products through cuBLASLt]
// Every float32, float16 and bfloat16 product (batched or not, operands in place in either
// layout, as matmul.cpp describes them to cuBLAS; a half product into float32 or its own dtype,
// always with CUBLAS_COMPUTE_32F and float32 alpha/beta) first asks cuBLASLt: a matmul descriptor
// (compute type, transposes, epilogue), one layout per matrix (rows, columns, leading dimension,
// batch count and stride), and a preference that caps the workspace at kWorkspaceLimit and states
// each pointer's actual alignment (cuBLASLt assumes 256 bytes otherwise, which a view at an offset
// does not have). The heuristic's first algorithm is kept per device in a table keyed by
// everything the descriptors hold, so a repeated shape asks the heuristic once; an empty answer or
// a refusal is kept too, and those products run cuBLAS's GemmEx (as float64 products always do). The workspace
// the algorithm asks for is a byte tensor of that size from the device's caching allocator, freed
// in stream order after the call: it shows in memory_allocated's peak and never calls cudaMalloc.
// One cuBLASLt handle per device, made on first use.
//
// matmul_epilogue: a per-column Add as the first step is cuBLASLt's CUBLASLT_EPILOGUE_BIAS, which
// adds the bias to the float32 product before its one rounding to the result (the contract's
// product, then one float32 addition); the steps after it (Add, Sub, Mul, Div with a number, a
// per-column vector or a whole M x N operand) run in order in one elementwise pass, each one
// float32 operation as the ops do. With no Lt algorithm the product is cuBLAS's and the pass
// runs every step.
//
// TF32 (braid::set_float32_matmul_precision "high" or "medium"): float32 products, in cuBLAS and
// cuBLASLt alike, use CUBLAS_COMPUTE_32F_FAST_TF32, which rounds the operands to TF32 (10 bits of
// mantissa) and accumulates in float32, as PyTorch does under the same setting.

namespace {

constexpr uint64_t kWorkspaceLimit = uint64_t{32} << 20;

void check_lt(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(cat("cuBLASLt error in matmul: ", call, " returned ", cublasLtGetStatusName(status), " (",
                    cublasLtGetStatusString(status), ")"));
}

cublasLtHandle_t lt_handle(int device) {
  static std::array<std::once_flag, cuda::kMaxDevices> once;
  static std::array<cublasLtHandle_t, cuda::kMaxDevices> handles{};
  std::call_once(once[static_cast<size_t>(device)], [device] {
    cublasLtHandle_t h = nullptr;
    check_lt(cublasLtCreate(&h), "cublasLtCreate");
    handles[static_cast<size_t>(device)] = h;
  });
  return handles[static_cast<size_t>(device)];
}

// The descriptors of one call, destroyed with it.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  std::array<cublasLtMatrixLayout_t, 3> layout{};  // A, B, C (= D)
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (cublasLtMatrixLayout_t l : layout)
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};

template <typename T>
void set_op(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  check_lt(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v), "cublasLtMatmulDescSetAttribute");
}
template <typename T>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& v) {
  check_lt(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof v), "cublasLtMatrixLayoutSetAttribute");
}
template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  check_lt(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v), "cublasLtMatmulPreferenceSetAttribute");
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batches,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate");
  if (batches > 1) {
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batches));
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return l;
}

// The largest power of two dividing p's address, up to cuBLASLt's default assumption of 256.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

struct Choice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

struct AlgoTable {
  std::mutex mu;
  std::map<std::vector<int64_t>, Choice> choices;
};

AlgoTable& table(int device) {
  static std::array<AlgoTable, cuda::kMaxDevices> tables;
  return tables[static_cast<size_t>(device)];
}

}  // namespace

cublasComputeType_t cuda::float32_compute() {
  return float32_matmul_precision() == "highest" ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
}

bool cuda::lt_gemm(int device, const Gemm& g, const void* bias) {
  if (g.ab == CUDA_R_64F || g.batches > INT32_MAX) return false;
  Descriptors d;
  check_lt(cublasLtMatmulDescCreate(&d.op, g.compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_op(d.op, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(g.ta ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_op(d.op, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(g.tb ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (bias) {
    set_op(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS));
    set_op(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);  // of C's type, cuBLASLt's default
  }
  d.layout[0] = g.ta ? make_layout(g.ab, g.k, g.m, g.lda, g.batches, g.sa) : make_layout(g.ab, g.m, g.k, g.lda, g.batches, g.sa);
  d.layout[1] = g.tb ? make_layout(g.ab, g.n, g.k, g.ldb, g.batches, g.sb) : make_layout(g.ab, g.k, g.n, g.ldb, g.batches, g.sb);
  d.layout[2] = make_layout(g.c, g.m, g.n, g.ldc, g.batches, g.sc);
  const uint32_t align_a = alignment(g.A), align_b = alignment(g.B), align_c = alignment(g.C);
  const std::vector<int64_t> key{g.ab, g.c, g.compute, g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.sa,
                                 g.sb, g.sc, g.batches, bias != nullptr, align_a, align_b, align_c};
  cublasLtHandle_t h = lt_handle(device);
  Choice choice;
  {
    AlgoTable& t = table(device);
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.choices.find(key);
    if (it != t.choices.end()) {
      choice = it->second;
    } else {
      check_lt(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
      set_pref(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceLimit);
      set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
      set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
      set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
      set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
      cublasLtMatmulHeuristicResult_t result{};
      int count = 0;
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, d.op, d.layout[0], d.layout[1], d.layout[2],
                                                              d.layout[2], d.pref, 1, &result, &count);
      // Any refusal (no algorithm, or a layout this cuBLASLt does not take) leaves the product to cuBLAS.
      if (s == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS)
        choice = {true, result.algo, result.workspaceSize};
      t.choices.emplace(key, choice);
    }
  }
  if (!choice.found) return false;
  Tensor workspace;  // from the caching allocator (Note [Products through cuBLASLt])
  if (choice.workspace > 0)
    workspace = new_tensor({static_cast<int64_t>(choice.workspace)}, kUInt8, Device::cuda(device));
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(h, d.op, &one, g.A, d.layout[0], g.B, d.layout[1], &zero, g.C, d.layout[2], g.C, d.layout[2],
                          &choice.algo, workspace.defined() ? device_data(workspace) : nullptr, choice.workspace,
                          cuda::stream(device)),
           "cublasLtMatmul");
  return true;
}

// out (M, N) = x (M, K) w (N, K)^T + bias as cuBLASLt sees it: out^T (N, M) = w x^T, with w's
// row-major (N, K) memory read as a column-major (K, N) matrix, transposed (linear_bias, backend.h).
// The bias is CUBLASLT_EPILOGUE_BIAS's, of out's type, added before the one rounding. No Lt
// algorithm: declined, and the op runs its composite.
bool CudaBackend::linear_bias(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  const DType t = x.dtype();
  if ((t != kFloat32 && !is_half(t)) || w.dtype() != t || (out.dtype() != t && out.dtype() != kFloat32) ||
      bias.dtype() != out.dtype() || x.dim() != 2 || w.dim() != 2 || bias.dim() != 1 || out.dim() != 2 ||
      !x.is_contiguous() || !w.is_contiguous() || !bias.is_contiguous() || !out.is_contiguous())
    return false;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  if (m == 0 || n == 0 || k == 0 || w.size(1) != k || bias.numel() != n || out.size(0) != m || out.size(1) != n ||
      reinterpret_cast<uintptr_t>(device_data(bias)) % 16 != 0)
    return false;
  const int device = out.device().index;
  cuda::DeviceGuard guard(device);
  const auto type = [](DType d) { return d == kFloat32 ? CUDA_R_32F : d == kFloat16 ? CUDA_R_16F : CUDA_R_16BF; };
  const cuda::Gemm g{type(t), type(out.dtype()), t == kFloat32 ? cuda::float32_compute() : CUBLAS_COMPUTE_32F,
                     true, false, n, m, k, k, k, n, 0, 0, 0, 1, device_data(w), device_data(x), device_data(out)};
  return cuda::lt_gemm(device, g, device_data(bias));
}

// out (M, N) = a (M, K) @ b (K, N) as cuBLAS sees it: out^T = b^T a^T, all column-major in place.
bool CudaBackend::matmul_epilogue(const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue,
                                  const Tensor& out) {
  if (a.dtype() != kFloat32 || b.dtype() != kFloat32 || out.dtype() != kFloat32 || a.dim() != 2 || b.dim() != 2 ||
      !a.is_contiguous() || !b.is_contiguous() || !out.is_contiguous())
    return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0 || epilogue.empty() || epilogue.size() > cuda::kMaxEpilogueSteps) return false;
  for (const Tensor* t : {&a, &b})
    BRAID_CHECK_T(TypeError, t->device() == out.device(), "matmul_epilogue: operands on different devices (",
                  t->device().str(), " and ", out.device().str(), "); move them with .to(device) first");
  for (const EpilogueStep& s : epilogue)
    BRAID_CHECK_T(TypeError, !s.operand.defined() || s.operand.device() == out.device(),
                  "matmul_epilogue: an epilogue operand on ", s.operand.device().str(), ", the product on ",
                  out.device().str(), "; move it with .to(device) first");
  const int device = out.device().index;
  cuda::DeviceGuard guard(device);
  const EpilogueStep& first = epilogue.front();
  const bool bias = first.kind == ChainStep::Kind::Add && first.operand.defined() && first.operand.numel() == n &&
                    reinterpret_cast<uintptr_t>(device_data(first.operand)) % 16 == 0;
  const cuda::Gemm g{CUDA_R_32F, CUDA_R_32F, cuda::float32_compute(), false, false, n, m, k, n, k, n, 0, 0, 0, 1,
                     device_data(b), device_data(a), device_data(out)};
  size_t done = 0;
  if (cuda::lt_gemm(device, g, bias ? device_data(first.operand) : nullptr))
    done = bias ? 1 : 0;
  else
    matmul(a, b, out);
  if (done == epilogue.size()) return true;
  cuda::EpilogueSteps steps;
  for (size_t i = done; i < epilogue.size(); ++i) {
    const EpilogueStep& s = epilogue[i];
    steps.step[steps.count++] = {s.kind, s.operand.defined() ? static_cast<const float*>(device_data(s.operand)) : nullptr,
                                 s.operand.defined() ? s.operand.numel() : 0, s.k};
  }
  cuda::launch_epilogue_steps(static_cast<float*>(device_data(out)), m, n, steps, cuda::stream(device));
  return true;
}

}  // namespace braid::detail
