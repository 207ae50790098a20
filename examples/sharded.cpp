// Sharded data parallelism: an MLP of a given width and depth trained with Adam under
// ShardedDataParallel at a given stage (0: DistributedDataParallel), on a synthetic classification
// task (which of the first ten inputs is largest). Each rank prints nothing but rank 0, which prints the loss and, at the end, the model-state
// bytes per rank and the peak bytes of a step. With BRAID_MEMORY_LIMIT set below what the model
// needs whole, stage 3 across enough ranks trains it where data parallelism runs out of memory:
//
//     BRAID_MEMORY_LIMIT=64M mpiexec -n 4 build/examples/braid-sharded 3
#include <cstdio>
#include <cstdlib>

#include "braid/braid.h"
#include "braid/device.h"
#include "braid/distributed.h"
#include "braid/knobs.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"

using namespace braid;
namespace dist = braid::distributed;

int main(int argc, char** argv) {
  dist::init();
  const int stage = argc > 1 ? std::atoi(argv[1]) : 3;
  const int64_t width = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int depth = argc > 3 ? std::atoi(argv[3]) : 8;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 20;
  const int rank = dist::get_rank(), ranks = dist::get_world_size();
  try {
    manual_seed(0);
    auto model = std::make_shared<nn::Sequential>();
    for (int i = 0; i < depth; ++i) model->add(std::make_shared<nn::Linear>(width, width)).add(std::make_shared<nn::ReLU>());
    model->add(std::make_shared<nn::Linear>(width, 10));
    const int64_t psi = model->num_parameters();
    if (rank == 0)
      std::printf("%lld parameters (%.1f MiB of float32 weights, %.1f MiB with gradients and Adam), %d ranks, %s\n",
                  static_cast<long long>(psi), psi * 4 / 1048576.0, psi * 16 / 1048576.0, ranks,
                  stage == 0 ? "data parallel" : ("ZeRO stage " + std::to_string(stage)).c_str());
    optim::AdamOptions adam{.lr = 1e-3};
    std::unique_ptr<dist::ShardedDataParallel> sdp;
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    std::shared_ptr<optim::Optimizer> opt;
    if (stage == 0) {
      ddp = std::make_unique<dist::DistributedDataParallel>(model);
      opt = std::make_shared<optim::Adam>(model->parameters(), adam);
    } else {
      sdp = std::make_unique<dist::ShardedDataParallel>(
          model, [&](const std::vector<Tensor>& shard) { return std::make_shared<optim::Adam>(shard, adam); }, nullptr,
          dist::ShardedOptions{.stage = stage});
    }
    Generator data(1 + static_cast<uint64_t>(rank));
    for (int step = 1; step <= steps; ++step) {
      Tensor x = randn({16, width}, kFloat32, &data);
      Tensor y = argmax(x.narrow(1, 0, 10), 1);  // which of the first ten features is largest
      reset_peak_memory_stats();
      Tensor loss;
      if (sdp) {
        sdp->zero_grad();
        loss = nn::cross_entropy((*sdp)(x), y);
        loss.backward();
        sdp->step();
      } else {
        opt->zero_grad();
        loss = nn::cross_entropy((*ddp)(x), y);
        loss.backward();
        opt->step();
      }
      if (rank == 0 && (step == 1 || step % 5 == 0)) std::printf("step %d loss %.4f\n", step, loss.item());
    }
    if (rank == 0) {
      const double state = sdp ? static_cast<double>(sdp->model_state_bytes().total()) : 16.0 * psi;
      std::printf("model state per rank %.1f MiB; peak in a step %.1f MiB; BRAID_MEMORY_LIMIT %s\n", state / 1048576.0,
                  max_memory_allocated() / 1048576.0, knob_value("BRAID_MEMORY_LIMIT").c_str());
    }
  } catch (const std::exception& e) {
    dist::abort_job(std::string("rank ") + std::to_string(rank) + ": " + e.what());
  }
  dist::finalize();
  return 0;
}
