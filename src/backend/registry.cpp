// The one dispatch point from a tensor's device to the backend that implements its primitives.
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

Backend& backend_for(Device device) {
  switch (device.type) {
    case DeviceType::CPU: return cpu_backend();
    case DeviceType::CUDA: break;
  }
  throw NotImplementedError(cat("no backend for device ", device.str(), " in this build of braid"));
}

}  // namespace braid::detail
