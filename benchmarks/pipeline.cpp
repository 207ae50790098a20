// braid-pipeline-bench: pipeline measurements under `mpiexec -n K` (K stages), one JSON object per
// line from rank 0, for benchmarks/pipeline_bench.py:
//   bubble      measured bubble of GPipe, 1F1B, interleaved (V = 2) and ZB-H1 for M = 1..16 against
//               each schedule's closed form (bubble-wide: the same with 4 times wider layers)
//   memory      peak step memory per stage for GPipe, 1F1B, ZB-H1, interleaved (v = 2), each also
//               with recomputation
//   partition   the partitioner's predicted stage times against measured ones (zoo resnet)
//   throughput  samples/s of the pipelined zoo resnet against data parallelism on the same ranks
#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <string>
#include <vector>

#include "braid/distributed.h"
#include "braid/distributed/partition.h"
#include "braid/distributed/pipeline.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "models.h"

using namespace braid;
using namespace braid::distributed;

namespace {

int g_rank = 0;
std::string g_out;  // folder for the Gantt charts (argv[2]); empty: none

void emit(const std::string& body) {
  if (g_rank == 0) std::printf("{%s}\n", body.c_str());
  std::fflush(stdout);
}

std::string kv(const std::string& k, double v) {
  char b[64];
  std::snprintf(b, sizeof b, "\"%s\": %.6g", k.c_str(), v);
  return b;
}

std::string kv(const std::string& k, const std::string& v) { return "\"" + k + "\": \"" + v + "\""; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// A chain of 8 equal blocks (Linear width x width + Tanh): equal stages for any K dividing 8.
std::shared_ptr<nn::Sequential> chain(int64_t width = 256) {
  manual_seed(3);
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 8; ++i) m->add(std::make_shared<nn::Linear>(width, width)).add(std::make_shared<nn::Tanh>());
  return m;
}

Tensor mse(const Tensor& out, const Tensor& y) { return nn::mse_loss(out, y); }
Tensor ce(const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); }

std::shared_ptr<nn::Sequential> even_stage(const nn::Sequential& m, int s, int k) {
  const int n = static_cast<int>(m.size());
  return slice_layers(m, n * s / k, n * (s + 1) / k);
}

// Every schedule on equal stages: 1F1B's and GPipe's bubble is (K-1)/(M+K-1) of the step, the
// interleaved schedule's (V = 2 chunks of 4 layers per rank) (K-1)/(VM+K-1), ZB-H1's (K-1)/(3M+K-1)
// when forward, input gradient and weight gradient cost alike (a Linear's three products). width
// 1024 ("bubble-wide") makes each action cost some 16 times more than at 256, so that the fixed
// latency of a transfer is a small share of it.
void bubble(int k, int s, int64_t width) {
  auto model = chain(width);
  const int v = 2;
  for (const std::string name : {"GPipe", "1F1B", "interleaved", "ZB-H1"}) {
    for (int m : {1, 2, 4, 8, 16}) {
      if ((name == "interleaved" && m % k != 0) || (name == "ZB-H1" && m < k)) continue;
      const int chunks = name == "interleaved" ? v : 1;
      std::shared_ptr<nn::Sequential> stage = even_stage(*model, s, k * chunks);
      PipelineStage pipe(stage, world());
      for (int c = 1; c < chunks; ++c) pipe.add_chunk(even_stage(*model, c * k + s, k * chunks));
      const std::string key = name == "GPipe" ? "gpipe" : name == "1F1B" ? "1f1b" : name == "ZB-H1" ? "zb-h1" : "interleaved";
      const PipeSchedule sched = make_schedule(key, k, m, chunks);
      const double formula = name == "interleaved" ? (k - 1.0) / (v * m + k - 1.0)
                             : name == "ZB-H1"     ? (k - 1.0) / (3.0 * m + k - 1.0)
                                                   : (k - 1.0) / (m + k - 1.0);
      Generator g(1);
      Tensor x = randn({128 * m, width}, kFloat32, &g), y = zeros({128 * m, width});
      std::vector<double> measured;
      for (int step = 0; step < 7; ++step) {
        model->zero_grad();
        pipe.train_step(sched, x, y, mse);
        if (step < 2) continue;
        const PipeTimeline t = pipe.gather_timeline();
        measured.push_back(t.bubble_fraction);
        if (step == 6 && m == 4 && !g_out.empty() && g_rank == 0)
          t.write_gantt_svg(g_out + "/pipeline_gantt_" + key + "_K" + std::to_string(k) + "_M4.svg",
                            name + ", K = " + std::to_string(k) + ", M = 4 (8 x Linear 256 + Tanh)");
      }
      emit(kv("kind", "bubble") + ", " + kv("schedule", name) + ", " + kv("K", k) + ", " + kv("M", m) + ", " +
           kv("width", static_cast<double>(width)) + ", " +
           kv("measured", median(measured)) + ", " + kv("formula", formula) + ", " +
           kv("simulated", validate(sched, StepCosts{}).bubble_fraction));
    }
  }
}

