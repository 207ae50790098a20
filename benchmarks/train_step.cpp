// One training step (forward, cross-entropy, backward, Adam update) at batch 64 of the model zoo's
// MLP, small CNN and ResNet-style CNN, and of a small BERT-style Transformer encoder (the zoo's
// transformer_encoder at 2 layers of width 128, 32 tokens per sequence). benchmarks/train_step.py
// runs this and the same steps in PyTorch with the same thread count, and prints the ratios.
#include <benchmark/benchmark.h>

#include <string>

#include "braid/braid.h"
#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "models.h"

namespace {

// The encoder of the Transformer row; train_step.py builds the same one in PyTorch.
braid::zoo::EncoderConfig small_encoder() {
  braid::zoo::EncoderConfig c;
  c.vocab = 8000;
  c.hidden = 128;
  c.layers = 2;
  c.heads = 4;
  c.feedforward = 512;
  c.max_positions = 64;
  return c;
}

void train_step(benchmark::State& state, const char* model_name, braid::Shape input) {
  braid::manual_seed(0);
  const bool tokens = std::string(model_name) == "transformer";
  auto model = tokens ? braid::zoo::transformer_encoder(small_encoder(), 10)
                      : braid::zoo::make_model(model_name, input[1], 10);
  braid::optim::Adam opt(model->parameters());
  braid::Tensor x = tokens ? braid::randint(0, small_encoder().vocab, input) : braid::randn(input);
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

BENCHMARK_CAPTURE(train_step, mlp, "mlp", braid::Shape{64, 1, 28, 28})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(train_step, cnn, "cnn", braid::Shape{64, 1, 28, 28})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(train_step, resnet, "resnet", braid::Shape{64, 3, 32, 32})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(train_step, transformer, "transformer", braid::Shape{64, 32})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
