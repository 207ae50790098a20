// Pipeline execution, run plainly (one stage) and under `mpiexec -n 2` and `-n 4` (2 and 4 stages):
// GPipe and 1F1B with 1, 4 and 8 micro-batches must give, after a few steps, the weights of
// single-process training of the same model on the same mini-batches (computed on every rank).
#include <fstream>
#include <iterator>
#include <map>

#include "braid/distributed/pipeline.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "mpi_test_main.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;

namespace {

std::shared_ptr<nn::Sequential> full_model(DType dt) {
  manual_seed(11);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 16)).add(std::make_shared<nn::Tanh>());
  m->add(std::make_shared<nn::Linear>(16, 16)).add(std::make_shared<nn::Tanh>());
  m->add(std::make_shared<nn::Linear>(16, 16)).add(std::make_shared<nn::Tanh>());
  m->add(std::make_shared<nn::Linear>(16, 3));
  m->to(dt);
  return m;
}

/// Stage s of k: consecutive children of full, under their names in full ("2.weight", ...).
std::shared_ptr<nn::Sequential> stage_of(const nn::Sequential& full, int s, int k) {
  const auto children = full.named_children();
  const size_t n = children.size();
  auto stage = std::make_shared<nn::Sequential>();
  for (size_t i = n * static_cast<size_t>(s) / static_cast<size_t>(k); i < n * static_cast<size_t>(s + 1) / static_cast<size_t>(k); ++i)
    stage->add(children[i].second, children[i].first);
  return stage;
}

std::pair<Tensor, Tensor> batch(int step, DType dt) {
  Generator g(500 + static_cast<uint64_t>(step));
  return {randn({16, 6}, dt, &g), randint(0, 3, {16}, kInt64, &g)};
}

Tensor ce(const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); }

}  // namespace

class Pipeline : public DistTest {};

TEST_F(Pipeline, GPipeAndOneFOneBEqualOneProcess) {
  auto group = world();
  const int k = group->size(), s = group->rank();
  for (DType dt : {kFloat64, kFloat32}) {
    // The reference: the whole model, the whole mini-batch, one process.
    auto ref = full_model(dt);
    optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
    std::vector<double> ref_loss;
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(step, dt);
      ref_opt.zero_grad();
      Tensor l = ce(ref->forward(x), y);
      ref_loss.push_back(l.item());
      l.backward();
      ref_opt.step();
    }
    const auto ref_state = ref->state_dict();
    for (int m : {1, 4, 8}) {
      for (const PipeSchedule& sched : {gpipe_schedule(k, m), one_f_one_b_schedule(k, m)}) {
        const std::string what = sched.name + " K=" + std::to_string(k) + " M=" + std::to_string(m) + " " + dtype_name(dt);
        auto full = full_model(dt);
        auto stage = stage_of(*full, s, k);
        PipelineStage pipe(stage, group);
        optim::SGD opt(stage->parameters(), {.lr = 0.1, .momentum = 0.9});
        for (int step = 0; step < 3; ++step) {
          auto [x, y] = batch(step, dt);
          opt.zero_grad();
          const double l = pipe.train_step(sched, x, y, ce);
          EXPECT_NEAR(l, ref_loss[static_cast<size_t>(step)], dt == kFloat64 ? 1e-12 : 1e-5) << what << " step " << step;
          opt.step();
        }
        const double tol = dt == kFloat64 ? 1e-10 : 1e-5;
        for (const auto& [name, t] : stage->state_dict()) {
          const Tensor& r = ref_state.at(name);
          EXPECT_LE(amax(abs(t.to(kFloat64) - r.to(kFloat64))).item(), tol) << what << ": " << name;
        }
      }
    }
  }
}

