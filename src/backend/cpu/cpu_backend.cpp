// The CPU backend's single instance. A function-local static, so that it exists before first use
// whatever the order of static initialisation, and the registry (backend/registry.cpp) reaches it
// through cpu_backend() rather than through a self-registering global.
#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace braid::detail
