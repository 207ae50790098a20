// The CUDA runtime as the backend's host code uses it: status checks that turn CUDA codes into braid
// errors, the current-device guard, each device's stream and memory pool, and stream-ordered device
// memory (Note [The CUDA backend] in cuda_backend.cpp). Included by the .cpp and the .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace braid::detail::cuda {

/// The process's devices are indexed below this (the memory statistics' limit, src/core/storage.cpp).
constexpr int kMaxDevices = 16;

/// Throws braid::Error naming op (the primitive), call (the CUDA call) and the status.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* op, const char* call);

inline void check(cudaError_t status, const char* op, const char* call) {
  if (status != cudaSuccess) throw_cuda_error(status, op, call);
}

/// Checks that the kernel just launched for op was accepted (a bad configuration fails here; a
/// fault while it runs fails the next call that synchronises, naming that call).
void check_launch(const char* op, const char* kernel);

/// Makes device current on this thread while in scope and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// The non-blocking stream every primitive and transfer on device runs on (made on first use).
cudaStream_t stream(int device);
/// Streaming multiprocessors of device (for sizing grids).
int sm_count(int device);

/// nbytes of device memory, ordered on the device's stream; on exhaustion the pool's cache is
/// released and the allocation retried once, then braid::Error names the bytes asked and cached.
void* device_malloc(int device, int64_t nbytes);
/// Returns p to the pool in stream order. Never throws: it runs in destructors, also at exit.
void device_free(int device, void* p) noexcept;
/// Bytes the pool keeps for reuse (reserved but not in use).
int64_t pool_cached_bytes(int device);
/// Waits for the stream, then releases every unused byte of the pool to the driver.
void release_pool(int device);

/// Device memory for the duration of one primitive (partial sums, packed operands, flags).
class Scratch {
 public:
  Scratch(int device, int64_t nbytes) : device_(device), p_(nbytes > 0 ? device_malloc(device, nbytes) : nullptr) {}
  ~Scratch() {
    if (p_) device_free(device_, p_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  int device_;
  void* p_;
};

}  // namespace braid::detail::cuda
