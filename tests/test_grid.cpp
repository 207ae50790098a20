// The 3-D grid (make_grid: data x pipeline x tensor), run plainly and under `mpiexec -n 2` and
// `-n 4`: its placement and groups against Note [Grid placement]'s closed form, and the zoo's
// GPT-2-shaped model trained on every grid that the world's size factors into (every pair of
// dimensions at 2 x 2 on 4 ranks, each dimension alone at 2 and 4), with DistributedDataParallel or
// ShardedDataParallel (ZeRO 1, 2 and, without a pipeline, 3) as the data dimension, against the one
// process that every rank also computes: float64, 3 Adam steps, every parameter within 1e-10.
#include <functional>
#include <memory>
#include <tuple>

#include "braid/autograd.h"
#include "braid/distributed.h"
#include "braid/distributed/partition.h"
#include "braid/distributed/pipeline.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "gpt.h"
#include "mpi_test_main.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;

namespace {

class GridTest : public DistTest {};

/// Every (data, pipeline, tensor) whose product is n.
std::vector<GridShape> shapes_of(int n) {
  std::vector<GridShape> out;
  for (int p = 1; p <= n; ++p)
    for (int t = 1; p * t <= n; ++t)
      if (n % (p * t) == 0) out.push_back({n / (p * t), p, t});
  return out;
}

std::string label(const GridShape& s) {
  return detail::cat("data ", s.data, " x pipeline ", s.pipeline, " x tensor ", s.tensor);
}

/// 1 at each world rank in the group, summed over the group: the group's members.
std::vector<double> members(const ProcessGroupPtr& group) {
  Tensor t = zeros({world()->size()}, kFloat64, Device::cpu());
  t.data<double>()[world()->rank()] = 1;
  group->all_reduce(t);
  return t.to_vector<double>();
}

TEST_F(GridTest, PlacementAndGroupsFollowTheClosedForm) {
  const int n = world()->size(), r = world()->rank();
  for (const GridShape& shape : shapes_of(n)) {
    SCOPED_TRACE(label(shape));
    const Grid g = make_grid(shape);
    const int P = shape.pipeline, T = shape.tensor;
    EXPECT_EQ(g.tensor_rank, r % T);
    EXPECT_EQ(g.stage, (r / T) % P);
    EXPECT_EQ(g.replica, r / (P * T));
    EXPECT_EQ(g.rank_of(g.replica, g.stage, g.tensor_rank), r);
    EXPECT_EQ(g.shape.data, n / (P * T));
    EXPECT_EQ(g.tensor->rank(), g.tensor_rank);
    EXPECT_EQ(g.pipeline->rank(), g.stage);
    EXPECT_EQ(g.data->rank(), g.replica);
    EXPECT_EQ(g.model->rank(), r % (P * T));
    // Each group holds exactly the ranks that differ from this one only along its own axes.
    std::vector<double> want_tensor(n), want_pipe(n), want_data(n), want_model(n);
    for (int q = 0; q < n; ++q) {
      const int qt = q % T, qs = (q / T) % P, qr = q / (P * T);
      want_tensor[q] = qr == g.replica && qs == g.stage;
      want_pipe[q] = qr == g.replica && qt == g.tensor_rank;
      want_data[q] = qs == g.stage && qt == g.tensor_rank;
      want_model[q] = qr == g.replica;
    }
    EXPECT_EQ(members(g.tensor), want_tensor);
    EXPECT_EQ(members(g.pipeline), want_pipe);
    EXPECT_EQ(members(g.data), want_data);
    EXPECT_EQ(members(g.model), want_model);
  }
  // make_grid(K) is the grid of K pipeline stages over the remaining replicas.
  const Grid old = make_grid(1);
  EXPECT_EQ(old.shape.data, n);
  EXPECT_EQ(old.replica, r);
}

TEST_F(GridTest, ShapesThatDoNotFitTheWorldAreRefusedNamingThem) {
  const int n = world()->size();
  try {
    make_grid(GridShape{.data = n + 1, .pipeline = 1, .tensor = 1});
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(n) + " ranks do not form a grid of " + std::to_string(n + 1) +
                                         " replicas x 1 pipeline stages x 1 tensor shards"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_grid(GridShape{.data = 0, .pipeline = 0, .tensor = 1}), ValueError);
  EXPECT_THROW(make_grid(GridShape{.data = 0, .pipeline = 1, .tensor = n + 1}), ValueError);
  Grid g = make_grid(GridShape{});
  EXPECT_THROW(g.rank_of(0, 1, 0), IndexError);
}

// --- The GPT on a grid against one process ----------------------------------------------------

const zoo::GptConfig kConfig{.vocab = 16, .context = 8, .layers = 2, .heads = 4, .embed = 16};
constexpr int64_t kBatch = 8;  // sequences per step, the global batch
constexpr int kSteps = 3;

std::shared_ptr<nn::Sequential> fresh_gpt() {
  manual_seed(7);
  auto m = zoo::gpt(kConfig);
  m->to(kFloat64);
  return m;
}

std::pair<Tensor, Tensor> batch(int step) {
  Generator g(300 + static_cast<uint64_t>(step));
  return {randint(0, kConfig.vocab, {kBatch, kConfig.context}, kInt64, &g),
          randint(0, kConfig.vocab, {kBatch, kConfig.context}, kInt64, &g)};
}

optim::AdamOptions adam() { return {.lr = 1e-2}; }

/// The one-process run's parameters after kSteps steps on the whole batch.
nn::StateDict one_process() {
  auto ref = fresh_gpt();
  optim::Adam opt(ref->parameters(), adam());
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step);
    opt.zero_grad();
    zoo::gpt_loss(ref->forward(x), y).backward();
    opt.step();
  }
  return ref->state_dict();
}

