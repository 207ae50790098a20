// Square float32 matmul, braid::matmul against a direct cblas_sgemm on the same OpenBLAS. braid
// allocates its output each call, as user code does; the baseline writes into a preallocated buffer,
// so the ratio shows everything braid adds on top of BLAS (validation, allocation, dispatch).
#include <benchmark/benchmark.h>
#include <braid/braid.h>
#include <cblas.h>

#include <vector>

namespace {

void set_flops(benchmark::State& state, int64_t n) {
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * double(n) * double(n) * double(n), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void matmul_braid(benchmark::State& state) {
  const int64_t n = state.range(0);
  braid::Generator gen(1);
  braid::Tensor a = braid::randn({n, n}, braid::kFloat32, &gen);
  braid::Tensor b = braid::randn({n, n}, braid::kFloat32, &gen);
  for (auto _ : state) {
    braid::Tensor c = braid::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
}

void matmul_cblas(benchmark::State& state) {
  const int64_t n = state.range(0);
  braid::Generator gen(1);
  braid::Tensor a = braid::randn({n, n}, braid::kFloat32, &gen);
  braid::Tensor b = braid::randn({n, n}, braid::kFloat32, &gen);
  std::vector<float> c(static_cast<size_t>(n * n));
  const int ni = static_cast<int>(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a.data<float>(), ni, b.data<float>(),
                ni, 0.0f, c.data(), ni);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
}

}  // namespace

BENCHMARK(matmul_braid)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(matmul_cblas)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime()->Unit(benchmark::kMillisecond);
