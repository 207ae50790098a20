// Mixed precision across ranks, run plainly (a world of one) and under `mpiexec -n 2` and `-n 4`:
// an inf or NaN in one rank's gradients makes every rank skip its step and back off, also where the
// gradients are not all-reduced (ranks holding different parameters, and the stages of a pipeline
// run under autocast), and data-parallel training under autocast with a GradScaler equals one
// process training on the whole batch.
#include <cmath>
#include <cstring>
#include <limits>

#include "braid/amp.h"
#include "braid/distributed/pipeline.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "mpi_test_main.h"
#include "test_device.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;
using braid::testing::N;
using braid::testing::R;

namespace {

/// The rank whose gradients overflow: rank 1, or rank 0 in a world of one.
int poisoned_rank() { return N() > 1 ? 1 : 0; }

/// Multiplies one element of p's gradient by infinity.
void poison(const Tensor& p) { p.grad().view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity()); }

std::vector<float> values(const nn::Module& m) {
  std::vector<float> all;
  for (const Tensor& p : m.parameters()) {
    const std::vector<float> v = p.contiguous().to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

/// Bitwise equality of two float vectors (NaN-safe, -0 != +0).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Linear 6 -> 12, then (Tanh, Linear 12 -> 12) hidden times, then Tanh, Linear 12 -> 3.
std::shared_ptr<nn::Sequential> mlp(uint64_t seed, int hidden = 1) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 12));
  for (int i = 0; i < hidden; ++i) m->add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(12, 12));
  m->add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(12, 3));
  return m;
}

}  // namespace

class AmpDistributed : public DistTest {};