/// This rank's part of a serial parameter: its slice along the one axis whose size differs.
Tensor tp_share(const Tensor& full, const Shape& local, int rank) {
  if (full.shape() == local) return full;
  for (int64_t a = 0; a < full.dim(); ++a)
    if (full.size(a) != local[static_cast<size_t>(a)]) return full.narrow(a, rank * local[static_cast<size_t>(a)], local[static_cast<size_t>(a)]);
  return full;
}

/// zero_stage 0: DistributedDataParallel over the data group; 1 to 3: ShardedDataParallel.
void expect_gpt_grid_equals_one_process(const GridShape& shape, int zero_stage, const nn::StateDict& want) {
  const std::string what = label(shape) + (zero_stage ? detail::cat(", ZeRO stage ", zero_stage) : ", DDP");
  SCOPED_TRACE(what);
  const Grid g = make_grid(shape);
  const int D = g.shape.data, P = shape.pipeline;
  auto model = fresh_gpt();
  if (shape.tensor > 1) parallelize_module(*model, g.tensor, zoo::gpt_tensor_parallel_plan(kConfig));
  // Stage s holds children [s C / P, (s + 1) C / P) under the model's names.
  const int C = static_cast<int>(model->size());
  auto stage = slice_layers(*model, g.stage * C / P, (g.stage + 1) * C / P);
  model.reset();

  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedDataParallel> sdp;
  std::unique_ptr<optim::Adam> opt;
  PipelineOptions po;
  if (zero_stage == 0) {
    ddp = std::make_unique<DistributedDataParallel>(stage, g.data);
    po.data_parallel = ddp.get();
    opt = std::make_unique<optim::Adam>(stage->parameters(), adam());
  } else {
    sdp = std::make_unique<ShardedDataParallel>(
        stage, [](const std::vector<Tensor>& shard) { return std::make_shared<optim::Adam>(shard, adam()); }, g.data,
        ShardedOptions{.stage = zero_stage});
    po.sharded = sdp.get();
  }
  std::unique_ptr<PipelineStage> pipe;
  if (P > 1) pipe = std::make_unique<PipelineStage>(stage, g.pipeline, po);
  const ProcessGroupPtr tp = g.tensor;
  const PipeLoss loss = [tp](const Tensor& out, const Tensor& target) { return zoo::gpt_loss(out, target, tp); };
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step);
    const int64_t rows = kBatch / D;  // replica r takes rows [r B / D, (r + 1) B / D)
    Tensor xs = x.narrow(0, g.replica * rows, rows), ys = y.narrow(0, g.replica * rows, rows);
    if (opt) opt->zero_grad();
    else sdp->zero_grad();
    if (pipe) pipe->train_step(zero_stage == 1 ? gpipe_schedule(P, 2) : one_f_one_b_schedule(P, 2), xs, ys, loss);
    else loss(ddp ? (*ddp)(xs) : (*sdp)(xs), ys).backward();
    if (opt) opt->step();
    else sdp->step();
  }
  const nn::StateDict got = sdp ? sdp->full_state_dict() : stage->state_dict();
  ASSERT_FALSE(got.empty());
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(want.count(name)) << name;
    const Tensor w = tp_share(want.at(name), t.shape(), g.tensor_rank);
    ASSERT_EQ(t.shape(), w.shape()) << name;
    EXPECT_LE(amax(abs(t - w)).item(), 1e-10) << name << " on " << g.describe();
  }
}

TEST_F(GridTest, GptOnEveryGridEqualsOneProcess) {
  const nn::StateDict want = one_process();
  for (const GridShape& shape : shapes_of(world()->size())) expect_gpt_grid_equals_one_process(shape, 0, want);
}

TEST_F(GridTest, GptWithShardedDataDimensionEqualsOneProcess) {
  if (world()->size() == 1) GTEST_SKIP() << "needs a data dimension of 2 or more ranks";
  const nn::StateDict want = one_process();
  for (const GridShape& shape : shapes_of(world()->size())) {
    if (shape.data == 1) continue;
    for (int zero = 1; zero <= (shape.pipeline == 1 ? 3 : 2); ++zero) expect_gpt_grid_equals_one_process(shape, zero, want);
  }
}

// The one-process model: the plan names only modules the model has, and splitting over a group of one
// leaves every parameter as it was.
TEST_F(GridTest, GptPlanCoversTheModelAndTheModelIsGpt2Shaped) {
  auto m = zoo::gpt(zoo::GptConfig{.vocab = 128, .context = 64, .layers = 4, .heads = 4, .embed = 128});
  // GPT-2's count: V E + T E + L (12 E^2 + 13 E) + 2 E, plus an untied head V E without bias.
  const int64_t V = 128, T = 64, L = 4, E = 128;
  EXPECT_EQ(m->num_parameters(), V * E + T * E + L * (12 * E * E + 13 * E) + 2 * E + V * E);
  const auto before = m->state_dict();
  const auto res = parallelize_module(*m, world()->split(world()->rank(), 0),
                                      zoo::gpt_tensor_parallel_plan(zoo::GptConfig{.layers = 4}));
  EXPECT_EQ(res.replaced.size(), 1u + 4u * 6u + 1u);
  for (const auto& [name, t] : m->state_dict()) EXPECT_EQ(amax(abs(t - before.at(name))).item(), 0.0) << name;
}

}  // namespace

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
