// The CUDA backend's instance, its memory (a stream-ordered caching allocator over the device's
// memory pool), host transfers, synchronisation, events and device count. Each primitive is in the
// .cu file of its kernels, its host side included (host.h); matmul is in matmul.cpp and
// matmul_lt.cpp (cuBLAS, cuBLASLt).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "backend/cuda/runtime.h"
#include "braid/config.h"
#include "distributed/internal.h"

namespace braid::detail {

// Note [The CUDA backend]
// Streams. Each device has one non-blocking stream (runtime.cpp, made on first use) that every
// primitive, allocation, free and transfer of that device is queued on, so they are ordered among
// themselves without events, and none waits for work that other libraries queue on the legacy
// default stream. copy_to_host and copy_from_host synchronise the stream before they return, so
// host memory is safe to read or reuse then (Backend's contract); synchronize() waits for it. Each
// call makes the operands' device current (DeviceGuard) and restores the caller's, so two GPUs in
// one process each run their own work.
//
// Memory. allocate is cudaMallocAsync on the device's stream from its default memory pool, whose
// release threshold is set to UINT64_MAX: freed blocks stay in the pool for reuse instead of going
// back to the driver at each synchronisation, which is the cache (cached_bytes = the pool's
// reserved bytes minus those in use). deallocate is cudaFreeAsync on the same stream, so a tensor
// may be freed while kernels that read it are still queued. empty_cache waits for the stream and
// trims the pool to 0. When an allocation fails, the cache is released and the allocation retried
// once; then braid::Error names the bytes asked for and the bytes that were cached, as the CPU's
// allocator does. Kernels' scratch memory (partial sums, packed matmul operands, cuBLASLt's
// workspace) comes from the same pool. The statistics (memory_allocated and friends) are counted
// in storage.cpp as for every device.
//
// Errors. Every CUDA and cuBLAS status other than success becomes braid::Error naming the
// primitive, the call and the status's name and text; launches are checked with cudaGetLastError.
// A fault inside a kernel is asynchronous: the next call that synchronises reports it (naming that
// call), and the CUDA context is unusable after it, as in every CUDA program. Nothing calls exit or
// abort. Without a driver or a GPU, device_count is 0 (never an error), so a build with CUDA runs
// on a machine without one and creating a tensor on cuda:0 is the registry's NotImplementedError.
//
// Kernels. The host code (built by g++) unpacks tensors into device pointers, sizes and a strided
// Indexer (strided.h; dimensions coalesced as the CPU's StridedLoop does, so contiguous operands
// index without division); each .cu file holds one kind of kernel with grid-stride loops and 64-bit
// indices, instantiated once per (op, dtype). The semantics are the CPU backend's, which the
// parity tests (tests/test_cuda_backend.cpp) check op by op. The .cu files are compiled with
// -fmad=false, so that a * b + c rounds twice as it does in braid's CPU code (GCC does not contract
// under -std=c++20): iota, random draws, pooling, col2im and depthwise convolution then equal the
// CPU bit for bit, while exp, log, tanh, pow, ... (libdevice here, glibc and fast_math.h there) and
// the order of summation in reductions, matmul and scatter_add's atomics differ in the last bits.
//
// Convolutions run on cuDNN where the build has it (Note [cuDNN convolutions] in cudnn_conv.cpp),
// else as im2col + a cuBLAS GEMM, as on the CPU.
//
// Not done. Device-to-device transfers stage through the host (Note [Transfers]
// in src/core/tensor.cpp), where cudaMemcpyPeerAsync would do; work on other streams (NCCL) would
// wait on a CUDA event recorded on this one (braid::Event records one, for timing). Kernels are
// plain (no vectorised loads, no CUDA graphs).

namespace {
int index_of(Device device) { return device.index; }
}  // namespace

void* CudaBackend::allocate(Device device, int64_t nbytes) { return cuda::device_malloc(index_of(device), nbytes); }

void CudaBackend::deallocate(Device device, void* p, int64_t) { cuda::device_free(index_of(device), p); }

int64_t CudaBackend::cached_bytes(Device device) {
  cuda::DeviceGuard guard(index_of(device));
  return cuda::pool_cached_bytes(index_of(device));
}

void CudaBackend::empty_cache(Device device) { cuda::release_pool(index_of(device)); }

// Note [Pinned host memory]
// empty_pinned (the staging buffers of the MPI group's CUDA tensors, Note [Staging device tensors])
// asks for page-locked memory, which cudaMemcpy moves by DMA without the driver's bounce buffer.
// Locking pages costs about as much as the copy it speeds up, so blocks are kept by size for reuse,
// as PyTorch's caching host allocator does (a data-parallel job stages the same bucket sizes every
// step), up to kPinnedCache bytes; past that they go back with cudaFreeHost. The blocks are
// portable (usable with every GPU of the process). When the system refuses to lock more, the
// caller gets nullptr and uses ordinary memory.
namespace {
constexpr int64_t kPinnedCache = int64_t{1} << 30;
std::mutex g_pinned_mu;
std::multimap<int64_t, void*> g_pinned_free;  // size -> block
int64_t g_pinned_cached = 0;
}  // namespace

void* CudaBackend::allocate_pinned(Device, int64_t nbytes) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    auto it = g_pinned_free.find(nbytes);
    if (it != g_pinned_free.end()) {
      void* p = it->second;
      g_pinned_free.erase(it);
      g_pinned_cached -= nbytes;
      return p;
    }
  }
  void* p = nullptr;
  if (cudaHostAlloc(&p, static_cast<size_t>(nbytes), cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // not a sticky error: the caller falls back to ordinary memory
    return nullptr;
  }
  return p;
}

