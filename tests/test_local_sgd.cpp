// Local SGD and DiLoCo (braid/distributed/local_sgd.h), run plainly and under `mpiexec -n 2` and
// `-n 4`: H = 1 with outer SGD at rate 1 against DistributedDataParallel (bit for bit on exact
// dyadic data, to rounding otherwise: Note [Local SGD equals data parallelism at H = 1]); the
// all-reduces H times fewer by the group's counter; the outer Nesterov step against its formula
// written out here; checkpoints (the last sync, or exactly mid-period from per-rank files); the
// automatic period's rule on numbers and the ranks' agreement.
#include <cmath>

#include "braid/autograd.h"
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

class LocalSgd : public DistTest {};

/// Linear(3, 2) with weights k / 8: with inputs k / 8, integer targets, a mean over 8 numbers and
/// learning rate 1/4, every product and sum below stays exact in float64.
std::shared_ptr<nn::Linear> dyadic_linear() {
  auto m = std::make_shared<nn::Linear>(3, 2);
  m->to(kFloat64);
  NoGradGuard no_grad;
  Tensor w = m->weight(), b = m->bias();
  w.copy_(tensor(std::vector<double>{1, -2, 3, 0, 2, -1}, {2, 3}).to(kFloat64) * 0.125);
  b.copy_(tensor(std::vector<double>{0.5, -0.25}, {2}).to(kFloat64));
  return m;
}

/// Rank r's 4 rows of a step's 4 N: inputs k / 8, integer targets.
std::pair<Tensor, Tensor> dyadic_batch(int step, int rank) {
  std::vector<double> x, y;
  for (int i = 0; i < 4; ++i) {
    const int row = rank * 4 + i;
    for (int j = 0; j < 3; ++j) x.push_back(((row * 3 + j + step * 5) % 7 - 3) * 0.125);
    for (int j = 0; j < 2; ++j) y.push_back((row + j + step) % 3 - 1);
  }
  return {tensor(x, {4, 3}).to(kFloat64), tensor(y, {4, 2}).to(kFloat64)};
}

std::vector<Tensor> train_linear(bool local, int steps) {
  auto m = dyadic_linear();
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<LocalSGD> ls;
  if (local) ls = std::make_unique<LocalSGD>(m, world(), LocalSGDOptions{.period = 1});
  else ddp = std::make_unique<DistributedDataParallel>(m, world());
  optim::SGD opt(m->parameters(), {.lr = 0.25});
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = dyadic_batch(s, R());
    opt.zero_grad();
    nn::mse_loss(m->forward(x), y).backward();
    opt.step();
    if (ls) ls->step();
  }
  return {m->weight().clone(), m->bias().clone()};
}

std::shared_ptr<nn::Sequential> mlp() {
  manual_seed(4);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 16)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(16, 3));
  m->to(kFloat64);
  return m;
}

/// steps of SGD on this rank's shard of the MLP's data, with LocalSGD (options) or DDP (null).
std::vector<Tensor> train_mlp(const LocalSGDOptions* options, int steps, Traffic* traffic = nullptr) {
  auto m = mlp();
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<LocalSGD> ls;
  if (options) ls = std::make_unique<LocalSGD>(m, world(), *options);
  else ddp = std::make_unique<DistributedDataParallel>(m, world());
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  world()->reset_traffic();
  for (int s = 0; s < steps; ++s) {
    Generator g(40 + static_cast<uint64_t>(s));
    Tensor x = randn({8 * N(), 6}, kFloat64, &g), y = randint(0, 3, {8 * N()}, kInt64, &g);
    opt.zero_grad();
    nn::cross_entropy(m->forward(x.narrow(0, 8 * R(), 8)), y.narrow(0, 8 * R(), 8)).backward();
    opt.step();
    if (ls) ls->step();
  }
  if (traffic) *traffic = world()->traffic();
  return m->parameters();
}

}  // namespace

