// The epilogue of a convolution computed on the CPU outside oneDNN (a small pointwise convolution,
// the squeeze-and-excitation block's products): bias, activation, affine, one run of values at a
// time. Internal to the CPU backend.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace braid::detail {

/// y[0, n) = act(y + *bias) * e.scale + e.shift, in that order and as the unary kernels compute
/// each step (no bias added where bias is null, no multiply at scale 1, no add at shift 0), so
/// that it is bitwise the composite's ops. e.residual is the caller's.
void epilogue_run(const Epilogue& e, const float* bias, float* y, int64_t n);

}  // namespace braid::detail
