// The one dispatch point from a tensor's device to the backend that implements its primitives, and
// the defaults of the optional ones.
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/shadow/shadow_backend.h"
#include "braid/config.h"
#ifdef BRAID_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace braid {

namespace {
detail::Backend* find_backend(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return &detail::cpu_backend();
    case DeviceType::Shadow: return &detail::shadow_backend();
    case DeviceType::CUDA:
#ifdef BRAID_HAVE_CUDA
      return &detail::cuda_backend();
#else
      return nullptr;
#endif
  }
  return nullptr;
}
}  // namespace

int device_count(DeviceType type) {
  detail::Backend* b = find_backend(type);
  return b ? b->device_count() : 0;
}

bool device_available(Device device) { return device.index >= 0 && device.index < device_count(device.type); }

namespace detail {

// A backend without its own kernels composes every convolution, optimizer step and BatchNorm pass
// (Note [Optional primitives]).
bool Backend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}
bool Backend::conv2d_backward_input(const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}
bool Backend::conv2d_backward_weight(const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}
bool Backend::adam_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamStep&) {
  return false;
}
bool Backend::channel_moments(const Tensor&, const Tensor&, const Tensor&) { return false; }
bool Backend::channel_grad_sums(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;
}
bool Backend::channel_affine(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) {
  return false;
}

Backend& backend_for(Device device) {
  Backend* b = find_backend(device.type);
  if (b && device.index >= 0 && device.index < b->device_count()) return *b;
  if (!b) throw NotImplementedError(cat("no backend for device ", device.str(), " in this build of braid"));
  throw NotImplementedError(cat("device ", device.str(), " is not available: this process has ", b->device_count(),
                                " device(s) of its type"));
}

}  // namespace detail
}  // namespace braid
