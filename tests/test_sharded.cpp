// Sharded data parallelism, run plainly and under `mpiexec -n 2` and `-n 4`: the in-place
// reduce-scatter and all-gather against closed forms and against all_reduce's bits, the traffic
// counter against the ring's formulas, ShardedDataParallel stages 1, 2 and 3 against
// DistributedDataParallel (bitwise: Note [Sharded equals data-parallel]) for an MLP, a CNN with
// BatchNorm and a Transformer encoder, stage 3's units, the traffic per step, and the model-state
// bytes against ZeRO's formulas.
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "braid/autograd.h"
#include "braid/checkpoint.h"
#include "braid/distributed.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "mpi_test_main.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;
using braid::testing::N;
using braid::testing::R;

namespace {

/// x[i] = (rank + 1) * (i % 7 + 1) / 8 (exact in binary): the sum over ranks is x[i] N (N + 1) / 2 / (rank + 1).
Tensor rank_values(int64_t n, DType dt, int rank) {
  Tensor i = arange(0, static_cast<double>(n), 1, kFloat64);
  return ((i - floor(i * (1.0 / 7.0)) * 7.0 + 1.0) * ((rank + 1) / 8.0)).to(dt);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return a.numel() == 0 ? 0.0 : amax(abs(a.to(kFloat64) - b.to(kFloat64))).item();
}

}  // namespace

class ShardedCollectives : public DistTest {};

TEST_F(ShardedCollectives, InPlaceReduceScatterAndAllGatherGiveAllReducesBits) {
  // Sizes below and above the ring's threshold, uneven over every N, a prime, and fewer than N.
  for (int64_t n : {1, 3, 7, 13, 1000, 9973, 40001}) {
    for (DType dt : {kFloat32, kFloat64}) {
      const std::string what = "n=" + std::to_string(n) + " " + dtype_name(dt);
      Tensor mine = rank_values(n, dt, R());
      Tensor flat = mine.clone();
      world()->reduce_scatter_inplace_async(flat, ReduceOp::Sum)->wait();
      const int64_t b = n * R() / N(), e = n * (R() + 1) / N();
      const Tensor expect = rank_values(n, kFloat64, 0) * (N() * (N() + 1) / 2.0);
      EXPECT_EQ(max_abs_diff(flat.narrow(0, b, e - b), expect.narrow(0, b, e - b)), 0.0) << what;
      world()->all_gather_inplace_async(flat)->wait();
      EXPECT_EQ(max_abs_diff(flat, expect), 0.0) << what;

      // Random values, averaged: the two halves give all_reduce's bits (the same tree per element).
      Generator g(static_cast<uint64_t>(100 + R()));
      Tensor x = randn({n}, dt, &g), ar = x.clone(), rs = x.clone();
      world()->all_reduce(ar, ReduceOp::Average, {.deterministic = true});
      world()->reduce_scatter_inplace_async(rs, ReduceOp::Average)->wait();
      world()->all_gather_inplace_async(rs)->wait();
      EXPECT_EQ(max_abs_diff(ar, rs), 0.0) << what;
    }
  }
}

TEST_F(ShardedCollectives, TrafficCounterCountsCallsAndRingBytes) {
  auto g = world()->split(0, R());
  g->reset_traffic();
  Tensor t = zeros({1000}, kFloat32);
  g->all_reduce(t);
  g->reduce_scatter_inplace_async(t)->wait();
  g->all_gather_inplace_async(t)->wait();
  (void)g->all_gather(zeros({10}, kFloat64));
  g->broadcast(t, 0);
  const Traffic tr = g->traffic();
  EXPECT_EQ(tr.ranks, N());
  EXPECT_EQ(tr.all_reduce.calls, 1);
  EXPECT_EQ(tr.all_reduce.elements, 1000);
  EXPECT_EQ(tr.all_reduce.bytes, 4000);
  EXPECT_EQ(tr.reduce_scatter.calls, 1);
  EXPECT_EQ(tr.all_gather.calls, 2);
  EXPECT_EQ(tr.all_gather.elements, 1000 + 10 * N());
  EXPECT_EQ(tr.all_gather.bytes, 4000 + 80 * N());
  EXPECT_EQ(tr.broadcast.elements, 1000);
  const double share = (N() - 1.0) / N();
  EXPECT_DOUBLE_EQ(tr.bus_elements(), 2 * share * 1000 + share * (1000 + 1000 + 10 * N()) + 1000);
  g->reset_traffic();
  EXPECT_EQ(g->traffic().all_reduce.calls, 0);
}

