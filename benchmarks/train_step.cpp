// One training step (forward, cross-entropy, backward, Adam update) of the model zoo's small CNN
// and ResNet-style CNN at batch 64. benchmarks/train_step.py runs this and the same step in
// PyTorch with the same thread count, and prints the ratio.
#include <benchmark/benchmark.h>

#include "braid/braid.h"
#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "models.h"

namespace {

void train_step(benchmark::State& state, const char* model_name, braid::Shape input) {
  braid::manual_seed(0);
  auto model = braid::zoo::make_model(model_name, input[1], 10);
  braid::optim::Adam opt(model->parameters());
  braid::Tensor x = braid::randn(input);
  braid::Tensor y = braid::randint(0, 10, {input[0]});
  for (auto _ : state) {
    braid::Tensor loss = braid::nn::cross_entropy((*model)(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.item());
  }
  state.SetItemsProcessed(state.iterations() * input[0]);
  state.counters["threads"] = braid::get_num_threads();
}

BENCHMARK_CAPTURE(train_step, cnn, "cnn", braid::Shape{64, 1, 28, 28})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(train_step, resnet, "resnet", braid::Shape{64, 3, 32, 32})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