TEST_F(LocalSgd, PeriodOneWithOuterSgdIsDataParallel) {
  const auto ddp = train_linear(false, 4), local = train_linear(true, 4);
  for (size_t i = 0; i < ddp.size(); ++i) EXPECT_EQ(amax(abs(ddp[i] - local[i])).item(), 0.0) << i;
  const LocalSGDOptions one{.period = 1};
  const auto a = train_mlp(nullptr, 5), b = train_mlp(&one, 5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(amax(abs(a[i] - b[i])).item(), 1e-14) << i;
}

TEST_F(LocalSgd, AllReducesFallHTimesAndRanksAgreeAfterEachSync) {
  Traffic ddp, local;
  (void)train_mlp(nullptr, 8, &ddp);
  const LocalSGDOptions four{.period = 4};
  const auto params = train_mlp(&four, 8, &local);
  const int64_t psi = 6 * 16 + 16 + 16 * 3 + 3;
  EXPECT_EQ(ddp.all_reduce.calls, 8);  // one bucket of every parameter per step
  EXPECT_EQ(ddp.all_reduce.elements, 8 * psi);
  EXPECT_EQ(local.all_reduce.calls, 2);  // steps 4 and 8: one flat float64 buffer each
  EXPECT_EQ(local.all_reduce.elements, 2 * psi);
  EXPECT_EQ(local.all_reduce.bytes, 2 * psi * 8);
  EXPECT_EQ(4 * local.all_reduce.bytes, ddp.all_reduce.bytes);  // H = 4 times fewer
  for (const Tensor& p : params) {
    Tensor all = world()->all_gather(p.to(Device::cpu()));
    for (int r = 1; r < N(); ++r) EXPECT_EQ(amax(abs(all.select(0, r) - all.select(0, 0))).item(), 0.0);
  }
}

TEST_F(LocalSgd, BatchNormStatisticsTravelInTheSameAllReduceAndEndAlike) {
  manual_seed(5);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 5))
      .add(std::make_shared<nn::BatchNorm1d>(5))
      .add(std::make_shared<nn::Linear>(5, 3));
  m->to(kFloat64);
  LocalSGD ls(m, world(), {.period = 3});
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  world()->reset_traffic();
  for (int s = 0; s < 6; ++s) {
    Generator g(90 + static_cast<uint64_t>(s) + 7 * static_cast<uint64_t>(R()));  // each rank its own data
    opt.zero_grad();
    nn::cross_entropy(m->forward(randn({8, 6}, kFloat64, &g)), randint(0, 3, {8}, kInt64, &g)).backward();
    opt.step();
    ls.step();
  }
  const Traffic t = world()->traffic();
  const int64_t psi = 6 * 5 + 5 + 2 * 5 + 5 * 3 + 3, stats = 2 * 5;  // parameters; running mean and var
  EXPECT_EQ(t.all_reduce.calls, 2);
  EXPECT_EQ(t.all_reduce.elements, 2 * (psi + stats));
  for (const auto& [name, b] : m->named_buffers()) {
    if (!is_floating(b.dtype())) continue;
    Tensor all = world()->all_gather(b.to(Device::cpu()));
    for (int r = 1; r < N(); ++r) EXPECT_EQ(amax(abs(all.select(0, r) - all.select(0, 0))).item(), 0.0) << name;
  }
}

TEST_F(LocalSgd, SyncNowAveragesMidPeriodOnlyWhenTheRanksStepped) {
  const LocalSGDOptions four{.period = 4};
  auto m = mlp();
  LocalSGD ls(m, world(), four);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  world()->reset_traffic();
  for (int s = 0; s < 6; ++s) {
    Generator g(70 + static_cast<uint64_t>(s) + 5 * static_cast<uint64_t>(R()));
    opt.zero_grad();
    nn::cross_entropy(m->forward(randn({8, 6}, kFloat64, &g)), randint(0, 3, {8}, kInt64, &g)).backward();
    opt.step();
    ls.step();
  }
  EXPECT_EQ(ls.local_steps(), 2);
  EXPECT_TRUE(ls.sync_now());  // 2 steps after the sync at 4
  EXPECT_FALSE(ls.sync_now());  // nothing since
  EXPECT_EQ(ls.syncs(), 2);
  EXPECT_EQ(ls.local_steps(), 0);
  EXPECT_EQ(world()->traffic().all_reduce.calls, 2);
  const auto params = m->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(amax(abs(params[i] - ls.anchor()[i])).item(), 0.0) << i;
    Tensor all = world()->all_gather(params[i].to(Device::cpu()));
    for (int r = 1; r < N(); ++r) EXPECT_EQ(amax(abs(all.select(0, r) - all.select(0, 0))).item(), 0.0) << i;
  }
}