void memory(int k, int s) {
  auto model = chain();
  const int m = 8;
  const std::vector<std::pair<std::string, std::string>> schedules = {
      {"GPipe", "gpipe"}, {"1F1B", "1f1b"}, {"ZB-H1", "zb-h1"}, {"interleaved (v = 2)", "interleaved"}};
  for (const auto& [name, key] : schedules) {
    const int v = key == "interleaved" ? 2 : 1;  // chunk c of stage s: piece c * k + s of k * v
    for (bool recompute : {false, true}) {
      PipelineOptions o;
      o.recompute = recompute;
      PipelineStage pipe(even_stage(*model, s, k * v), world(), o);
      for (int c = 1; c < v; ++c) pipe.add_chunk(even_stage(*model, c * k + s, k * v));
      const PipeSchedule sched = make_schedule(key, k, m, v);
      Generator g(1);
      Tensor x = randn({64 * m, 256}, kFloat32, &g), y = zeros({64 * m, 256});
      for (int step = 0; step < 2; ++step) {
        model->zero_grad();
        pipe.train_step(sched, x, y, mse);
      }
      Tensor peak = full({1}, static_cast<double>(pipe.last_peak_bytes()), kFloat64);
      Tensor first = full({1}, s == 0 ? static_cast<double>(pipe.last_peak_bytes()) : 0.0, kFloat64);
      world()->all_reduce(peak, ReduceOp::Max);
      world()->all_reduce(first, ReduceOp::Max);
      emit(kv("kind", "memory") + ", " + kv("schedule", name) + ", " + kv("recompute", recompute ? "yes" : "no") +
           ", " + kv("K", k) + ", " + kv("M", m) + ", " + kv("peak_bytes_max_stage", peak.item()) + ", " +
           kv("peak_bytes_stage0", first.item()));
    }
  }
}

/// The zoo resnet cut by the partitioner (plan made on rank 0 from a profile of one micro-batch).
std::shared_ptr<nn::Sequential> planned_stage(int k, int s, int64_t micro, std::vector<double>* predicted) {
  manual_seed(5);
  auto model = std::dynamic_pointer_cast<nn::Sequential>(zoo::make_model("resnet", 1, 10));
  Tensor cuts = zeros({std::max(1, k - 1)}, kInt64);
  Tensor pred = zeros({k}, kFloat64);
  if (g_rank == 0) {
    manual_seed(6);
    auto copy = std::dynamic_pointer_cast<nn::Sequential>(zoo::make_model("resnet", 1, 10));
    Generator g(2);
    const auto prof = profile_layers(*copy, randn({micro, 1, 28, 28}, kFloat32, &g));
    PartitionOptions o;
    o.micro_batches_in_flight = k;
    const PartitionPlan plan = partition(prof, k, o);
    for (int i = 1; i < k; ++i) cuts.data<int64_t>()[i - 1] = plan.first_layer[static_cast<size_t>(i)];
    for (int i = 0; i < k; ++i) {
      // Compute only (forward + backward of the stage's layers), as the timeline measures it.
      const int b = plan.first_layer[static_cast<size_t>(i)];
      const int e = i + 1 < k ? plan.first_layer[static_cast<size_t>(i + 1)] : static_cast<int>(prof.size());
      double c = 0;
      for (int l = b; l < e; ++l) c += prof[static_cast<size_t>(l)].forward_seconds + prof[static_cast<size_t>(l)].backward_seconds;
      pred.data<double>()[i] = c;
    }
  }
  world()->broadcast(cuts, 0);
  world()->broadcast(pred, 0);
  if (predicted) *predicted = pred.to_vector<double>();
  PartitionPlan plan;
  plan.first_layer.push_back(0);
  for (int i = 0; i + 1 < k; ++i) plan.first_layer.push_back(static_cast<int>(cuts.to_vector<int64_t>()[static_cast<size_t>(i)]));
  return stage_layers(*model, plan, s);
}

