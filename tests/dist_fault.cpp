// A data-parallel training job that fails on purpose, for tests/test_distributed_faults.cpp:
//   dist_fault <scenario>   with scenario throw | sigkill | sigterm | hang | mismatch | mismatch-plain |
//                           mismatch-size | skip | deadlock | launch
// The last rank fails at step 3 of 50; the other ranks must end promptly with a message naming it.
// mismatch, mismatch-size and skip turn the debug mode on (the last rank calls another collective,
// one of another size, or none before its next bucket all-reduce); mismatch-plain is mismatch without
// it, and deadlock has the last rank call two collectives on two groups in the other order.
//   dist_fault pipeline-throw | pipeline-sigkill
// A pipeline with one stage per rank (1F1B, 4 micro-batches): stage 1 fails in the forward of
// micro-batch 2 at step 3, while its neighbours wait on it for activations and gradients.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "braid/distributed.h"
#include "braid/distributed/pipeline.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"

using namespace braid;

namespace {

/// Identity that fails (throws or kills its process) at its n-th forward.
class FailAt : public nn::Module {
 public:
  FailAt(int n, std::string how) : Module("FailAt"), n_(n), how_(std::move(how)) {}
  Tensor forward(const Tensor& x) override {
    if (++calls_ == n_) {
      if (how_ == "pipeline-sigkill") std::raise(SIGKILL);
      std::string what = "injected failure in stage 1, forward call ";
      what += std::to_string(n_);
      throw std::runtime_error(what);
    }
    return x;
  }

 private:
  int n_, calls_ = 0;
  std::string how_;
};

int pipeline_job(const std::string& scenario) {
  auto world = distributed::world();
  const int rank = world->rank(), k = world->size(), m = 4;
  manual_seed(1);
  auto stage = std::make_shared<nn::Sequential>();
  stage->add(std::make_shared<nn::Linear>(8, 8)).add(std::make_shared<nn::Tanh>());
  // Stage 1's 3 * 4 + 3rd forward: step 3, micro-batch 2.
  if (rank == 1) stage->add(std::make_shared<FailAt>(3 * m + 3, scenario));
  distributed::PipelineStage pipe(stage, world);
  optim::SGD opt(stage->parameters(), {.lr = 0.1});
  Generator gen(7);
  for (int step = 0; step < 50; ++step) {
    Tensor x = randn({16, 8}, kFloat32, &gen);
    Tensor y = randint(0, 8, {16}, kInt64, &gen);
    opt.zero_grad();
    pipe.train_step(distributed::one_f_one_b_schedule(k, m), x, y,
                    [](const Tensor& out, const Tensor& t) { return nn::cross_entropy(out, t); });
    opt.step();
  }
  std::printf("rank %d finished\n", rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  try {
    distributed::init();
  } catch (const Error& e) {
    std::fprintf(stderr, "dist_fault: %s\n", e.what());
    return 3;
  }
  auto world = distributed::world();
  const int rank = world->rank(), last = world->size() - 1;
  if (rank == 0) std::printf("ranks: %s\n", distributed::rank_table().c_str());
  std::fflush(stdout);
  world->barrier();
  if (scenario.rfind("pipeline", 0) == 0) return pipeline_job(scenario);

  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(8, 16)).add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(16, 2));
  distributed::DistributedDataParallel ddp(model);
  auto sub = scenario == "deadlock" ? world->split(0, rank) : nullptr;
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  Generator gen(rank);
  for (int step = 0; step < 50; ++step) {
    if (step == 3 && rank == last) {
      if (scenario == "throw") throw std::runtime_error("injected failure at step 3");
      if (scenario == "sigkill") std::raise(SIGKILL);
      if (scenario == "sigterm") std::raise(SIGTERM);
      if (scenario == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
      if (scenario == "mismatch" || scenario == "mismatch-plain") {
        distributed::set_debug(scenario == "mismatch");
        world->broadcast(zeros({3}), 0);
      }
    }
    if (step == 3 && scenario == "mismatch-size") {
      distributed::set_debug(true);
      Tensor t = zeros({rank == last ? 12 : 10});
      world->all_reduce(t);
    }
    if (step == 3 && scenario == "skip") {
      distributed::set_debug(true);
      Tensor t = zeros({10});
      if (rank != last) world->all_reduce(t);
    }
    if (step == 3 && scenario == "deadlock") {
      Tensor a = zeros({10}), b = zeros({12});
      if (rank != last) world->all_reduce(a), sub->all_reduce(b);
      else sub->all_reduce(b), world->all_reduce(a);
    }
    if (step == 3 && (scenario == "mismatch" || scenario == "mismatch-plain") && rank != last) {
      distributed::set_debug(scenario == "mismatch");
      Tensor t = zeros({10});
      world->all_reduce(t);
    }
    Tensor x = randn({4, 8}, kFloat32, &gen);
    Tensor y = randint(0, 2, {4}, kInt64, &gen);
    opt.zero_grad();
    nn::cross_entropy(ddp(x), y).backward();
    opt.step();
  }
  std::printf("rank %d finished\n", rank);
  return 0;
}
