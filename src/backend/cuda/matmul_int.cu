// Integer matmul (int32, int64), which cuBLAS does not provide: one thread per output element, a
// wrapping dot product over K as the CPU's loop_matmul (wrapping sums do not depend on the order).
// Floating matmul goes to cuBLAS (matmul.cpp).
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace braid::detail::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) int_matmul_kernel(IntMatrix a, IntMatrix b, Indexer<2> batch, T* out,
                                                              int64_t batches, int64_t m, int64_t n, int64_t k) {
  using U = std::make_unsigned_t<T>;
  const int64_t total = batches * m * n;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t j = idx % n, row = idx / n, i = row % m;
    int64_t off[2];
    batch.offsets(row / m, off);
    const T* pa = static_cast<const T*>(a.data) + off[0] + i * a.rs;  // (K) with stride a.cs
    const T* pb = static_cast<const T*>(b.data) + off[1] + j * b.cs;  // (K) with stride b.rs
    U acc = 0;
    for (int64_t kk = 0; kk < k; ++kk) acc += U(pa[kk * a.cs]) * U(pb[kk * b.rs]);
    out[idx] = T(acc);
  }
}

}  // namespace

void launch_int_matmul(DType type, const IntMatrix& a, const IntMatrix& b, const Indexer<2>& batch, void* out,
                       int64_t batches, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t total = batches * m * n;
  if (total == 0) return;
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    int_matmul_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(a, b, batch, static_cast<T*>(out), batches, m, n, k);
    check_launch("matmul", "int_matmul_kernel");
  };
  if (type == DType::Int32) return run(Tag<int32_t>{});
  if (type == DType::Int64) return run(Tag<int64_t>{});
  unsupported_dtype("matmul", type);
}

}  // namespace braid::detail::cuda