TEST_F(LocalSgd, NesterovOuterStepFollowsItsFormula) {
  // One parameter w; rank r moves it by -(r + 1) / 4 per local step (its gradient (r + 1), rate 1/4).
  auto m = std::make_shared<nn::Linear>(1, 1, false);
  m->to(kFloat64);
  {
    NoGradGuard no_grad;
    Tensor(m->weight()).fill_(2.0);
  }
  const double mu = 0.5, lr = 0.75;
  LocalSGD ls(m, world(), {.period = 2, .outer = "nesterov", .outer_lr = lr, .outer_momentum = mu});
  optim::SGD opt(m->parameters(), {.lr = 0.25});
  double anchor = 2.0, buf = 0.0;
  const double mean_move = 0.25 * (N() + 1) / 2.0;  // mean over ranks of (r + 1) / 4, per local step
  for (int s = 1; s <= 6; ++s) {
    opt.zero_grad();
    (m->forward(ones({1, 1}, kFloat64)) * static_cast<double>(R() + 1)).sum().backward();
    opt.step();
    const bool synced = ls.step();
    EXPECT_EQ(synced, s % 2 == 0);
    if (!synced) continue;
    const double delta = 2 * mean_move;  // anchor - mean theta after 2 local steps
    buf = mu * buf + delta;
    anchor -= lr * (delta + mu * buf);
    EXPECT_NEAR(m->weight().item(), anchor, 1e-14) << "sync " << s / 2;
  }
}

TEST_F(LocalSgd, ACheckpointAtASyncContinuesBitwiseAndRestoresTheAnchor) {
  const LocalSGDOptions o{.period = 2, .outer = "nesterov", .outer_lr = 0.7};
  auto run = [&](int steps, Checkpoint* save_at_4, const Checkpoint* start) {
    auto m = mlp();
    LocalSGD ls(m, world(), o);
    optim::SGD opt(m->parameters(), {.lr = 0.1});
    int first = 0;
    if (start) ls.restore(*start, "ls."), first = 4;
    for (int s = first; s < steps; ++s) {
      Generator g(60 + static_cast<uint64_t>(s));
      Tensor x = randn({8 * N(), 6}, kFloat64, &g), y = randint(0, 3, {8 * N()}, kInt64, &g);
      opt.zero_grad();
      nn::cross_entropy(m->forward(x.narrow(0, 8 * R(), 8)), y.narrow(0, 8 * R(), 8)).backward();
      opt.step();
      ls.step();
      if (save_at_4 && s == 3) ls.store(*save_at_4, "ls.");
    }
    return m->parameters();
  };
  Checkpoint ck;
  const auto whole = run(8, &ck, nullptr);
  EXPECT_EQ(ck.integers.at("ls.syncs"), 2);
  const auto resumed = run(8, nullptr, &ck);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(amax(abs(whole[i] - resumed[i])).item(), 0.0) << i;
  // Mid-period, a restore puts the last synchronised parameters back.
  auto m = mlp();
  LocalSGD ls(m, world(), o);
  {
    NoGradGuard no_grad;
    for (Tensor p : m->parameters()) p.add_(ones_like(p));
  }
  ls.restore(ck, "ls.");
  for (size_t i = 0; i < ls.anchor().size(); ++i)
    EXPECT_EQ(amax(abs(m->parameters()[i] - ck.tensors.at("ls.anchor." + m->named_parameters()[i].first))).item(), 0.0);
  Checkpoint bad;
  EXPECT_THROW(ls.restore(bad, "ls."), ValueError);
}

