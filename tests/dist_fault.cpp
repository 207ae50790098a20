// A data-parallel training job that fails on purpose, for tests/test_distributed_faults.cpp:
//   dist_fault <scenario>   with scenario throw | sigkill | sigterm | hang | mismatch | launch
// The last rank fails at step 3 of 50; the other ranks must end promptly with a message naming it.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "braid/distributed.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"

using namespace braid;

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

  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(8, 16)).add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(16, 2));
  distributed::DistributedDataParallel ddp(model);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  Generator gen(rank);
  for (int step = 0; step < 50; ++step) {
    if (step == 3 && rank == last) {
      if (scenario == "throw") throw std::runtime_error("injected failure at step 3");
      if (scenario == "sigkill") std::raise(SIGKILL);
      if (scenario == "sigterm") std::raise(SIGTERM);
      if (scenario == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
      if (scenario == "mismatch") {
        distributed::set_debug(true);
        world->broadcast(zeros({3}), 0);
      }
    }
    if (step == 3 && scenario == "mismatch" && rank != last) {
      distributed::set_debug(true);
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
