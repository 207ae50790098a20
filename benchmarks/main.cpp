// Entry point of braid-bench. It pins braid's and OpenBLAS's thread count to one value before any
// benchmark runs, so that braid and its baselines use the same threads, and records that count and
// the build type in the report's context, where benchmarks/run.py reads it.
#include <benchmark/benchmark.h>
#include <braid/braid.h>
#include <cblas.h>

#include <string>

int main(int argc, char** argv) {
  // Setting the knob explicitly also sets OpenBLAS's threads now, rather than at braid's first op,
  // which would let a cblas baseline that runs first use a different count.
  braid::set_num_threads(braid::get_num_threads());
  benchmark::AddCustomContext("braid_version", BRAID_VERSION);
  benchmark::AddCustomContext("braid_num_threads", std::to_string(braid::get_num_threads()));
  benchmark::AddCustomContext("openblas_num_threads", std::to_string(openblas_get_num_threads()));

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
