// Batched matmul on cuBLASLt and cuBLAS: float32 and float64, and float16/bfloat16 operands into a
// float32 or a same-dtype out with float32 accumulation (autocast's case; a half out is C/D of the
// half type, rounded once from the float32 accumulation), through cuBLASLt first where it has an
// algorithm (matmul_lt.cpp; float64 always cuBLAS); integers go to a plain kernel (matmul_int.cu). Each
// operand is read in place when its last two strides are a row- or column-major layout (so that
// transposed views cost no copy) and its batch matrices are evenly spaced, else it is packed
// contiguous first. A weight shared by every batch against a stack of row-major matrices is one
// GEMM with batch * M rows, as on the CPU (src/backend/cpu/matmul.cpp).
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <mutex>
#include <vector>

#include "backend/blas_layout.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul_lt.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/strided_host.h"
#include "core/internal.h"

namespace braid::detail {
namespace {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(cat("cuBLAS error in matmul: ", call, " returned ", cublasGetStatusName(status), " (",
                    cublasGetStatusString(status), ")"));
}

// One handle per device, bound to the device's stream; made on first use and kept for the process.
cublasHandle_t handle(int device) {
  static std::array<std::once_flag, cuda::kMaxDevices> once;
  static std::array<cublasHandle_t, cuda::kMaxDevices> handles{};
  std::call_once(once[static_cast<size_t>(device)], [device] {
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h), "cublasCreate");
    check_cublas(cublasSetStream(h, cuda::stream(device)), "cublasSetStream");
    handles[static_cast<size_t>(device)] = h;
  });
  return handles[static_cast<size_t>(device)];
}

using Layout = BlasLayout;

// An operand as cuBLAS reads it: its layout and the element step between batch matrices.
struct Operand {
  Tensor t;  // the operand itself, or its packed copy
  Layout layout;
  int64_t batch_stride;
};

// The batch matrices of t (batch axes row-major) as one stride, when they are evenly spaced.
bool even_batches(const Tensor& t, int64_t& stride) {
  stride = 0;
  bool first = true;
  int64_t span = 0;  // the offset step so far, for the axes inside d
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.shape()[d] == 1) continue;
    if (first) {
      stride = t.strides()[d];
      first = false;
    } else if (t.strides()[d] != span) {
      return false;
    }
    span = t.strides()[d] * t.shape()[d];
  }
  return true;
}

Operand describe(const Tensor& t, CudaBackend& backend) {
  const int64_t nd = t.dim();
  const int64_t rows = t.shape()[nd - 2], cols = t.shape()[nd - 1];
  Layout layout = blas_layout(rows, cols, t.strides()[nd - 2], t.strides()[nd - 1]);
  int64_t stride = 0;
  if (layout.in_place && even_batches(t, stride)) return {t, layout, stride};
  Tensor packed = new_tensor(t.shape(), t.dtype(), t.device());
  backend.copy(t, packed);
  return {packed, blas_layout(rows, cols, cols, 1), rows * cols};
}

bool shared_across_batches(const Tensor& b) {
  for (int64_t d = 0; d + 2 < b.dim(); ++d)
    if (b.shape()[d] != 1 && b.strides()[d] != 0) return false;
  return true;
}

// Whether a's batches continue its rows (a stack of row-major matrices with one row stride), so
// that all of them form one (batches * rows, cols) matrix.
bool rows_fold(const Operand& a) {
  if (a.layout.trans || !a.layout.in_place) return false;
  const Tensor& t = a.t;
  int64_t span = t.shape()[t.dim() - 2] * a.layout.ld;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.shape()[d] == 1) continue;
    if (t.strides()[d] != span) return false;
    span *= t.shape()[d];
  }
  return true;
}

int blas_int(int64_t v) {
  BRAID_CHECK_T(NotImplementedError, v <= INT_MAX, "matmul: size ", v, " exceeds cuBLAS's integer range");
  return static_cast<int>(v);
}

struct GemmTypes {
  cudaDataType_t ab, c;
  cublasComputeType_t compute;
};

GemmTypes gemm_types(DType ab, DType out) {
  if (ab == kFloat32 && out == kFloat32) return {CUDA_R_32F, CUDA_R_32F, cuda::float32_compute()};
  if (ab == kFloat64 && out == kFloat64) return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
  if (ab == kFloat16 && out == kFloat32) return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
  if (ab == kBFloat16 && out == kFloat32) return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
  if (ab == kFloat16 && out == kFloat16) return {CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F};
  if (ab == kBFloat16 && out == kBFloat16) return {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F};
  throw TypeError(cat("matmul: ", dtype_name(ab), " operands into a ", dtype_name(out),
                      " result are not supported by the CUDA backend"));
}