namespace {

enum class Model { Mlp, Cnn, Transformer };

nn::ModulePtr build(Model which) {
  manual_seed(11);
  auto m = std::make_shared<nn::Sequential>();
  switch (which) {
    case Model::Mlp:  // a bias of 7 elements: uneven over 2 and 4 ranks
      m->add(std::make_shared<nn::Linear>(6, 7)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(7, 3));
      break;
    case Model::Cnn:  // no bias before BatchNorm (see test_distributed.cpp's make_cnn)
      m->add(std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, 1, 1, false))
          .add(std::make_shared<nn::BatchNorm2d>(4))
          .add(std::make_shared<nn::ReLU>())
          .add(std::make_shared<nn::MaxPool2d>(2))
          .add(std::make_shared<nn::Flatten>())
          .add(std::make_shared<nn::Linear>(4 * 3 * 3, 3));
      break;
    case Model::Transformer:
      m->add(std::make_shared<nn::TransformerEncoderLayer>(
             8, 2, nn::TransformerEncoderLayerOptions{.dim_feedforward = 12, .dropout = 0.0, .batch_first = true}))
          .add(std::make_shared<nn::Flatten>())
          .add(std::make_shared<nn::Linear>(5 * 8, 3));
      break;
  }
  return m;
}

/// Rank r's rows of the global batch of step s.
std::pair<Tensor, Tensor> batch(Model which, int step, int64_t per_rank) {
  Generator g(500 + static_cast<uint64_t>(step));
  const int64_t rows = N() * per_rank;
  Tensor x = which == Model::Cnn ? randn({rows, 1, 6, 6}, kFloat32, &g)
             : which == Model::Transformer ? randn({rows, 5, 8}, kFloat32, &g)
                                           : randn({rows, 6}, kFloat32, &g);
  Tensor y = randint(0, 3, {rows}, kInt64, &g);
  return {x.narrow(0, R() * per_rank, per_rank), y.narrow(0, R() * per_rank, per_rank)};
}

optim::AdamOptions adam_options() { return {.lr = 0.01, .weight_decay = 0.01}; }

constexpr int kSteps = 10;
constexpr double kCap = 0.0005;  // about 500 bytes: several buckets, split parameters' neighbours

nn::ModulePtr train_ddp(Model which) {
  auto m = build(which);
  DistributedDataParallel ddp(m, world(), {.bucket_cap_mb = kCap, .deterministic = true});
  optim::Adam opt(m->parameters(), adam_options());
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto [x, y] = batch(which, s, 3);
    nn::cross_entropy(ddp(x), y).backward();
    opt.step();
  }
  return m;
}

OptimizerFactory adam_factory() {
  return [](const std::vector<Tensor>& shard) { return std::make_shared<optim::Adam>(shard, adam_options()); };
}

/// Trains with ShardedDataParallel; returns the model after the wrapper is gone (at stage 3 its
/// destructor gathers the parameters back) and, in *full, full_state_dict() taken before that.
nn::ModulePtr train_sharded(Model which, int stage, int accumulate = 1, nn::StateDict* full = nullptr) {
  auto m = build(which);
  ShardedDataParallel sdp(m, adam_factory(), world(), {.stage = stage, .bucket_cap_mb = kCap});
  for (int s = 0; s < kSteps; ++s) {
    sdp.zero_grad();
    for (int k = 0; k < accumulate; ++k) {
      auto [x, y] = batch(which, s, 3);
      (nn::cross_entropy(sdp(x), y) * (1.0 / accumulate)).backward();
    }
    sdp.step();
  }
  if (full) *full = sdp.full_state_dict();
  return m;
}

}  // namespace

class Sharded : public DistTest {};

TEST_F(Sharded, EveryStageEqualsDataParallelBitwise) {
  for (Model which : {Model::Mlp, Model::Cnn, Model::Transformer}) {
    const auto ddp = train_ddp(which)->state_dict();
    for (int stage : {1, 2, 3}) {
      nn::StateDict full;
      const auto sharded = train_sharded(which, stage, 1, &full)->state_dict();
      ASSERT_EQ(ddp.size(), sharded.size());
      ASSERT_EQ(ddp.size(), full.size());
      for (const auto& [name, t] : ddp) {
        EXPECT_EQ(max_abs_diff(t, sharded.at(name)), 0.0)
            << "model " << static_cast<int>(which) << " stage " << stage << ": " << name;
        EXPECT_EQ(max_abs_diff(t, full.at(name)), 0.0)
            << "full_state_dict: model " << static_cast<int>(which) << " stage " << stage << ": " << name;
      }
    }
  }
}