void CudaBackend::deallocate_pinned(Device, void* p, int64_t nbytes) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    if (g_pinned_cached + nbytes <= kPinnedCache) {
      g_pinned_free.emplace(nbytes, p);
      g_pinned_cached += nbytes;
      return;
    }
  }
  cudaFreeHost(p);
}

void CudaBackend::copy_from_host(Device device, const void* host, void* dev, int64_t nbytes) {
  if (nbytes <= 0) return;
  const int d = index_of(device);
  cuda::DeviceGuard guard(d);
  cudaStream_t s = cuda::stream(d);
  cuda::check(cudaMemcpyAsync(dev, host, static_cast<size_t>(nbytes), cudaMemcpyHostToDevice, s), "copy_from_host",
              "cudaMemcpyAsync");
  cuda::check(cudaStreamSynchronize(s), "copy_from_host", "cudaStreamSynchronize");
}

void CudaBackend::copy_to_host(Device device, const void* dev, void* host, int64_t nbytes) {
  if (nbytes <= 0) return;
  const int d = index_of(device);
  cuda::DeviceGuard guard(d);
  cudaStream_t s = cuda::stream(d);
  cuda::check(cudaMemcpyAsync(host, dev, static_cast<size_t>(nbytes), cudaMemcpyDeviceToHost, s), "copy_to_host",
              "cudaMemcpyAsync");
  cuda::check(cudaStreamSynchronize(s), "copy_to_host", "cudaStreamSynchronize");
}

void CudaBackend::synchronize(Device device) {
  const int d = index_of(device);
  cuda::DeviceGuard guard(d);
  cuda::check(cudaStreamSynchronize(cuda::stream(d)), "synchronize", "cudaStreamSynchronize");
}

int CudaBackend::device_count() {
  // Asked once: without a driver (cudaErrorInsufficientDriver) or a GPU (cudaErrorNoDevice) the
  // answer is 0, and the error is cleared so that it is not reported by a later call.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return std::min(n, cuda::kMaxDevices);  // the memory statistics count 16 devices
  }();
  return count;
}

namespace {

// A CUDA event recorded on a device's stream (with timing, as torch.cuda.Event(enable_timing=True)).
struct CudaEvent final : BackendEvent {
  int device = 0;
  cudaEvent_t event = nullptr;
  ~CudaEvent() override {
    if (event) (void)cudaEventDestroy(event);  // may run at exit, when the runtime is going away
  }
};

const CudaEvent& as_cuda(const BackendEvent& event) {
  const auto* e = dynamic_cast<const CudaEvent*>(&event);
  BRAID_ASSERT(e != nullptr, "event: not an event of the CUDA backend");
  return *e;
}

}  // namespace

std::shared_ptr<BackendEvent> CudaBackend::record_event(Device device) {
  const int d = index_of(device);
  cuda::DeviceGuard guard(d);
  auto e = std::make_shared<CudaEvent>();
  e->device = d;
  cuda::check(cudaEventCreate(&e->event), "Event::record", "cudaEventCreate");
  cuda::check(cudaEventRecord(e->event, cuda::stream(d)), "Event::record", "cudaEventRecord");
  return e;
}

bool CudaBackend::event_ready(const BackendEvent& event) {
  const CudaEvent& e = as_cuda(event);
  cuda::DeviceGuard guard(e.device);
  const cudaError_t status = cudaEventQuery(e.event);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not yet" is no error, and must not be reported by a later call
    return false;
  }
  cuda::check(status, "Event::ready", "cudaEventQuery");
  return true;
}

void CudaBackend::event_synchronize(const BackendEvent& event) {
  const CudaEvent& e = as_cuda(event);
  cuda::DeviceGuard guard(e.device);
  cuda::check(cudaEventSynchronize(e.event), "Event::synchronize", "cudaEventSynchronize");
}

double CudaBackend::event_elapsed_ms(const BackendEvent& start, const BackendEvent& end) {
  const CudaEvent &s = as_cuda(start), &e = as_cuda(end);
  cuda::DeviceGuard guard(e.device);
  for (const CudaEvent* x : {&s, &e})  // both complete, in whichever order they were recorded
    cuda::check(cudaEventSynchronize(x->event), "Event::elapsed_ms", "cudaEventSynchronize");
  float ms = 0;
  cuda::check(cudaEventElapsedTime(&ms, s.event, e.event), "Event::elapsed_ms", "cudaEventElapsedTime");
  return ms;
}

Backend& cuda_backend() {
  static CudaBackend backend;
  return backend;
}

}  // namespace braid::detail

// The entry point through which libbraid.so finds this backend (Note [The CUDA backend as a module]
// in meson.build). Loading the module also registers what it brings besides the backend: the NCCL
// group for CUDA tensors (Note [Native device groups] in distributed/staged_group.cpp).
extern "C" braid::detail::Backend* braid_cuda_backend() {
#ifdef BRAID_HAVE_NCCL
  static const bool registered = (braid::distributed::detail::register_nccl(), true);
  (void)registered;
#endif
  return &braid::detail::cuda_backend();
}