TEST_F(LocalSgd, AnExactResumeMidPeriodOrAtASyncContinuesBitwise) {
  // Every rank keeps its own checkpoint (its parameters, its inner AdamW's state and LocalSGD's), as a
  // job that writes a file per rank would; a restore of that continues as if never stopped.
  const LocalSGDOptions o{.period = 4, .outer = "nesterov", .outer_lr = 0.7};
  auto run = [&](int steps, int stop, Checkpoint* save, const Checkpoint* start) {
    auto m = mlp();
    LocalSGD ls(m, world(), o);
    optim::AdamW opt(m->parameters(), {.lr = 0.01});
    int first = 0;
    if (start) {
      restore_state(*start, "model.", *m);
      restore_state(*start, "optim.", opt);
      ls.restore(*start, "ls.", LocalSGDResume::Exact);
      first = stop;
    }
    for (int s = first; s < steps; ++s) {
      Generator g(80 + static_cast<uint64_t>(s));
      Tensor x = randn({8 * N(), 6}, kFloat64, &g), y = randint(0, 3, {8 * N()}, kInt64, &g);
      opt.zero_grad();
      nn::cross_entropy(m->forward(x.narrow(0, 8 * R(), 8)), y.narrow(0, 8 * R(), 8)).backward();
      opt.step();
      ls.step();
      if (save && s + 1 == stop) {
        store_state(*save, "model.", *m);
        store_state(*save, "optim.", opt);
        ls.store(*save, "ls.");
      }
    }
    return m->parameters();
  };
  const auto whole = run(12, 0, nullptr, nullptr);
  for (int stop : {6, 8}) {  // 2 local steps after the sync at 4; the sync at 8
    Checkpoint ck;
    (void)run(stop, stop, &ck, nullptr);
    EXPECT_EQ(ck.integers.at("ls.local_steps"), stop % 4);
    EXPECT_EQ(ck.integers.at("ls.syncs"), stop / 4);
    const auto resumed = run(12, stop, nullptr, &ck);
    for (size_t i = 0; i < whole.size(); ++i)
      EXPECT_EQ(amax(abs(whole[i] - resumed[i])).item(), 0.0) << "stopped after " << stop << ", parameter " << i;
    if (N() > 1) {  // the last rank's file a step further on: the ranks would not sync together
      Checkpoint skewed = ck;
      if (R() == N() - 1) skewed.integers["ls.local_steps"] = stop % 4 + 1;
      auto m = mlp();
      LocalSGD ls(m, world(), o);
      EXPECT_THROW(ls.restore(skewed, "ls.", LocalSGDResume::Exact), ValueError);
    }
  }
  Checkpoint old;  // a checkpoint without the counter resumes from its last sync only
  {
    auto m = mlp();
    LocalSGD ls(m, world(), o);
    ls.store(old, "ls.");
    old.integers.erase("ls.local_steps");
    EXPECT_THROW(ls.restore(old, "ls.", LocalSGDResume::Exact), ValueError);
    EXPECT_NO_THROW(ls.restore(old, "ls."));
  }
}

TEST_F(LocalSgd, TheAutomaticPeriodKeepsCommunicationUnderItsShareAndRanksAgree) {
  // sync / (H step + sync) <= f: 1 s against 0.1 s steps at 10% needs H = 90 (1 / (9 + 1) = 10%).
  EXPECT_EQ(choose_period(0.1, 1.0, 0.1, 1000), 90);
  EXPECT_EQ(choose_period(0.1, 1.0, 0.5, 1000), 10);
  EXPECT_EQ(choose_period(1.0, 0.01, 0.1, 1000), 1);
  EXPECT_EQ(choose_period(0.001, 1.0, 0.1, 50), 50);
  EXPECT_EQ(choose_period(0.0, 1.0, 0.1, 50), 1);
  const LocalSGDOptions automatic{.period = 0, .max_period = 3};
  auto m = mlp();
  LocalSGD ls(m, world(), automatic);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  for (int s = 0; s < 12; ++s) {
    opt.zero_grad();
    nn::cross_entropy(m->forward(ones({2, 6}, kFloat64)), zeros({2}, kInt64)).backward();
    opt.step();
    ls.step();
    const auto periods = world()->all_gather(full({1}, static_cast<double>(ls.period()), kFloat64, Device::cpu()));
    for (double p : periods.to_vector<double>()) EXPECT_EQ(p, static_cast<double>(ls.period()));
    EXPECT_GE(ls.period(), 1);
    EXPECT_LE(ls.period(), 3);
  }
  EXPECT_GE(ls.syncs(), 4);  // at most 3 steps between syncs
}

TEST_F(LocalSgd, BadOptionsAreRefusedNamingThem) {
  auto m = mlp();
  EXPECT_THROW(LocalSGD(m, world(), {.period = -1}), ValueError);
  try {
    LocalSGD(m, world(), {.outer = "adam"});
    ADD_FAILURE() << "accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("outer must be 'sgd' or 'nesterov', got 'adam'"), std::string::npos);
  }
  EXPECT_THROW(LocalSGD(m, world(), {.outer_momentum = 1.0}), ValueError);
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