TEST_F(Sharded, StageThreeFreesEachUnitOutsideItsUseAndPutsTheModelBack) {
  auto m = build(Model::Mlp);
  const auto before = m->state_dict();
  {
    ShardedDataParallel sdp(m, adam_factory(), world(), {.stage = 3});
    // The units stand where the layers were, under the same names, with their parameters freed.
    EXPECT_EQ(m->child("0")->type_name(), "Linear");
    EXPECT_EQ(std::dynamic_pointer_cast<nn::Linear>(m->child("0")), nullptr);
    for (const auto& [name, t] : m->named_parameters()) EXPECT_EQ(t.numel(), 0) << name;
    EXPECT_EQ(m->state_dict().size(), before.size());
    auto [x, y] = batch(Model::Mlp, 0, 3);
    Tensor out = sdp(x);
    for (const auto& [name, t] : m->named_parameters()) EXPECT_EQ(t.numel(), 0) << "after forward: " << name;
    nn::cross_entropy(out, y).backward();
    for (const auto& [name, t] : m->named_parameters()) EXPECT_EQ(t.numel(), 0) << "after backward: " << name;
    // Before the step the gathered parameters are rank 0's initial ones.
    const auto full = sdp.full_state_dict();
    for (const auto& [name, t] : before) EXPECT_EQ(max_abs_diff(t, full.at(name)), 0.0) << name;
  }
  // Gone: the layers are back, whole.
  EXPECT_NE(std::dynamic_pointer_cast<nn::Linear>(m->child("0")), nullptr);
  for (const auto& [name, t] : m->state_dict()) EXPECT_EQ(t.shape(), before.at(name).shape()) << name;
}

TEST_F(Sharded, StageThreePrefetchesTheNextUnitInThePreviousStepsOrder) {
  for (bool prefetch : {true, false}) {
    auto m = build(Model::Mlp);  // units "0" (Linear 6 -> 7: 49 parameters) and "2" (7 -> 3: 24)
    auto g = world()->split(0, R());
    ShardedDataParallel sdp(m, adam_factory(), g, {.stage = 3, .prefetch = prefetch});
    for (int s = 0; s < 2; ++s) {
      // The first step learns the order; then unit 0's forward starts unit 2's gather too.
      g->reset_traffic();
      auto [x, y] = batch(Model::Mlp, s, 3);
      Tensor h = m->child("0")->forward(x);
      const int64_t gathered = g->traffic().all_gather.elements;
      EXPECT_EQ(gathered, s == 1 && prefetch ? 49 + 24 : 49) << "step " << s << " prefetch " << prefetch;
      sdp.zero_grad();
      nn::cross_entropy(m->child("2")->forward(m->child("1")->forward(h)), y).backward();
      sdp.step();
    }
  }
}

TEST_F(Sharded, NamedUnitsTakeTheParametersUnderThem) {
  // One unit for the encoder layer (its attention, feed-forward and norms together), the root's
  // last Linear as another: still data-parallel's bits.
  auto m = build(Model::Transformer);
  const auto ddp = train_ddp(Model::Transformer)->state_dict();
  {
    ShardedDataParallel sdp(m, adam_factory(), world(), {.stage = 3, .units = {"0", "2"}});
    EXPECT_EQ(sdp.bucket_names().size(), 2u);
    for (int s = 0; s < kSteps; ++s) {
      sdp.zero_grad();
      auto [x, y] = batch(Model::Transformer, s, 3);
      nn::cross_entropy(sdp(x), y).backward();
      sdp.step();
    }
  }
  for (const auto& [name, t] : ddp) EXPECT_EQ(max_abs_diff(t, m->state_dict().at(name)), 0.0) << name;
}

TEST_F(Sharded, TwoBackwardPassesPerStepAccumulate) {
  // Half the loss twice on the same batch: the gradient of the whole loss, up to rounding.
  const auto once = train_sharded(Model::Mlp, 2)->state_dict();
  for (int stage : {1, 2}) {
    const auto twice = train_sharded(Model::Mlp, stage, 2)->state_dict();
    for (const auto& [name, t] : once) EXPECT_LE(max_abs_diff(t, twice.at(name)), 1e-5) << stage << " " << name;
  }
}

