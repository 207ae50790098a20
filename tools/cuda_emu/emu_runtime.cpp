#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <vector>
#include <cstdio>
#include <mutex>
#include <map>
#include "cublasLt.h"
namespace braid::detail {
float half_to_float(uint16_t); float bfloat16_to_float(uint16_t); uint16_t float_to_half(float); uint16_t float_to_bfloat16(float);
}
namespace {
thread_local int current = 0;
std::mutex mu;
std::map<void*, size_t> live;
size_t used = 0, cached = 0;
int count() { return std::getenv("EMU_NO_DEVICE") ? -1 : 1; }
}  // namespace
cudaError_t cudaGetDeviceCount(int* n) { if (count() < 0) return emu::fail(cudaErrorInsufficientDriver); *n = count(); return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = current; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { if (d < 0 || d >= count()) return emu::fail(cudaErrorInvalidValue); current = d; return cudaSuccess; }
cudaError_t cudaGetLastError() { cudaError_t e = emu::last_error; emu::last_error = cudaSuccess; return e; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) { case cudaSuccess: return "cudaSuccess"; case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration"; case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    default: return "cudaErrorOther"; }
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaErrorMemoryAllocation ? "out of memory" : "emulated error"; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = new EmuStream{current}; return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* p, int d) { *p = new EmuPool{d}; return cudaSuccess; }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr a, void* v) {
  if (a != cudaMemPoolAttrReleaseThreshold || *static_cast<uint64_t*>(v) != UINT64_MAX) return emu::fail(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr a, void* v) {
  std::lock_guard<std::mutex> l(mu);
  if (a == cudaMemPoolAttrReservedMemCurrent) *static_cast<uint64_t*>(v) = used + cached;
  else if (a == cudaMemPoolAttrUsedMemCurrent) *static_cast<uint64_t*>(v) = used;
  else return emu::fail(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { std::lock_guard<std::mutex> l(mu); cached = 0; return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = std::getenv("EMU_SMS") ? std::atoi(std::getenv("EMU_SMS")) : 2; return cudaSuccess; }
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) {
  if (!s) return emu::fail(cudaErrorInvalidValue);
  if (n > (size_t{1} << 40)) return emu::fail(cudaErrorMemoryAllocation);
  void* q = std::aligned_alloc(256, (n + 255) / 256 * 256);
  std::memset(q, 0xA5, n);  // garbage, so that a kernel that forgets an element is caught
  std::lock_guard<std::mutex> l(mu);
  live[q] = n;
  used += n;
  cached -= std::min(cached, n);
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::lock_guard<std::mutex> l(mu);
  auto it = live.find(p);
  if (it == live.end()) { std::fprintf(stderr, "EMU: bad free %p\n", p); std::abort(); }
  used -= it->second; cached += it->second; live.erase(it); std::free(p);
  return cudaSuccess;
}
static void check_ptr(const void* p, size_t n) {
  std::lock_guard<std::mutex> l(mu);
  auto it = live.upper_bound(const_cast<void*>(p));
  if (it == live.begin()) { std::fprintf(stderr, "EMU: %p is not device memory\n", p); std::abort(); }
  --it;
  const char* b = static_cast<const char*>(it->first);
  if (static_cast<const char*>(p) + n > b + it->second) { std::fprintf(stderr, "EMU: %p + %zu out of bounds\n", p, n); std::abort(); }
}
void emu_check_device(const void* p, size_t n) { check_ptr(p, n); }  // for emu_cudnn.cpp
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t) {
  if (k != cudaMemcpyHostToDevice) check_ptr(s, n);
  if (k != cudaMemcpyDeviceToHost) check_ptr(d, n);
  std::memmove(d, s, n);
  return cudaSuccess;
}
// Page-locked host memory is ordinary host memory here (never device memory: check_ptr refuses it).
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
  *p = std::aligned_alloc(64, (n + 63) / 64 * 64);
  return *p ? cudaSuccess : emu::fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { check_ptr(d, n); std::memset(d, v, n); return cudaSuccess; }

// ---- cuBLAS ----
cublasStatus_t cublasCreate(cublasHandle_t* h) { *h = new EmuBlas{nullptr}; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->s = s; return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusName(cublasStatus_t s) { return s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE" : s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED" : "CUBLAS_STATUS_OTHER"; }
const char* cublasGetStatusString(cublasStatus_t) { return "emulated"; }
static double load(const void* p, cudaDataType_t t, long long i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16F: return braid::detail::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16BF: return braid::detail::bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  std::abort();
}
static cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha,
                           const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
                           const void* beta, void* C, cudaDataType_t ct, int ldc, cublasComputeType_t compute) {
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m)) {
    std::fprintf(stderr, "EMU gemm invalid: ta %d tb %d m %d n %d k %d lda %d ldb %d ldc %d\n", ta, tb, m, n, k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const bool ok = (at == bt) && ((at == CUDA_R_32F && ct == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F || tf32)) ||
                                 (at == CUDA_R_64F && ct == CUDA_R_64F && compute == CUBLAS_COMPUTE_64F) ||
                                 ((at == CUDA_R_16F || at == CUDA_R_16BF) && (ct == CUDA_R_32F || ct == at) &&
                                  compute == CUBLAS_COMPUTE_32F));
  if (!ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  const double al = compute == CUBLAS_COMPUTE_64F ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = compute == CUBLAS_COMPUTE_64F ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l) {
        const double a = load(A, at, ta == CUBLAS_OP_N ? i + static_cast<long long>(l) * lda : l + static_cast<long long>(i) * lda);
        const double b = load(B, bt, tb == CUBLAS_OP_N ? l + static_cast<long long>(j) * ldb : j + static_cast<long long>(l) * ldb);
        s += tf32 ? static_cast<double>(emu_tf32(static_cast<float>(a))) * emu_tf32(static_cast<float>(b)) : a * b;
      }
      const long long c = i + static_cast<long long>(j) * ldc;
      double v = al * s + (be != 0 ? be * load(C, ct, c) : 0);
      // A half C is rounded once from float32, as cuBLAS rounds its float32 result.
      if (ct == CUDA_R_32F) static_cast<float*>(C)[c] = static_cast<float>(v);
      else if (ct == CUDA_R_64F) static_cast<double*>(C)[c] = v;
      else if (ct == CUDA_R_16F) static_cast<uint16_t*>(C)[c] = braid::detail::float_to_half(static_cast<float>(v));
      else static_cast<uint16_t*>(C)[c] = braid::detail::float_to_bfloat16(static_cast<float>(v));
    }
  return CUBLAS_STATUS_SUCCESS;
}
float emu_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;  // finite: round, ties away
  std::memcpy(&x, &u, 4);
  return x;
}
static size_t esize(cudaDataType_t t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t at, int lda, const void* B,
                            cudaDataType_t bt, int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  return gemm(ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType_t at, int lda,
                                          long long sa, const void* B, cudaDataType_t bt, int ldb, long long sb,
                                          const void* beta, void* C, cudaDataType_t ct, int ldc, long long sc,
                                          int batches, cublasComputeType_t compute, cublasGemmAlgo_t) {
  for (int i = 0; i < batches; ++i) {
    cublasStatus_t s = gemm(ta, tb, m, n, k, alpha, static_cast<const char*>(A) + i * sa * esize(at), at, lda,
                            static_cast<const char*>(B) + i * sb * esize(bt), bt, ldb, beta,
                            static_cast<char*>(C) + i * sc * esize(ct), ct, ldc, compute);
    if (s) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new EmuEvent{-1}; return cudaSuccess; }
// A host function launched on a stream holds every stream until a cudaStreamSynchronize runs it
// (the test releases it first): events recorded meanwhile complete only then, which is how a
// collective stuck behind a blocked stream looks to the NCCL group's watchdog.
namespace {
std::mutex host_mu;
std::vector<std::pair<cudaHostFn_t, void*>> held_fns;
bool holding() {
  std::lock_guard<std::mutex> l(host_mu);
  return !held_fns.empty();
}
double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!s) return emu::fail(cudaErrorInvalidValue);
  e->held = holding();
  e->ms = e->held ? -1 : now_ms();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e->ms < 0 && e->held && !holding()) e->ms = now_ms();
  // Not an error: the runtime does not record it for cudaGetLastError (a kernel launch checked after
  // a query of a pending event must not see it).
  return e->ms < 0 ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { *ms = static_cast<float>(b->ms - a->ms); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
// Streams run their work as it is queued, so an event is complete once recorded (unless a host
// function holds the streams) and waiting on one is a no-op.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t, unsigned) { return s ? cudaSuccess : emu::fail(cudaErrorInvalidValue); }
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) { *least = 0; *greatest = -5; return cudaSuccess; }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) { *s = new EmuStream{current}; return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { delete s; return cudaSuccess; }
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) { std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", device); return cudaSuccess; }
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  std::lock_guard<std::mutex> l(host_mu);
  held_fns.emplace_back(fn, data);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  std::vector<std::pair<cudaHostFn_t, void*>> fns;
  {
    std::lock_guard<std::mutex> l(host_mu);
    fns = held_fns;
  }
  for (auto& [fn, data] : fns) fn(data);
  std::lock_guard<std::mutex> l(host_mu);
  held_fns.clear();
  return cudaSuccess;
}

