// The shadow device's backend: the CPU kernels on memory of the shadow device's own (see Note
// [The shadow device] in shadow_backend.cpp).
#pragma once

#include "backend/backend.h"

namespace braid::detail {

/// The process's one shadow backend (devices shadow:0 and shadow:1).
Backend& shadow_backend();

}  // namespace braid::detail
