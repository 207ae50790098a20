// braid-ps-bench: parameter-server training with a slowed worker (issue 43), under `mpiexec -n N`:
// rank 0 serves the zoo's CNN (Adam, the main job's settings), ranks 1 .. N-1 train on interleaved
// shards of Fashion-MNIST, batch 64 each, and one worker sleeps --slow-ms per step. The run trains
// until the server has applied --epochs passes' worth of samples (a global budget, as TensorFlow's
// ParameterServerStrategy counts steps: a fast worker may do more steps than a slow one), then the
// first worker scores the final variables on the test set. The first worker prints one JSON line:
// steps of all workers per second, samples per second, the test accuracy, each worker's steps and
// the largest clock gap any pull saw (the staleness bound, checked again here).
//
// --slow fixed: worker 0 sleeps on every step (one slow machine). --slow rotate: worker (c mod W)
// sleeps on its step c, so at any step one worker is slowed, but a different one each step (a
// shared node whose interference moves). Stale-synchronous parallel can only hide the second: with
// a fixed straggler, a worker s steps ahead must wait for it every step after the first s.
//
// Usage: mpiexec -n 4 braid-ps-bench --staleness S (-1: asynchronous) [--slow fixed|rotate|none]
//        [--slow-ms 30] [--epochs 3] [--batch 64] [--lr 0.002] [--servers 1] [--threads 1]
//        [--data /usr/share/datasets/fashion-mnist] [--model cnn|mlp]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "braid/autograd.h"
#include "braid/data.h"
#include "braid/distributed.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/parallel.h"
#include "braid/random.h"
#include "models.h"

namespace {

namespace dist = braid::distributed;
using namespace braid;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Args {
  int staleness = 0, servers = 1, threads = 1, epochs = 3;
  int64_t batch = 64;
  double slow_ms = 30, lr = 0.002;
  std::string slow = "fixed", data = "/usr/share/datasets/fashion-mnist", model = "cnn";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--staleness") a.staleness = std::stoi(v);
    else if (k == "--servers") a.servers = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--epochs") a.epochs = std::stoi(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--slow-ms") a.slow_ms = std::stod(v);
    else if (k == "--lr") a.lr = std::stod(v);
    else if (k == "--slow") a.slow = v;
    else if (k == "--data") a.data = v;
    else if (k == "--model") a.model = v;
    else {
      std::fprintf(stderr, "braid-ps-bench: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.slow != "fixed" && a.slow != "rotate" && a.slow != "none") {
    std::fprintf(stderr, "braid-ps-bench: --slow must be fixed, rotate or none, got %s\n", a.slow.c_str());
    std::exit(2);
  }
  return a;
}

// Fashion-MNIST normalised as braid-train does (the training set's mean and standard deviation).
std::pair<Tensor, Tensor> load(const std::string& dir, bool train) {
  auto ds = data::load_mnist(dir, train);
  return {(ds->inputs() - 0.2860) * (1.0 / 0.3530), ds->targets()};
}

double test_accuracy(nn::Module& model, const std::string& dir) {
  auto [x, y] = load(dir, false);
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0;
  for (int64_t at = 0; at < x.size(0); at += 1000) {
    const int64_t n = std::min<int64_t>(1000, x.size(0) - at);
    Tensor hit = eq(argmax(model.forward(x.narrow(0, at, n)), 1), y.narrow(0, at, n));
    correct += static_cast<int64_t>(sum(hit.to(kFloat64)).item());
  }
  return static_cast<double>(correct) / static_cast<double>(x.size(0));
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  dist::init();
  set_num_threads(a.threads);
  auto group = dist::world();
  manual_seed(1);
  auto model = zoo::make_model(a.model, 1, 10);
  const optim::AdamOptions adam{.lr = a.lr};
  dist::ParameterServer ps(
      model, [&](const std::vector<Tensor>& p) { return std::make_shared<optim::Adam>(p, adam); }, group,
      {.servers = a.servers, .placement = dist::Placement::Greedy, .staleness = a.staleness});
  const int W = ps.workers(), w = ps.worker_index();
  Tensor x, y;
  if (!ps.is_server()) {
    auto [inputs, targets] = load(a.data, true);
    Tensor mine = arange(static_cast<double>(w), static_cast<double>(inputs.size(0)), static_cast<double>(W), kInt64);  // worker w's shard: samples w, w + W, ...
    x = index_select(inputs, 0, mine), y = index_select(targets, 0, mine);
  }
  const int64_t budget = static_cast<int64_t>(a.epochs) * 60000;  // samples the server must apply
  group->barrier();
  const double t0 = now();
  int64_t steps = 0, gap = 0;
  if (ps.is_server()) {
    ps.serve();
  } else {
    model->train();
    Tensor perm;
    int64_t at = x.size(0), pass = 0;
    for (;;) {
      if (at + a.batch > x.size(0)) {
        Generator g(1000 * static_cast<uint64_t>(w) + static_cast<uint64_t>(pass++));
        perm = randperm(x.size(0), &g), at = 0;
      }
      Tensor idx = perm.narrow(0, at, a.batch);
      at += a.batch;
      model->zero_grad();
      nn::cross_entropy(model->forward(index_select(x, 0, idx)), index_select(y, 0, idx)).backward();
      const bool slowed = (a.slow == "fixed" && w == 0) || (a.slow == "rotate" && steps % W == w);
      if (slowed) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.slow_ms));
      ps.push_pull();
      ++steps;
      const dist::PullRecord& p = ps.pulls().back();
      gap = std::max(gap, p.clock - p.slowest);
      // The server's version counts rounds of W pushes when synchronous, single pushes otherwise.
      if (p.version * (a.staleness == 0 ? W : 1) * a.batch >= budget) break;
    }
    ps.finish();
  }
  const double seconds = ps.is_server() ? 0.0 : now() - t0;
  Tensor t = tensor(std::vector<double>{seconds}, {1}, Device::cpu());
  group->all_reduce(t, dist::ReduceOp::Max);
  Tensor g = tensor(std::vector<double>{static_cast<double>(gap)}, {1}, Device::cpu());
  group->all_reduce(g, dist::ReduceOp::Max);
  const auto per_rank = group->all_gather(tensor(std::vector<double>{static_cast<double>(steps)}, {1}, Device::cpu()))
                            .to(Device::cpu())
                            .to_vector<double>();
  if (w == 0) {
    const double acc = test_accuracy(*model, a.data), wall = t.item();
    double total = 0;
    std::string list;
    for (int r = a.servers; r < group->size(); ++r) {
      total += per_rank[static_cast<size_t>(r)];
      list += (list.empty() ? "" : ", ") + std::to_string(static_cast<int64_t>(per_rank[static_cast<size_t>(r)]));
    }
    std::printf(
        "{\"model\": \"%s\", \"servers\": %d, \"workers\": %d, \"staleness\": %d, \"slow\": \"%s\", \"slow_ms\": %g, "
        "\"batch\": %lld, \"epochs\": %d, \"seconds\": %.3f, \"steps\": %.0f, \"steps_per_s\": %.2f, "
        "\"samples_per_s\": %.1f, \"test_accuracy\": %.4f, \"max_clock_gap\": %.0f, \"steps_per_worker\": [%s]}\n",
        a.model.c_str(), a.servers, W, a.staleness, a.slow.c_str(), a.slow_ms, static_cast<long long>(a.batch),
        a.epochs, wall, total, total / wall, total * static_cast<double>(a.batch) / wall, acc, g.item(), list.c_str());
    std::fflush(stdout);
  }
  dist::finalize();
  return 0;
}