// NCCL for a world of one, with non-blocking communicators whose calls report ncclInProgress once,
// as a real non-blocking communicator may: every collective is a copy from send to receive buffer.
#include "nccl.h"
struct ncclComm {
  int nranks = 1;
  int pending = 0;  // calls that have returned ncclInProgress and not yet been polled
  bool aborted = false;
  std::deque<std::pair<const void*, size_t>> sends;  // sends to self not yet received (bytes)
};
namespace {
size_t nccl_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
ncclResult_t in_progress(ncclComm_t c) {
  if (c->aborted) return ncclInvalidUsage;
  c->pending = 1;
  return ncclInProgress;
}
ncclResult_t copy(const void* s, void* r, size_t count, ncclDataType_t t, ncclComm_t c) {
  if (c->aborted) return ncclInvalidUsage;
  if (s != r) std::memmove(r, s, count * nccl_size(t));
  return in_progress(c);
}
}  // namespace
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated NCCL error"; }
const char* ncclGetLastError(ncclComm_t) { return "emulated"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { std::memset(id, 7, sizeof *id); return ncclSuccess; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t* c, int nranks, ncclUniqueId, int rank, ncclConfig_t* config) {
  if (nranks != 1 || rank != 0) return ncclInvalidArgument;
  *c = new ncclComm;
  return config && !config->blocking ? in_progress(*c) : ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* r) {
  *r = c->aborted ? ncclRemoteError : c->pending-- > 0 ? ncclInProgress : ncclSuccess;
  if (c->pending < 0) c->pending = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) { c->aborted = true; return ncclSuccess; }
ncclResult_t ncclCommFinalize(ncclComm_t c) { return in_progress(c); }
ncclResult_t ncclCommDestroy(ncclComm_t c) { delete c; return ncclSuccess; }
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t, ncclComm_t c, cudaStream_t) {
  return copy(s, r, n, t, c);
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t) {
  return root == 0 ? copy(s, r, n, t, c) : ncclInvalidArgument;
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
  return copy(s, r, n, t, c);
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t, ncclComm_t c,
                               cudaStream_t) {
  return copy(s, r, n, t, c);
}
// Send/recv to self, which NCCL allows inside one group (ncclGroupStart/End): a send outside a
// group, or a group that ends with a send nobody received, would wait forever on a GPU, so here it
// is an error; a receive is matched with the oldest send of the same size.
namespace {
int group_depth = 0;
std::vector<ncclComm_t> group_comms;
}  // namespace
ncclResult_t ncclGroupStart() { ++group_depth; return ncclSuccess; }
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  ncclResult_t r = ncclSuccess;
  for (ncclComm_t c : group_comms)
    if (!c->sends.empty()) { c->sends.clear(); r = ncclInvalidUsage; }
  group_comms.clear();
  return r;
}
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
  if (c->aborted) return ncclInvalidUsage;
  if (peer != 0 || group_depth == 0) return ncclInvalidUsage;
  c->sends.emplace_back(s, n * nccl_size(t));
  group_comms.push_back(c);
  return in_progress(c);
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
  if (c->aborted) return ncclInvalidUsage;
  if (peer != 0 || c->sends.empty() || c->sends.front().second != n * nccl_size(t)) return ncclInvalidUsage;
  if (r != c->sends.front().first) std::memmove(r, c->sends.front().first, n * nccl_size(t));
  c->sends.pop_front();
  return in_progress(c);
}