TEST_F(Sharded, ModelStateBytesFollowZerosFormulas) {
  // Psi parameters; float32 Adam: parameters 4 Psi, gradients 4 Psi (stage 1) or 4 Psi / N (stage
  // 2), Adam's two moments 8 Psi / N. Uneven segments differ from Psi / N by under one element.
  auto mlp = [] {
    manual_seed(3);
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Linear>(64, 200)).add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(200, 31));
    return m;
  };
  for (int stage : {1, 2, 3}) {
    auto m = mlp();
    int64_t psi = 0;
    for (const auto& p : m->parameters()) psi += p.numel();
    ShardedDataParallel sdp(m, adam_factory(), world(), {.stage = stage});
    {
      Tensor x = randn({4, 64}), y = randint(0, 31, {4}, kInt64);
      nn::cross_entropy(sdp(x), y).backward();
      sdp.step();
    }
    const double n = N();
    const double formula = stage == 3 ? 16.0 * psi / n
                                      : 4.0 * psi + (stage == 1 ? 4.0 * psi : 4.0 * psi / n) + 8.0 * psi / n;
    const ModelStateBytes got = sdp.model_state_bytes();
    if (stage < 3) EXPECT_EQ(got.parameters, 4 * psi);
    else EXPECT_NEAR(static_cast<double>(got.parameters), 4.0 * psi / n, 4.0 * N() * 2);
    EXPECT_NEAR(static_cast<double>(got.total()), formula, 0.05 * formula) << "stage " << stage;
    EXPECT_NEAR(static_cast<double>(got.optimizer), 8.0 * psi / n, 8.0 * N()) << "stage " << stage;
  }
}

TEST_F(Sharded, TrafficPerStepIsTwoPsiAtStagesOneAndTwoAndThreePsiAtStageThree) {
  // Per step and rank, in ring elements: 2 Psi (N-1)/N as data-parallel's all-reduce at stages 1
  // and 2 (reduce-scatter of gradients, all-gather of parameters), 3 Psi (N-1)/N at stage 3 (the
  // parameters are gathered for forward and again for backward).
  for (int stage : {1, 2, 3}) {
    auto m = build(Model::Transformer);
    int64_t psi = 0;
    for (const auto& p : m->parameters()) psi += p.numel();
    auto g = world()->split(0, R());
    ShardedDataParallel sdp(m, adam_factory(), g, {.stage = stage, .bucket_cap_mb = kCap});
    for (int s = 0; s < 2; ++s) {
      g->reset_traffic();
      sdp.zero_grad();
      auto [x, y] = batch(Model::Transformer, s, 3);
      nn::cross_entropy(sdp(x), y).backward();
      sdp.step();
      const Traffic t = g->traffic();
      EXPECT_EQ(t.reduce_scatter.elements, psi) << stage;
      EXPECT_EQ(t.all_gather.elements, stage == 3 ? 2 * psi : psi) << stage;
      EXPECT_EQ(t.reduce_scatter.calls, static_cast<int64_t>(sdp.bucket_names().size())) << stage;
      EXPECT_EQ(t.all_reduce.calls, 0) << stage;
      EXPECT_DOUBLE_EQ(t.bus_elements(), (stage == 3 ? 3.0 : 2.0) * psi * (N() - 1) / N()) << stage;
    }
  }
}

namespace {

constexpr int64_t kGlobalRows = 12;  // divides over 1, 2, 3 and 4 ranks

/// Group rank r of n's rows of the global batch of step s (the same global batch at any n).
std::pair<Tensor, Tensor> rows_of(int step, int r, int n) {
  Generator g(900 + static_cast<uint64_t>(step));
  Tensor x = randn({kGlobalRows, 6}, kFloat32, &g);
  Tensor y = randint(0, 3, {kGlobalRows}, kInt64, &g);
  const int64_t b = kGlobalRows * r / n, e = kGlobalRows * (r + 1) / n;
  return {x.narrow(0, b, e - b), y.narrow(0, b, e - b)};
}

void train_steps(ShardedDataParallel& sdp, int from, int to) {
  const auto& g = sdp.group();
  for (int s = from; s < to; ++s) {
    sdp.zero_grad();
    auto [x, y] = rows_of(s, g->rank(), g->size());
    nn::cross_entropy(sdp(x), y).backward();
    sdp.step();
  }
}

/// One process on the whole global batch: what every resumed run must follow.
nn::StateDict reference(int steps) {
  auto m = build(Model::Mlp);
  optim::Adam opt(m->parameters(), adam_options());
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto [x, y] = rows_of(s, 0, 1);
    nn::cross_entropy(m->forward(x), y).backward();
    opt.step();
  }
  return m->state_dict();
}

void expect_close(const nn::StateDict& want, const nn::StateDict& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (const auto& [name, t] : want) {
    const double scale = std::max(1.0, amax(abs(t.to(kFloat64))).item());
    EXPECT_LE(max_abs_diff(t, got.at(name)) / scale, 2e-5) << what << ": " << name;
  }
}

}  // namespace