TEST_F(Pipeline, CnnWithBatchNormEqualsOneProcessRunningTheMicroBatchesInTurn) {
  // BatchNorm in a pipeline sees one micro-batch at a time (GPipe's behaviour): the reference runs
  // the same micro-batches one after the other in one process, accumulating gradients.
  auto group = world();
  const int k = group->size(), s = group->rank(), m = 4;
  auto cnn = [] {
    manual_seed(5);
    auto net = std::make_shared<nn::Sequential>();
    net->add(std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, 1, 1, false)).add(std::make_shared<nn::BatchNorm2d>(4));
    net->add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::MaxPool2d>(2));
    net->add(std::make_shared<nn::Flatten>()).add(std::make_shared<nn::Linear>(4 * 3 * 3, 3));
    net->to(kFloat64);
    return net;
  };
  auto data = [](int step) {
    Generator g(900 + static_cast<uint64_t>(step));
    return std::make_pair(randn({16, 1, 6, 6}, kFloat64, &g), randint(0, 3, {16}, kInt64, &g));
  };
  auto ref = cnn();
  optim::Adam ref_opt(ref->parameters(), {.lr = 0.01});
  auto full = cnn();
  auto stage = stage_of(*full, s, k);
  PipelineStage pipe(stage, group);
  // A stage may hold no parameters at all (ReLU and pooling): it then has nothing to update.
  std::unique_ptr<optim::Adam> opt;
  if (!stage->parameters().empty()) opt = std::make_unique<optim::Adam>(stage->parameters(), optim::AdamOptions{.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = data(step);
    ref_opt.zero_grad();
    for (int mb = 0; mb < m; ++mb)
      (ce(ref->forward(x.narrow(0, mb * 4, 4)), y.narrow(0, mb * 4, 4)) * (1.0 / m)).backward();
    ref_opt.step();
    if (opt) opt->zero_grad();
    pipe.train_step(one_f_one_b_schedule(k, m), x, y, ce);
    if (opt) opt->step();
  }
  const auto ref_state = ref->state_dict();
  for (const auto& [name, t] : stage->state_dict())  // running statistics included
    EXPECT_LE(amax(abs(t.to(kFloat64) - ref_state.at(name).to(kFloat64))).item(), 1e-10) << name;
}

TEST_F(Pipeline, RecomputationGivesTheSameGradientsWithLessActivationMemory) {
  auto group = world();
  const int k = group->size(), s = group->rank();
  const int m = 8;
  std::map<std::string, Tensor> grads[2];
  int64_t peak[2] = {0, 0};
  for (int recompute = 0; recompute < 2; ++recompute) {
    auto full = full_model(kFloat64);
    auto stage = stage_of(*full, s, k);
    PipelineOptions o;
    o.recompute = recompute == 1;
    PipelineStage pipe(stage, group, o);
    // A wider batch, so that activations dominate what the step allocates.
    Generator g(7);
    Tensor x = randn({256, 6}, kFloat64, &g);
    Tensor y = randint(0, 3, {256}, kInt64, &g);
    stage->zero_grad();
    pipe.train_step(gpipe_schedule(k, m), x, y, ce);
    peak[recompute] = pipe.last_peak_bytes();
    for (const auto& [name, p] : stage->named_parameters()) grads[recompute][name] = p.grad().clone();
  }
  for (const auto& [name, gk] : grads[0])
    EXPECT_LE(amax(abs(gk - grads[1].at(name))).item(), 1e-14) << name;
  EXPECT_LT(peak[1], peak[0]) << "recompute " << peak[1] << " bytes, keeping activations " << peak[0] << " bytes";
}

