// Sharded data parallelism against data parallelism and ZeRO's memory formulas, run under
// `mpiexec -n N` (or plainly, N = 1): for an MLP of Psi parameters trained with Adam, each mode
// (DistributedDataParallel, ShardedDataParallel stages 1, 2 and 3) reports the model-state bytes per rank (counted from the tensors
// held, and as the allocator's live bytes once a step is over), the formula, the peak bytes during
// a step, the ring elements sent per step over Psi, and the step time against DDP's. Rank 0 prints
// one JSON object per line; benchmarks/sharded_bench.py runs N = 1, 2, 4 and makes the table.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "braid/braid.h"
#include "braid/device.h"
#include "braid/distributed.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/storage.h"

namespace {

namespace dist = braid::distributed;
using namespace braid;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

nn::ModulePtr build(int64_t width, int layers, DType dt) {
  manual_seed(1);
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < layers; ++i) m->add(std::make_shared<nn::Linear>(width, width)).add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::Linear>(width, 10));
  m->to(dt);
  return m;
}

struct Result {
  double state_counted = 0, state_live = 0, peak = 0, bus = 0, seconds = 0;
};

// mode: 0 = DDP, 1..3 = ShardedDataParallel's stage.
Result run(int mode, DType dt, int64_t width, int layers, int steps) {
  auto group = dist::world()->split(0, dist::get_rank());
  Storage::empty_cache();
  const int64_t base = memory_allocated();
  auto m = build(width, layers, dt);
  optim::AdamOptions adam{.lr = 1e-3};
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::ShardedDataParallel> sdp;
  std::shared_ptr<optim::Optimizer> opt;
  if (mode == 0) {
    ddp = std::make_unique<dist::DistributedDataParallel>(m, group);
    opt = std::make_shared<optim::Adam>(m->parameters(), adam);
  } else {
    sdp = std::make_unique<dist::ShardedDataParallel>(
        m, [&](const std::vector<Tensor>& shard) { return std::make_shared<optim::Adam>(shard, adam); }, group,
        dist::ShardedOptions{.stage = mode});
  }
  Result r;
  double t = 0;
  for (int s = 0; s < steps; ++s) {
    Tensor x = randn({32, width}, dt), y = randint(0, 10, {32}, kInt64);
    reset_peak_memory_stats();
    group->reset_traffic();
    dist::barrier(group);
    const double t0 = now();
    if (ddp) {
      opt->zero_grad();
      nn::cross_entropy((*ddp)(x).to(kFloat32), y).backward();
      opt->step();
    } else {
      sdp->zero_grad();
      nn::cross_entropy((*sdp)(x).to(kFloat32), y).backward();
      sdp->step();
    }
    dist::barrier(group);
    if (s > 0) t += now() - t0;  // the first step allocates the optimizer's state
    r.peak = static_cast<double>(max_memory_allocated() - base);
    r.bus = group->traffic().bus_elements();
  }
  r.seconds = t / (steps - 1);
  Storage::empty_cache();
  r.state_live = static_cast<double>(memory_allocated() - base);
  if (sdp) r.state_counted = static_cast<double>(sdp->model_state_bytes().total());
  else {
    for (const auto& p : m->parameters()) r.state_counted += static_cast<double>(p.numel() * p.element_size() * 2);
    for (const auto& p : m->parameters())
      if (const auto* st = opt->state(p))
        for (const auto& [n, v] : st->tensors) r.state_counted += static_cast<double>(v.numel() * v.element_size());
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  dist::init();
  const int64_t width = argc > 1 ? std::atoll(argv[1]) : 512;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 8;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 4;
  const int n = dist::get_world_size();
  int64_t psi = 0;
  for (const auto& p : build(width, layers, kFloat32)->parameters()) psi += p.numel();
  // braid's mixed precision is autocast over float32 parameters, so ZeRO's float32 formulas apply
  // (K = 8: Adam's two moments): DDP 16 Psi, stage 1 8 Psi + 8 Psi / N, stage 2 4 Psi + 12 Psi / N,
  // stage 3 16 Psi / N.
  for (DType dt : {kFloat32}) {
    const double p = 4, k = 8;
    double ddp_seconds = 0;
    for (int mode = 0; mode <= 3; ++mode) {
      const double formula = mode == 0   ? (2 * p + k) * psi
                             : mode == 1 ? 2 * p * psi + k * psi / n
                             : mode == 2 ? p * psi + (p + k) * psi / n
                                         : (2 * p + k) * psi / n;
      const Result r = run(mode, dt, width, layers, steps);
      if (mode == 0) ddp_seconds = r.seconds;
      const std::string mode_name = mode == 0 ? "DDP" : "stage " + std::to_string(mode);
      if (dist::get_rank() == 0)
        std::printf("{\"ranks\": %d, \"dtype\": \"%s\", \"mode\": \"%s\", \"psi\": %lld, \"formula_bytes\": %.0f, "
                    "\"counted_bytes\": %.0f, \"live_bytes\": %.0f, \"peak_bytes\": %.0f, \"bus_over_psi\": %.4f, "
                    "\"step_ms\": %.3f, \"vs_ddp\": %.3f}\n",
                    n, dtype_name(dt).c_str(), mode_name.c_str(),
                    static_cast<long long>(psi), formula, r.state_counted, r.state_live, r.peak,
                    r.bus / static_cast<double>(psi), r.seconds * 1e3, r.seconds / ddp_seconds);
      std::fflush(stdout);
    }
  }
  dist::finalize();
  return 0;
}