void partition_check(int k, int s) {
  const int m = 4;
  const int64_t micro = 16;
  std::vector<double> predicted;
  auto stage = planned_stage(k, s, micro, &predicted);
  PipelineStage pipe(stage, world());
  Generator g(3);
  Tensor x = randn({micro * m, 1, 28, 28}, kFloat32, &g), y = randint(0, 10, {micro * m}, kInt64, &g);
  std::vector<std::vector<double>> per_stage(static_cast<size_t>(k));
  for (int step = 0; step < 7; ++step) {
    stage->zero_grad();
    pipe.train_step(one_f_one_b_schedule(k, m), x, y, ce);
    const PipeTimeline t = pipe.gather_timeline();
    if (step < 2) continue;
    std::vector<double> busy(static_cast<size_t>(k), 0.0);
    for (const PipeEvent& e : t.events)
      if (e.action.kind == PipeAction::Kind::Forward || e.action.kind == PipeAction::Kind::Backward)
        busy[static_cast<size_t>(e.stage)] += e.end - e.start;
    for (int i = 0; i < k; ++i) per_stage[static_cast<size_t>(i)].push_back(busy[static_cast<size_t>(i)] / m);
  }
  for (int i = 0; i < k; ++i)
    emit(kv("kind", "partition") + ", " + kv("K", k) + ", " + kv("stage", i) + ", " +
         kv("predicted_s", predicted[static_cast<size_t>(i)]) + ", " +
         kv("measured_s", median(per_stage[static_cast<size_t>(i)])));
}

void throughput(int k, int s) {
  const int64_t batch = 64;
  const int m = 4;
  Generator g(4);
  Tensor x = randn({batch, 1, 28, 28}, kFloat32, &g), y = randint(0, 10, {batch}, kInt64, &g);
  auto time_steps = [&](const std::function<void()>& step) {
    std::vector<double> t;
    for (int i = 0; i < 8; ++i) {
      world()->barrier();
      const auto start = std::chrono::steady_clock::now();
      step();
      world()->barrier();
      if (i >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return median(t);
  };
  auto stage = planned_stage(k, s, batch / m, nullptr);
  PipelineStage pipe(stage, world());
  optim::SGD opt_p(stage->parameters(), {.lr = 0.01});
  const double pipelined = time_steps([&] {
    opt_p.zero_grad();
    pipe.train_step(one_f_one_b_schedule(k, m), x, y, ce);
    opt_p.step();
  });
  manual_seed(5);
  auto model = zoo::make_model("resnet", 1, 10);
  DistributedDataParallel ddp(model);
  optim::SGD opt_d(model->parameters(), {.lr = 0.01});
  const int64_t per = batch / k;
  const double data_parallel = time_steps([&] {
    opt_d.zero_grad();
    ce(ddp(x.narrow(0, s * per, per)), y.narrow(0, s * per, per)).backward();
    opt_d.step();
  });
  emit(kv("kind", "throughput") + ", " + kv("K", k) + ", " + kv("batch", static_cast<double>(batch)) + ", " +
       kv("pipeline_step_s", pipelined) + ", " + kv("data_parallel_step_s", data_parallel) + ", " +
       kv("pipeline_samples_per_s", batch / pipelined) + ", " + kv("data_parallel_samples_per_s", batch / data_parallel));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc > 2) g_out = argv[2];
  const auto& info = init();
  g_rank = info.rank;
  const int k = info.size, s = info.rank;
  if (mode == "bubble") bubble(k, s, 256);
  else if (mode == "bubble-wide") bubble(k, s, 1024);
  else if (mode == "memory") memory(k, s);
  else if (mode == "partition") partition_check(k, s);
  else if (mode == "throughput") throughput(k, s);
  else {
    if (g_rank == 0) std::fprintf(stderr, "usage: mpiexec -n K braid-pipeline-bench bubble|bubble-wide|memory|partition|throughput\n");
    return 2;
  }
  finalize();
  return 0;
}