TEST_F(Pipeline, DataTimesPipelineGridEqualsOneProcess) {
  auto w = world();
  if (w->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int k = w->size() == 2 ? 1 : 2;  // 2 ranks: 2 replicas of 1 stage; 4 ranks: 2 x 2
  Grid grid = make_grid(k, w);
  const int d = grid.data->size();
  auto ref = full_model(kFloat64);
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  auto full = full_model(kFloat64);
  auto stage = stage_of(*full, grid.stage, k);
  DistributedDataParallel ddp(stage, grid.data);
  PipelineOptions o;
  o.data_parallel = &ddp;
  PipelineStage pipe(stage, grid.pipeline, o);
  optim::SGD opt(stage->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step, kFloat64);
    ref_opt.zero_grad();
    ce(ref->forward(x), y).backward();
    ref_opt.step();
    // Replica r takes rows [r B / D, (r + 1) B / D) of the mini-batch.
    const int64_t rows = x.size(0) / d;
    opt.zero_grad();
    pipe.train_step(one_f_one_b_schedule(k, 4), x.narrow(0, grid.replica * rows, rows),
                    y.narrow(0, grid.replica * rows, rows), ce);
    opt.step();
  }
  const auto ref_state = ref->state_dict();
  for (const auto& [name, t] : stage->state_dict())
    EXPECT_LE(amax(abs(t - ref_state.at(name))).item(), 1e-10) << "replica " << grid.replica << " stage " << grid.stage
                                                                << ": " << name;
}

TEST_F(Pipeline, TimelineIsCausalAndWritesTraceAndGantt) {
  auto group = world();
  const int k = group->size(), s = group->rank(), m = 4;
  auto stage = stage_of(*full_model(kFloat64), s, k);
  PipelineStage pipe(stage, group);
  auto [x, y] = batch(0, kFloat64);
  const PipeSchedule sched = one_f_one_b_schedule(k, m);
  pipe.train_step(sched, x, y, ce);
  const PipeTimeline t = pipe.gather_timeline();
  size_t actions = 0;
  for (const auto& a : sched.actions) actions += a.size();
  ASSERT_EQ(t.events.size(), actions);
  auto find = [&](int st, PipeAction::Kind kind, int micro) {
    for (const PipeEvent& e : t.events)
      if (e.stage == st && e.action.kind == kind && e.action.micro == micro) return e;
    ADD_FAILURE() << "no event for stage " << st;
    return PipeEvent{};
  };
  for (int st = 0; st + 1 < k; ++st)
    for (int mb = 0; mb < m; ++mb) {
      // Stage st + 1 cannot start forward mb before stage st has finished it, nor stage st start
      // backward mb before stage st + 1 has finished it.
      EXPECT_GE(find(st + 1, PipeAction::Kind::Forward, mb).start, find(st, PipeAction::Kind::Forward, mb).end);
      EXPECT_GE(find(st, PipeAction::Kind::Backward, mb).start, find(st + 1, PipeAction::Kind::Backward, mb).end);
    }
  EXPECT_GE(t.bubble_fraction, 0.0);
  EXPECT_LT(t.bubble_fraction, 1.0);
  if (s == 0) {
    const std::string dir = ::testing::TempDir();
    t.write_chrome_trace(dir + "braid_pipeline_trace.json");
    t.write_gantt_svg(dir + "braid_pipeline_gantt.svg", "1F1B");
    std::ifstream trace(dir + "braid_pipeline_trace.json");
    const std::string text((std::istreambuf_iterator<char>(trace)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.rfind("{\"traceEvents\": [", 0), 0u);
    EXPECT_NE(text.find("\"name\": \"B" + std::to_string(m - 1) + "\""), std::string::npos);
    EXPECT_NE(text.find("\"args\": {\"name\": \"stage " + std::to_string(k - 1) + "\"}"), std::string::npos);
    std::ifstream svg(dir + "braid_pipeline_gantt.svg");
    const std::string pic((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
    EXPECT_NE(pic.find("<svg"), std::string::npos);
    EXPECT_NE(pic.find("bubble"), std::string::npos);
  }
}

TEST_F(Pipeline, WrongMicroBatchSplitIsAnErrorNamingTheShape) {
  if (world()->size() != 1) GTEST_SKIP() << "checked on one stage, where no peer waits for the failing rank";
  auto stage = stage_of(*full_model(kFloat64), 0, 1);
  PipelineStage pipe(stage, world());
  try {
    pipe.train_step(gpipe_schedule(1, 3), zeros({16, 6}, kFloat64), zeros({16}, kInt64), ce);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[16, 6]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 equal micro-batches"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
