// Memory-bound elementwise ops on 16M float32 (64 MB per tensor), braid against memcpy. Bytes
// processed count every byte an op must move (add/mul: two inputs read and one output written, exp:
// one of each), and memcpy_bytes/N copies N/2 bytes (read + write = N moved), so bytes/s compare directly.
#include <benchmark/benchmark.h>
#include <braid/braid.h>

#include <cstring>
#include <vector>

namespace {

constexpr int64_t kElements = int64_t{1} << 24;
constexpr int64_t kTensorBytes = kElements * int64_t{sizeof(float)};

template <typename Op>
void binary(benchmark::State& state, Op op) {
  braid::Generator gen(2);
  braid::Tensor a = braid::randn({kElements}, braid::kFloat32, &gen);
  braid::Tensor b = braid::randn({kElements}, braid::kFloat32, &gen);
  for (auto _ : state) {
    braid::Tensor c = op(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * kTensorBytes);
}

void add_braid(benchmark::State& state) {
  binary(state, [](const braid::Tensor& a, const braid::Tensor& b) { return braid::add(a, b); });
}

void mul_braid(benchmark::State& state) {
  binary(state, [](const braid::Tensor& a, const braid::Tensor& b) { return braid::mul(a, b); });
}

// In place, so no output is allocated: the gap to add_braid is the cost of a fresh 64 MB buffer.
void add_inplace_braid(benchmark::State& state) {
  braid::Generator gen(2);
  braid::Tensor a = braid::randn({kElements}, braid::kFloat32, &gen);
  braid::Tensor b = braid::randn({kElements}, braid::kFloat32, &gen);
  for (auto _ : state) {
    a.add_(b);
    benchmark::DoNotOptimize(a.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * kTensorBytes);
}

void exp_braid(benchmark::State& state) {
  braid::Generator gen(3);
  braid::Tensor a = braid::randn({kElements}, braid::kFloat32, &gen);
  for (auto _ : state) {
    braid::Tensor c = braid::exp(a);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kTensorBytes);
}

// range(0): bytes moved per iteration; half of them are read, half written.
void memcpy_bytes(benchmark::State& state) {
  const size_t half = static_cast<size_t>(state.range(0) / 2);
  std::vector<char> src(half, 1), dst(half, 0);  // touched here, so no page faults inside the loop
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), half);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(add_braid)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(mul_braid)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(exp_braid)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(add_inplace_braid)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(memcpy_bytes)->Arg(3 * kTensorBytes)->Arg(2 * kTensorBytes)->UseRealTime()->Unit(benchmark::kMillisecond);
