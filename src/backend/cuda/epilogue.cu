// matmul_epilogue's steps after the product (Note [Products through cuBLASLt] in matmul_lt.cpp):
// one pass over the (m, n) result, each element through every step in order, each step one
// float32 operation (no contraction: -fmad=false), as the ops compute them.
#include "backend/cuda/common.cuh"

namespace braid::detail::cuda {
namespace {

__global__ void __launch_bounds__(kThreads) epilogue_kernel(float* out, int64_t total, int64_t n, EpilogueSteps steps) {
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    float v = out[idx];
    for (int s = 0; s < steps.count; ++s) {
      const EpilogueOperand& e = steps.step[s];
      const float x = e.data == nullptr ? e.k : e.size == 1 ? e.data[0] : e.size == n ? e.data[idx % n] : e.data[idx];
      switch (e.kind) {
        case ChainStep::Kind::Add: v = v + x; break;
        case ChainStep::Kind::Sub: v = v - x; break;
        case ChainStep::Kind::Mul: v = v * x; break;
        default: v = v / x; break;
      }
    }
    out[idx] = v;
  }
}

}  // namespace

void launch_epilogue_steps(float* out, int64_t m, int64_t n, const EpilogueSteps& steps, cudaStream_t stream) {
  const int64_t total = m * n;
  if (total == 0 || steps.count == 0) return;
  for (int s = 0; s < steps.count; ++s) {
    const EpilogueOperand& e = steps.step[s];
    const ChainStep::Kind kind = e.kind;
    if (kind != ChainStep::Kind::Add && kind != ChainStep::Kind::Sub && kind != ChainStep::Kind::Mul &&
        kind != ChainStep::Kind::Div)
      throw ValueError("matmul_epilogue: a step other than Add, Sub, Mul or Div");
    if (e.data && e.size != 1 && e.size != n && e.size != total)
      throw ValueError(cat("matmul_epilogue: an operand of ", e.size, " values for a (", m, ", ", n, ") product"));
  }
  epilogue_kernel<<<grid_for(total), kThreads, 0, stream>>>(out, total, n, steps);
  check_launch("matmul_epilogue", "epilogue_kernel");
}

}  // namespace braid::detail::cuda
