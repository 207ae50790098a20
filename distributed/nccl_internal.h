// What the NCCL group (nccl_group.cpp) and NCCL's point-to-point transfers (nccl_p2p.cpp) share:
// status checks, dtypes, the events that mark points of a communication stream, and the GPU's
// identity. Included only by those two files, which are built into libbraid_cuda.so.
#pragma once

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "distributed/internal.h"
#include "src/backend/cuda/runtime.h"

namespace braid::distributed::detail {

inline void check_nccl(ncclResult_t r, const std::string& where, const char* call) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw DistributedError(::braid::detail::cat(where, ": ", call, " failed: ", ncclGetErrorString(r), " (",
                                              ncclGetLastError(nullptr), ")"));
}

inline ncclDataType_t nccl_dtype(DType d, const char* op) {
  switch (d) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Int8: return ncclInt8;
    case DType::UInt8:
    case DType::Bool: return ncclUint8;
  }
  throw TypeError(::braid::detail::cat(op, ": dtype ", dtype_name(d), " has no NCCL type"));
}

/// A CUDA event that records one point of a stream.
struct Event {
  explicit Event(int device) : device(device) {
    ::braid::detail::cuda::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "nccl",
                                 "cudaEventCreateWithFlags");
  }
  ~Event() {
    ::braid::detail::cuda::DeviceGuard guard(device);
    cudaEventDestroy(event);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  bool done() const { return cudaEventQuery(event) == cudaSuccess; }
  /// Records the event on s.
  void record(cudaStream_t s) { ::braid::detail::cuda::check(cudaEventRecord(event, s), "nccl", "cudaEventRecord"); }
  int device;
  cudaEvent_t event = nullptr;
};

/// "host:pci-bus-id" of device: two ranks with the same identity share one GPU, which NCCL refuses.
inline std::string gpu_identity(const Device& device) {
  char bus[64] = {0};
  ::braid::detail::cuda::check(cudaDeviceGetPCIBusId(bus, sizeof bus - 1, device.index), "nccl",
                               "cudaDeviceGetPCIBusId");
  return world_info().host + ":" + bus;
}

/// The NCCL point-to-point transport over host's ranks for device (nccl_p2p.cpp), shared by every
/// group over the same host group; nullptr where BRAID_NCCL or BRAID_NCCL_P2P is 0.
std::shared_ptr<DeviceP2P> make_nccl_p2p(const ProcessGroupPtr& host, const Device& device);

}  // namespace braid::distributed::detail
