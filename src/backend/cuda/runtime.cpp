// Per-device CUDA state (stream, pool), the current-device guard, the error helpers and the
// stream-ordered allocator behind CudaBackend::allocate and the kernels' scratch memory.
#include "backend/cuda/runtime.h"

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>

#include "braid/device.h"
#include "braid/error.h"

namespace braid::detail::cuda {

void throw_cuda_error(cudaError_t status, const char* op, const char* call) {
  const char* name = cudaGetErrorName(status);
  const char* what = cudaGetErrorString(status);
  (void)cudaGetLastError();  // clear a non-sticky error so that it is not reported twice
  throw Error(cat("CUDA error in ", op, ": ", call, " returned ", name ? name : "an unknown status", " (",
                  what ? what : "no description", ")"));
}

void check_launch(const char* op, const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, op, kernel);
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "select device", "cudaGetDevice");
  if (current != device) {
    check(cudaSetDevice(device), "select device", "cudaSetDevice");
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

namespace {

struct DeviceState {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  int sms = 0;
};

// Made once per device and never destroyed: tensors freed during static destruction still return
// their memory through the stream (Note [The CUDA backend]).
DeviceState& state(int device) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<DeviceState*, kMaxDevices> states{};
  BRAID_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device, " out of range [0, ", kMaxDevices,
              ")");
  std::call_once(once[static_cast<size_t>(device)], [device] {
    DeviceGuard guard(device);
    auto s = std::make_unique<DeviceState>();
    check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "device set-up", "cudaStreamCreateWithFlags");
    check(cudaDeviceGetDefaultMemPool(&s->pool, device), "device set-up", "cudaDeviceGetDefaultMemPool");
    // Keep freed memory in the pool (the default threshold of 0 returns it at every synchronisation).
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    check(cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &keep), "device set-up",
          "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
    check(cudaDeviceGetAttribute(&s->sms, cudaDevAttrMultiProcessorCount, device), "device set-up",
          "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    states[static_cast<size_t>(device)] = s.release();
  });
  return *states[static_cast<size_t>(device)];
}

}  // namespace

cudaStream_t stream(int device) { return state(device).stream; }
int sm_count(int device) { return state(device).sms; }

int64_t pool_cached_bytes(int device) {
  cudaMemPool_t pool = state(device).pool;
  uint64_t reserved = 0, used = 0;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), "memory_cached",
        "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemCurrent)");
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), "memory_cached",
        "cudaMemPoolGetAttribute(cudaMemPoolAttrUsedMemCurrent)");
  return reserved > used ? static_cast<int64_t>(reserved - used) : 0;
}

void release_pool(int device) {
  DeviceGuard guard(device);
  DeviceState& s = state(device);
  // Frees queued on the stream reach the pool only when the stream gets there.
  check(cudaStreamSynchronize(s.stream), "empty_cache", "cudaStreamSynchronize");
  check(cudaMemPoolTrimTo(s.pool, 0), "empty_cache", "cudaMemPoolTrimTo");
}

void* device_malloc(int device, int64_t nbytes) {
  DeviceGuard guard(device);
  DeviceState& s = state(device);
  void* p = nullptr;
  cudaError_t status = cudaMallocAsync(&p, static_cast<size_t>(nbytes), s.stream);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    const int64_t cached = pool_cached_bytes(device);
    release_pool(device);  // give the cache back and retry once
    status = cudaMallocAsync(&p, static_cast<size_t>(nbytes), s.stream);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw Error(cat("out of memory allocating ", nbytes, " bytes on ", Device::cuda(device).str(), " (", cached,
                      " bytes were cached and have been freed)"));
    }
  }
  if (status != cudaSuccess)
    throw_cuda_error(status, cat("allocate (", nbytes, " bytes on ", Device::cuda(device).str(), ")").c_str(),
                     "cudaMallocAsync");
  return p;
}

void device_free(int device, void* p) noexcept {
  // At exit the runtime may be unloading (cudaErrorCudartUnloading) and the memory goes with the
  // process; a destructor has no one to report to, and a sticky fault fails the next primitive.
  try {
    cudaStream_t s = state(device).stream;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) return;
    if (current != device && cudaSetDevice(device) != cudaSuccess) return;
    if (cudaFreeAsync(p, s) != cudaSuccess) (void)cudaGetLastError();
    if (current != device) (void)cudaSetDevice(current);
  } catch (...) {
  }
}

}  // namespace braid::detail::cuda
