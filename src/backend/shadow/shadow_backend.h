// The shadow device's backend: the CPU kernels on memory of the shadow device's own (see Note
// [The shadow device] in shadow_backend.cpp).
#pragma once

#include "backend/backend.h"

namespace braid::detail {

/// The process's one shadow backend (devices shadow:0 and shadow:1).
Backend& shadow_backend();
/// Page-locked blocks the shadow backend has handed out so far, and those not yet given back: its
/// allocate_pinned is ordinary memory with counts, so CI can see that staging asks for it.
int64_t shadow_pinned_allocations();
int64_t shadow_pinned_live();

}  // namespace braid::detail