TEST_F(Sharded, CheckpointWrittenAtNRanksResumesAtMRanksAnotherStageOrUnsharded) {
  struct Case {
    int from_ranks, from_stage, to_ranks, to_stage;
  };
  std::vector<Case> cases;
  if (N() == 1) cases = {{1, 3, 1, 1}};
  if (N() == 2) cases = {{2, 3, 1, 2}, {1, 2, 2, 3}};
  if (N() == 4) cases = {{4, 2, 2, 3}, {2, 3, 4, 1}, {2, 1, 3, 2}};
  const auto want = reference(6);
  Tensor id = full({1}, static_cast<double>(::getpid()), kInt64, Device::cpu());
  world()->broadcast(id, 0);
  const std::string path = "/tmp/braid_sharded_" + std::to_string(id.data<int64_t>()[0]) + ".ckpt";
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.from_ranks) + " ranks at stage " + std::to_string(c.from_stage) +
                             " -> " + std::to_string(c.to_ranks) + " at stage " + std::to_string(c.to_stage);
    auto a = world()->split(R() < c.from_ranks ? 0 : -1, R());
    if (a) {
      auto m = build(Model::Mlp);
      ShardedDataParallel sdp(m, adam_factory(), a, {.stage = c.from_stage});
      train_steps(sdp, 0, 3);
      Checkpoint mine = sdp.state_shard();
      mine.integers["step"] = 3;
      save_sharded_checkpoint(path, mine, a);
    }
    world()->barrier();
    auto b = world()->split(R() < c.to_ranks ? 0 : -1, R());
    if (b) {
      manual_seed(99);  // other initial weights: everything must come from the checkpoint
      auto m = std::make_shared<nn::Sequential>();
      m->add(std::make_shared<nn::Linear>(6, 7)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(7, 3));
      ShardedDataParallel sdp(m, adam_factory(), b, {.stage = c.to_stage});
      const Checkpoint full = ShardedDataParallel::unshard(load_sharded_checkpoint(path));
      EXPECT_EQ(full.integer("step"), 3) << what;
      sdp.load_full(full);
      train_steps(sdp, 3, 6);
      expect_close(want, sdp.full_state_dict(), what);
      if (b->rank() == 0) {
        // The same checkpoint into a model and optimizer that are not sharded at all.
        auto plain = build(Model::Mlp);
        {
          NoGradGuard no_grad;
          for (auto& p : plain->parameters()) Tensor(p).zero_();
        }
        optim::Adam opt(plain->parameters(), adam_options());
        restore_state(full, "model.", *plain);
        restore_state(full, "optim.", opt);
        for (int s = 3; s < 6; ++s) {
          opt.zero_grad();
          auto [x, y] = rows_of(s, 0, 1);
          nn::cross_entropy(plain->forward(x), y).backward();
          opt.step();
        }
        expect_close(want, plain->state_dict(), what + ", unsharded");
      }
    }
    world()->barrier();
  }
  if (R() == 0) {
    // Only the newest generation's files are left beside the manifest.
    const Checkpoint manifest = load_checkpoint(path);
    EXPECT_EQ(manifest.integer("generation"), static_cast<int64_t>(cases.size()));
    std::remove(path.c_str());
    for (int64_t r = 0; r < manifest.integer("ranks"); ++r) {
      const std::string f = "/tmp/" + manifest.string("file." + std::to_string(r));
      EXPECT_EQ(std::remove(f.c_str()), 0) << f;
    }
    const std::string stale = path + ".g1.rank0";
    EXPECT_NE(std::remove(stale.c_str()), 0) << "the first generation's file is still there";
  }
}

TEST_F(Sharded, BadArgumentsAreNamed) {
  auto m = build(Model::Mlp);
  auto error_of = [&](const ShardedOptions& o) -> std::string {
    try {
      ShardedDataParallel sdp(m, adam_factory(), world(), o);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of({.stage = 4}).find("stage must be 1, 2 or 3, got 4"), std::string::npos) << error_of({.stage = 4});
  EXPECT_NE(error_of({.stage = 2, .units = {"0"}}).find("units are for stage 3"), std::string::npos);
  const std::string unknown = error_of({.stage = 3, .units = {"7"}});
  EXPECT_NE(unknown.find("'7'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("0, 1, 2"), std::string::npos) << unknown;
  EXPECT_THROW(ShardedDataParallel(m, nullptr, world()), ValueError);
  {
    ShardedDataParallel sdp(m, adam_factory(), world(), {.stage = 3});
    try {
      ShardedDataParallel::NoSync no_sync(sdp);
      ADD_FAILURE() << "NoSync at stage 3 should be refused";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("stage 3 frees the parameters"), std::string::npos) << e.what();
    }
  }
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