// g through cuBLAS (float64, and where cuBLASLt has no algorithm).
void cublas_gemm(int device, const cuda::Gemm& g) {
  const double one64 = 1.0, zero64 = 0.0;
  const float one32 = 1.0f, zero32 = 0.0f;
  const bool f64 = g.compute == CUBLAS_COMPUTE_64F;
  const void* alpha = f64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* beta = f64 ? static_cast<const void*>(&zero64) : static_cast<const void*>(&zero32);
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasHandle_t h = handle(device);
  if (g.batches == 1) {
    check_cublas(cublasGemmEx(h, op_a, op_b, blas_int(g.m), blas_int(g.n), blas_int(g.k), alpha, g.A, g.ab,
                              blas_int(g.lda), g.B, g.ab, blas_int(g.ldb), beta, g.C, g.c, blas_int(g.ldc), g.compute,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    return;
  }
  check_cublas(cublasGemmStridedBatchedEx(h, op_a, op_b, blas_int(g.m), blas_int(g.n), blas_int(g.k), alpha, g.A, g.ab,
                                          blas_int(g.lda), g.sa, g.B, g.ab, blas_int(g.ldb), g.sb, beta, g.C, g.c,
                                          blas_int(g.ldc), g.sc, blas_int(g.batches), g.compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

// out (batches, m, n) = a @ b. cuBLAS is column-major, so it computes out^T = b^T a^T: a row-major
// (r, c) matrix is its column-major transpose in place, so each operand's op is its layout's trans.
// cuBLASLt first, cuBLAS where it declines (Note [Products through cuBLASLt] in matmul_lt.cpp).
void gemm_matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out, int64_t batches, int device,
                 CudaBackend& backend) {
  const GemmTypes types = gemm_types(a_in.dtype(), out.dtype());
  const Operand a = describe(a_in, backend), b = describe(b_in, backend);
  const int64_t nd = out.dim(), m = out.shape()[nd - 2], n = out.shape()[nd - 1], k = a_in.shape()[nd - 1];
  cuda::Gemm g{types.ab, types.c, types.compute, b.layout.trans, a.layout.trans, n, m, k, b.layout.ld, a.layout.ld, n,
               b.batch_stride, a.batch_stride, m * n, batches, device_data(b.t), device_data(a.t), device_data(out)};
  if (batches > 1 && shared_across_batches(b.t) && rows_fold(a)) {  // one GEMM of batches * m rows
    g.n = batches * m;
    g.sa = g.sb = g.sc = 0;
    g.batches = 1;
  }
  if (!cuda::lt_gemm(device, g, nullptr)) cublas_gemm(device, g);
}

void int_matmul(const Tensor& a, const Tensor& b, const Tensor& out, int64_t batches, cudaStream_t stream) {
  const int64_t nd = out.dim();
  const Shape batch_shape(out.shape().begin(), out.shape().end() - 2);
  const auto batch = cuda::make_indexer<2>(batch_shape, {a.strides().data(), b.strides().data()}, /*reorder=*/false);
  const cuda::IntMatrix ma{device_data(a), a.strides()[nd - 2], a.strides()[nd - 1]};
  const cuda::IntMatrix mb{device_data(b), b.strides()[nd - 2], b.strides()[nd - 1]};
  cuda::launch_int_matmul(out.dtype(), ma, mb, batch, device_data(out), batches, out.shape()[nd - 2],
                          out.shape()[nd - 1], a.shape()[nd - 1], stream);
}

}  // namespace

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t nd = out.dim();
  if (out.numel() == 0) return;
  const bool mixed = is_half(a.dtype()) && out.dtype() == kFloat32;  // a half out of a's dtype is the other case
  BRAID_ASSERT(nd >= 2 && a.dim() == nd && b.dim() == nd && out.is_contiguous() && a.dtype() == b.dtype() &&
                   (a.dtype() == out.dtype() || mixed),
               "matmul: operands must be batch-broadcast, of one dtype, into a contiguous out");
  for (const Tensor* t : {&a, &b})
    BRAID_CHECK_T(TypeError, t->device() == out.device(), "matmul: operands on different devices (", t->device().str(),
                  " and ", out.device().str(), "); move them with .to(device) first");
  const int device = out.device().index;
  cuda::DeviceGuard guard(device);
  const int64_t batches = shape_numel(Shape(out.shape().begin(), out.shape().end() - 2));
  if (a.shape()[nd - 1] == 0) return fill(out, 0.0);  // an empty sum; GEMM need not write C when K is 0
  if (out.dtype() == kInt32 || out.dtype() == kInt64) return int_matmul(a, b, out, batches, cuda::stream(device));
  gemm_matmul(a, b, out, batches, device, *this);
}

}  // namespace braid::detail
