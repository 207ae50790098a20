// What the CUDA backend's cuDNN convolutions (src/backend/cuda/cudnn_conv.cpp) keep in libbraid, so
// that code and tests reach it without the CUDA module: whether algorithms are timed or taken from
// cuDNN's heuristics, and counts of how each convolution's plan was found.
#pragma once

#include <atomic>
#include <cstdint>

namespace braid::detail {

/// Whether cuDNN times its candidate algorithms on a geometry's first use (cudnnFind*) instead of
/// taking its heuristics' first choice: BRAID_CUDNN_BENCHMARK, or braid::set_cudnn_benchmark.
bool cudnn_benchmark_on();

/// How the convolutions' plans were found since the process started (Note [cuDNN convolutions]):
/// planned by the heuristics, planned by timing, reused from the per-device table, and declined
/// (cuDNN refused the case, so the composite ran); and the passes cuDNN ran.
struct CudnnConvCounts {
  std::atomic<int64_t> heuristic{0}, benchmarked{0}, reused{0}, declined{0}, ran{0};
};
CudnnConvCounts& cudnn_conv_counts();

}  // namespace braid::detail
