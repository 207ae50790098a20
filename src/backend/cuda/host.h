// The host side of every CUDA primitive, shared by the .cu files that hold each primitive's kernel
// and its CudaBackend method together: where it runs (Launch: the anchor operand's device made
// current, its stream, every operand checked to live there) and the tensors unpacked into device
// pointers and strided indexers (strided_host.h).
#pragma once

#include <array>
#include <functional>
#include <initializer_list>

#include "backend/cuda/runtime.h"
#include "backend/cuda/strided_host.h"
#include "core/internal.h"

namespace braid::detail::cuda {

/// Where a primitive runs: the device of its anchor operand, made current while in scope, and its
/// stream. Every other operand must live there (TypeError naming the primitive and both devices, as
/// on the shadow device), since a kernel cannot read another device's or the host's memory.
class Launch {
 public:
  Launch(const char* op, const Tensor& anchor, std::initializer_list<std::reference_wrapper<const Tensor>> operands)
      : device(anchor.device().index), stream(cuda::stream(device)), guard_(device) {
    for (const Tensor& t : operands)
      BRAID_CHECK_T(TypeError, !t.defined() || t.device() == anchor.device(), op, ": operands on different devices (",
                    t.device().str(), " and ", anchor.device().str(), "); move them with .to(device) first");
  }
  const int device;
  const cudaStream_t stream;

 private:
  DeviceGuard guard_;
};

/// t's first element on the device; null for an undefined tensor (an absent bias or output).
inline void* ptr(const Tensor& t) { return t.defined() ? device_data(t) : nullptr; }

/// The Indexer over shape with each operand's strides, in order.
template <int N>
Indexer<N> indexer(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  std::array<const int64_t*, N> strides{};
  for (int k = 0; k < N; ++k) strides[k] = operands[k]->strides().data();
  return make_indexer<N>(shape, strides);
}

}  // namespace braid::detail::cuda