TEST_F(AmpDistributed, AnInfOnOneRankSkipsTheStepOnEveryRank) {
  // Each rank trains parameters of its own, as a pipeline stage does: no gradient is all-reduced,
  // so only the scaler's agreement can tell rank 0 about rank 1's overflow.
  auto m = mlp(100 + static_cast<uint64_t>(R()));
  optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler({.init_scale = 1024, .growth_interval = 2});
  Generator gen(200 + static_cast<uint64_t>(R()));
  Tensor x = randn({5, 6}, kFloat32, &gen), y = randint(0, 3, {5}, kInt64, &gen);
  auto step = [&](bool overflow) {
    opt.zero_grad();
    {
      autocast guard(kBFloat16);
      scaler.scale(nn::cross_entropy(m->forward(x), y)).backward();
    }
    if (overflow) poison(m->parameters()[2]);
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(step(false));
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  const std::vector<float> before = values(*m);
  EXPECT_FALSE(step(R() == poisoned_rank()))
      << "rank " << R() << " stepped although rank " << poisoned_rank() << " overflowed";
  EXPECT_TRUE(same_bits(values(*m), before)) << "rank " << R();
  EXPECT_EQ(scaler.get_scale(), 512.0) << "rank " << R();
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_TRUE(step(false));
  EXPECT_FALSE(same_bits(values(*m), before));
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST_F(AmpDistributed, PipelineStagesUnderAutocastSkipTogether) {
  if (N() == 1) GTEST_SKIP() << "a pipeline needs two ranks (run under mpiexec)";
  // Stage s of N holds a consecutive part of the MLP's 7 children, a Linear in each for N <= 4; its
  // gradients stay on its rank.
  if (N() > 4) GTEST_SKIP() << "the model has 4 layers with parameters";
  auto full = mlp(300, 2);
  const auto children = full->named_children();
  const size_t n = children.size(), k = static_cast<size_t>(N()), s = static_cast<size_t>(R());
  auto stage = std::make_shared<nn::Sequential>();
  for (size_t i = n * s / k; i < n * (s + 1) / k; ++i) stage->add(children[i].second, children[i].first);
  PipelineStage pipe(stage, world());
  optim::Adam opt(stage->parameters(), {.lr = 0.01});
  optim::GradScaler scaler({.init_scale = 4096});
  Generator gen(400);
  Tensor x = randn({8, 6}, kFloat32, &gen), y = randint(0, 3, {8}, kInt64, &gen);
  const PipeLoss loss = [&](const Tensor& out, const Tensor& t) { return scaler.scale(nn::cross_entropy(out, t)); };
  auto step = [&](bool overflow) {
    opt.zero_grad();
    {
      autocast guard(kFloat16);  // forward and, inside train_step, backward run in the scope
      pipe.train_step(gpipe_schedule(N(), 2), x, y, loss);
    }
    if (overflow) poison(stage->parameters()[0]);
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(step(false));
  const std::vector<float> before = values(*stage);
  const optim::OptimizerState state = opt.state_dict();
  EXPECT_FALSE(step(R() == poisoned_rank())) << "stage " << R();
  EXPECT_TRUE(same_bits(values(*stage), before)) << "stage " << R();
  EXPECT_EQ(opt.state_dict().scalars, state.scalars) << "stage " << R();
  EXPECT_EQ(scaler.get_scale(), 2048.0);
  EXPECT_TRUE(step(false));
  EXPECT_FALSE(same_bits(values(*stage), before));
}

TEST_F(AmpDistributed, DataParallelEqualsOneProcessUnderAutocastAndGradScaler) {
  const int64_t per_rank = 4, rows = per_rank * N();
  const int steps = 6, nan_step = 2;
  // The global batch of a step; at nan_step, row 0 (rank 0's shard) is NaN, so every rank's
  // all-reduced gradient is NaN and every rank, like the reference, skips.
  auto batch = [&](int step) {
    Generator g(500 + static_cast<uint64_t>(step));
    Tensor x = randn({rows, 6}, kFloat32, &g), y = randint(0, 3, {rows}, kInt64, &g);
    if (step == nan_step) x.narrow(0, 0, 1).fill_(std::nan(""));
    return std::pair{x, y};
  };
  auto train = [&](bool ddp_on) {
    auto m = mlp(600);
    std::unique_ptr<DistributedDataParallel> ddp;
    if (ddp_on) ddp = std::make_unique<DistributedDataParallel>(m, world());
    optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::GradScaler scaler({.growth_interval = 2});
    std::vector<double> scales;
    std::vector<bool> stepped;
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batch(s);
      if (ddp_on) x = x.narrow(0, R() * per_rank, per_rank), y = y.narrow(0, R() * per_rank, per_rank);
      opt.zero_grad();
      Tensor loss;
      {
        autocast guard(kBFloat16);
        loss = nn::cross_entropy(m->forward(x), y);
      }
      scaler.scale(loss).backward();
      stepped.push_back(scaler.step(opt));
      scaler.update();
      scales.push_back(scaler.get_scale());
    }
    return std::tuple{values(*m), scales, stepped};
  };
  const auto [ref_w, ref_scales, ref_stepped] = train(false);
  const auto [w, scales, stepped] = train(true);
  // 2^16, grown at the second clean step, backed off at the NaN, grown again two clean steps later.
  EXPECT_EQ(ref_scales, (std::vector<double>{65536, 131072, 65536, 65536, 131072, 131072}));
  EXPECT_EQ(ref_stepped, (std::vector<bool>{true, true, false, true, true, true}));
  EXPECT_EQ(scales, ref_scales);
  EXPECT_EQ(stepped, ref_stepped);
  ASSERT_EQ(w.size(), ref_w.size());
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(w[i]) - ref_w[i]));
  // Where autocast keeps activations in bfloat16 (a GPU's rule, Note [Autocast]), each rank's partial
  // sums of a gradient (a bias's, over its rows) round to 8 bits where one process rounds the whole
  // sum once: reduction order shows at bfloat16's precision, 2^-8 relative.
  EXPECT_LE(worst, test::autocast_keeps_half(test::test_device()) ? 1e-3 : 1e-5) << "rank " << R();
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
