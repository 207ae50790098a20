// Process-group collectives and data-parallel training, run by the suite plainly (a world of one)
// and under `mpiexec -n 2` and `-n 4`. Expected values are closed forms in the rank and the world
// size, or single-process training of the same model on the concatenated batch, computed on every
// rank without communication.
#include <cmath>
#include <csignal>

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "braid/autograd.h"
#include "braid/checkpoint.h"
#include "braid/data.h"
#include "braid/distributed.h"
#include "braid/nn/nn.h"
#include "braid/onnx/export.h"
#include "braid/onnx/module.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "mpi_test_main.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;
using braid::testing::N;
using braid::testing::R;

namespace {

double max_of(const Tensor& t) { return amax(t.to(kFloat64)).item(); }
double min_of(const Tensor& t) { return -amax(-t.to(kFloat64)).item(); }

/// (i % 7) + 1 for i in [0, n), in float64.
Tensor cycle7(int64_t n) {
  Tensor i = arange(0, static_cast<double>(n), 1, kFloat64);
  return i - floor(i * (1.0 / 7.0)) * 7.0 + 1.0;
}

/// x[i] = (rank + 1) * (i % 7 + 1) / 8: its sum over ranks is (i % 7 + 1) / 8 * N (N + 1) / 2.
Tensor rank_values(int64_t n, DType dt, int rank) {
  return (cycle7(n) * ((rank + 1) / 8.0)).to(dt);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(a.to(kFloat64) - b.to(kFloat64))).item();
}

/// True when every rank holds bitwise the same t.
bool same_on_all_ranks(const Tensor& t) {
  Tensor all = world()->all_gather(t.contiguous());
  for (int r = 1; r < N(); ++r)
    if (max_abs_diff(all.select(0, r), all.select(0, 0)) != 0.0) return false;
  return true;
}

}  // namespace

class Collectives : public DistTest {};

TEST_F(Collectives, WorldMatchesLauncher) {
  const auto& info = world_info();
  EXPECT_EQ(info.rank, R());
  EXPECT_EQ(info.size, N());
  EXPECT_GE(info.local_rank, 0);
  EXPECT_LT(info.local_rank, info.local_size);
  EXPECT_NE(rank_table().find("rank " + std::to_string(R()) + " = pid"), std::string::npos) << rank_table();
}

// Note [Preemption]: a signal that reaches one rank stops every rank after the same step.
TEST_F(Collectives, APreemptionSignalOnOneRankIsSeenByEveryRank) {
  struct sigaction old_usr1 {}, old_term {};  // braid's fatal-signal handler, put back at the end
  ::sigaction(SIGUSR1, nullptr, &old_usr1);
  ::sigaction(SIGTERM, nullptr, &old_term);
  catch_preemption_signals();
  clear_preemption();
  EXPECT_FALSE(preemption_requested());
  EXPECT_EQ(preemption_signal(), "");
  const int signalled = N() - 1;  // the last rank alone
  if (R() == signalled) std::raise(SIGUSR1);
  EXPECT_TRUE(preemption_requested()) << "rank " << R();
  EXPECT_EQ(preemption_signal(), R() == signalled ? "SIGUSR1" : "");
  clear_preemption();
  if (R() == 0) std::raise(SIGTERM);  // caught, not fatal
  EXPECT_TRUE(preemption_requested());
  EXPECT_EQ(preemption_signal(), R() == 0 ? "SIGTERM" : "");
  clear_preemption();
  EXPECT_FALSE(preemption_requested());
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
}

TEST_F(Collectives, AllReduceSumAverageMaxMinAcrossSizesAndDtypes) {
  // 1000 elements take MPI_Iallreduce; 300,000 float32 (1.2 MB) take the ring.
  for (int64_t n : {1, 1000, 300000}) {
    for (DType dt : {kFloat32, kFloat64}) {
      const double total = N() * (N() + 1) / 2.0;
      Tensor expect = cycle7(n) * (total / 8.0);
      Tensor s = rank_values(n, dt, R());
      world()->all_reduce(s, ReduceOp::Sum);
      EXPECT_LE(max_abs_diff(s, expect), dt == kFloat32 ? 1e-5 : 1e-12) << "sum n=" << n << " " << dtype_name(dt);
      Tensor a = rank_values(n, dt, R());
      world()->all_reduce(a, ReduceOp::Average);
      EXPECT_LE(max_abs_diff(a, expect * (1.0 / N())), dt == kFloat32 ? 1e-6 : 1e-13) << "average n=" << n;
      Tensor mx = rank_values(n, dt, R());
      world()->all_reduce(mx, ReduceOp::Max);
      EXPECT_EQ(max_abs_diff(mx, rank_values(n, dt, N() - 1)), 0.0) << "max n=" << n;
      Tensor mn = rank_values(n, dt, R());
      world()->all_reduce(mn, ReduceOp::Min);
      EXPECT_EQ(max_abs_diff(mn, rank_values(n, dt, 0)), 0.0) << "min n=" << n;
      EXPECT_TRUE(same_on_all_ranks(s));
    }
  }
  Tensor ints = full({5}, R() + 1.0, kInt64);
  world()->all_reduce(ints, ReduceOp::Sum);
  EXPECT_EQ(ints.to_vector<int64_t>(), std::vector<int64_t>(5, N() * (N() + 1) / 2));
}

TEST_F(Collectives, CompressedWireIsCloseAndIdenticalOnEveryRank) {
  for (WireDType w : {WireDType::Float16, WireDType::BFloat16}) {
    const int64_t n = 100000;
    Tensor t = rank_values(n, kFloat32, R());
    AllReduceOptions o;
    o.wire_dtype = w;
    world()->all_reduce(t, ReduceOp::Sum, o);
    const double total = N() * (N() + 1) / 2.0;
    Tensor expect = cycle7(n) * (total / 8.0);
    // Each partial sum is rounded once to the wire dtype: relative error below N ulps.
    const double ulp = w == WireDType::Float16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    EXPECT_LE(max_abs_diff(t, expect), N() * ulp * max_of(expect));
    EXPECT_TRUE(same_on_all_ranks(t));
  }
}

TEST_F(Collectives, DeterministicRingIsBitwiseRepeatable) {
  Generator g(42 + static_cast<uint64_t>(R()));
  Tensor x = randn({77777}, kFloat32, &g);
  AllReduceOptions o;
  o.deterministic = true;
  Tensor a = x.clone(), b = x.clone();
  world()->all_reduce(a, ReduceOp::Sum, o);
  world()->all_reduce(b, ReduceOp::Sum, o);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  EXPECT_TRUE(same_on_all_ranks(a));
  // The same numbers as adding the ranks' tensors in float64 and rounding, within float32 rounding.
  Tensor all = world()->all_gather(x);
  EXPECT_LE(max_abs_diff(a, all.to(kFloat64).sum({0})), 1e-5 * N());
}

TEST_F(Collectives, BroadcastAllGatherReduceScatterBarrier) {
  for (int root = 0; root < N(); ++root) {
    Tensor t = full({3, 4}, R() == root ? 7.5 + root : -1.0, kFloat64);
    world()->broadcast(t, root);
    EXPECT_EQ(max_of(t), 7.5 + root);
    EXPECT_EQ(min_of(t), 7.5 + root);
  }
  Tensor g = world()->all_gather(full({2}, R() * 10.0, kFloat32));
  ASSERT_EQ(g.shape(), (Shape{N(), 2}));
  for (int r = 0; r < N(); ++r) EXPECT_EQ(g.select(0, r).to_vector<float>(), std::vector<float>(2, r * 10.0f));
  // reduce_scatter: slice r of the sum goes to rank r.
  Tensor x = arange(0, 2.0 * N(), 1, kFloat64).reshape({N(), 2}) * (R() + 1.0);
  Tensor mine = world()->reduce_scatter(x, ReduceOp::Sum);
  const double total = N() * (N() + 1) / 2.0;
  EXPECT_EQ(mine.to_vector<double>(), (std::vector<double>{2.0 * R() * total, (2.0 * R() + 1) * total}));
  world()->barrier();
}

TEST_F(Collectives, FreeFunctionsRunOnTheWorldOrTheGroupGiven) {
  EXPECT_EQ(get_rank(), R());
  EXPECT_EQ(get_world_size(), N());
  Tensor t = full({3}, R() + 1.0, kFloat64);
  Tensor same = all_reduce(t);  // in place, and returned
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(3, N() * (N() + 1) / 2.0));
  EXPECT_EQ(same.data_ptr(), t.data_ptr());
  all_reduce(t, ReduceOp::Max);
  EXPECT_EQ(max_of(t), N() * (N() + 1) / 2.0);
  Tensor b = full({2}, R() * 10.0, kFloat32);
  broadcast(b, N() - 1);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(2, (N() - 1) * 10.0f));
  Tensor g = all_gather(full({1}, R() + 0.5, kFloat64));
  ASSERT_EQ(g.shape(), (Shape{N(), 1}));
  for (int r = 0; r < N(); ++r) EXPECT_EQ(g.select(0, r).item(), r + 0.5);
  // On a group: the odd and the even ranks reduce separately.
  auto sub = world()->split(R() % 2, R());
  EXPECT_EQ(get_rank(sub), R() / 2);
  EXPECT_EQ(get_world_size(sub), (N() + 1 - R() % 2) / 2);
  Tensor s = all_reduce(full({1}, 1.0, kFloat64), ReduceOp::Sum, sub);
  EXPECT_EQ(s.item(), get_world_size(sub));
  EXPECT_EQ(broadcast(full({1}, R() * 1.0, kFloat64), 0, sub).item(), R() % 2);
  EXPECT_EQ(all_gather(full({1}, 2.0, kFloat64), sub).shape(), (Shape{get_world_size(sub), 1}));
  barrier(sub);
  barrier();
}

TEST_F(Collectives, SendRecvAroundTheRing) {
  if (N() == 1) GTEST_SKIP() << "point-to-point needs two ranks (run under mpiexec)";
  const int right = (R() + 1) % N(), left = (R() + N() - 1) % N();
  Tensor out = full({1000}, R() + 0.25, kFloat64);
  Tensor in = zeros({1000}, kFloat64);
  auto r = world()->irecv(in, left, 5);
  auto s = world()->isend(out, right, 5);
  s->wait();
  r->wait();
  EXPECT_EQ(min_of(in), left + 0.25);
  EXPECT_EQ(max_of(in), left + 0.25);
  // A receive of the wrong size is an error naming the sender, not garbage.
  if (N() == 2) {
    Tensor small = zeros({10}, kFloat64);
    if (R() == 0) world()->send(full({11}, 1.0, kFloat64), 1, 6);
    else EXPECT_THROW(world()->recv(small, 0, 6), DistributedError);
  }
}

TEST_F(Collectives, SplitMakesIndependentSubGroups) {
  auto sub = world()->split(R() % 2, R());
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), (N() + 1 - R() % 2) / 2);
  EXPECT_EQ(sub->rank(), R() / 2);
  EXPECT_EQ(sub->world_rank(sub->rank()), R());
  Tensor t = full({4}, static_cast<double>(R()), kFloat64);
  sub->all_reduce(t, ReduceOp::Sum);
  double expect = 0;
  for (int r = R() % 2; r < N(); r += 2) expect += r;
  EXPECT_EQ(max_of(t), expect);
  auto none = world()->split(R() == 0 ? -1 : 0, R());
  EXPECT_EQ(none == nullptr, R() == 0);
}

TEST_F(Collectives, FrontDoorErrorsNameTheOp) {
  Tensor nc = zeros({4, 4}).transpose(0, 1);
  try {
    world()->all_reduce(nc);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("contiguous"), std::string::npos) << e.what();
  }
  EXPECT_THROW(world()->broadcast(zeros({2}), N()), IndexError);
  EXPECT_THROW(world()->all_reduce(zeros({2}, kInt64), ReduceOp::Average), TypeError);
}

TEST_F(Collectives, DifferentiableAllReduceSumsGradients) {
  // loss_r = sum((r + 1) * all_reduce_sum(x_r)); d(sum_r loss_r)/dx_r = sum_r (r + 1) = N (N + 1) / 2.
  Tensor x = full({3}, 1.0 + R(), kFloat64).set_requires_grad();
  Tensor y = all_reduce_sum(x, world());
  EXPECT_EQ(max_of(y), N() + N() * (N() - 1) / 2.0);
  (y * (R() + 1.0)).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(3, N() * (N() + 1) / 2.0));
}

// ---- data-parallel training ----

namespace {

nn::ModulePtr make_mlp() {
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 12)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(12, 3));
  return m;
}

// No bias before BatchNorm (as ResNets): its exact gradient is zero, so what it receives is rounding
// noise, which Adam's normalisation would blow up into steps of size lr on either side.
nn::ModulePtr make_cnn() {
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1, 1, 1, false))
      .add(std::make_shared<nn::BatchNorm2d>(4))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::MaxPool2d>(2))
      .add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(4 * 3 * 3, 3));
  return m;
}

struct RunSpec {
  bool cnn = false;
  bool adam = false;
  DType dtype = kFloat64;
  int steps = 4;
  int64_t per_rank = 4;
  int accumulate = 1;  // micro-steps per optimizer step
  bool onnx = false;    // the model is exported to ONNX and imported back (an OnnxModule)
  DataParallelOptions ddp;
};

std::shared_ptr<optim::Optimizer> make_optimizer(nn::Module& m, bool adam) {
  if (adam) return std::make_shared<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 0.01});
  return std::make_shared<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

/// The global batch of step s: (N * per_rank) samples.
std::pair<Tensor, Tensor> global_batch(const RunSpec& s, int step, int64_t rows) {
  Generator g(1000 + static_cast<uint64_t>(step));
  Tensor x = s.cnn ? randn({rows, 1, 6, 6}, s.dtype, &g) : randn({rows, 6}, s.dtype, &g);
  Tensor y = randint(0, 3, {rows}, kInt64, &g);
  return {x, y};
}

nn::ModulePtr build(const RunSpec& s) {
  manual_seed(7);
  auto m = s.cnn ? make_cnn() : make_mlp();
  m->to(s.dtype);
  if (!s.onnx) return m;
  // Each rank writes its own file (no shared file system is assumed) and trains the import.
  const std::string path = "/tmp/braid_ddp_" + std::to_string(::getpid()) + ".onnx";
  onnx::export_onnx(*m, s.cnn ? randn({2, 1, 6, 6}, s.dtype) : randn({2, 6}, s.dtype), path);
  auto imported = onnx::OnnxModule::load(path);
  std::remove(path.c_str());
  imported->train();
  return imported;
}

/// Single-process training on the whole global batch (no communication).
nn::ModulePtr train_reference(const RunSpec& s) {
  auto m = build(s);
  auto opt = make_optimizer(*m, s.adam);
  const int64_t rows = N() * s.per_rank;
  for (int step = 0; step < s.steps; ++step) {
    opt->zero_grad();
    for (int k = 0; k < s.accumulate; ++k) {
      auto [x, y] = global_batch(s, step * s.accumulate + k, rows);
      (nn::cross_entropy(m->forward(x), y) * (1.0 / s.accumulate)).backward();
    }
    opt->step();
  }
  return m;
}

/// Data-parallel training: rank r takes rows [r b, (r + 1) b) of each global batch.
nn::ModulePtr train_ddp(const RunSpec& s, std::vector<std::vector<std::string>>* buckets = nullptr) {
  auto m = build(s);
  if (s.cnn) convert_sync_batchnorm(*m);
  DistributedDataParallel ddp(m, world(), s.ddp);
  if (buckets) *buckets = ddp.bucket_names();
  auto opt = make_optimizer(*m, s.adam);
  const int64_t rows = N() * s.per_rank;
  for (int step = 0; step < s.steps; ++step) {
    opt->zero_grad();
    for (int k = 0; k < s.accumulate; ++k) {
      auto [x, y] = global_batch(s, step * s.accumulate + k, rows);
      Tensor xs = x.narrow(0, R() * s.per_rank, s.per_rank), ys = y.narrow(0, R() * s.per_rank, s.per_rank);
      auto loss = [&] { (nn::cross_entropy(ddp(xs), ys) * (1.0 / s.accumulate)).backward(); };
      if (k + 1 < s.accumulate) {
        DistributedDataParallel::NoSync no_sync(ddp);
        loss();
      } else {
        loss();
      }
    }
    opt->step();
  }
  return m;
}

void expect_same_weights(const nn::Module& a, const nn::Module& b, double tol, const std::string& what) {
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size()) << what;
  for (const auto& [name, t] : sa) {
    const Tensor& u = sb.at(name);
    const double scale = std::max(1.0, max_of(abs(t.to(kFloat64))));
    EXPECT_LE(max_abs_diff(t, u) / scale, tol) << what << ": " << name;
  }
}

}  // namespace

class DataParallel : public DistTest {};

TEST_F(DataParallel, MlpSgdAndAdamEqualOneProcessOnTheGlobalBatch) {
  for (bool adam : {false, true}) {
    for (DType dt : {kFloat64, kFloat32}) {
      RunSpec s;
      s.adam = adam;
      s.dtype = dt;
      const std::string what = std::string(adam ? "Adam " : "SGD ") + dtype_name(dt);
      expect_same_weights(*train_ddp(s), *train_reference(s), dt == kFloat64 ? 1e-10 : 1e-5, what);
    }
  }
}

TEST_F(DataParallel, ImportedOnnxModelTrainsLikeOneProcess) {
  // An ONNX import is an ordinary module: DistributedDataParallel over N ranks equals one process.
  for (bool adam : {false, true}) {
    RunSpec s;
    s.onnx = true;
    s.adam = adam;
    expect_same_weights(*train_ddp(s), *train_reference(s), 1e-10, adam ? "ONNX import, Adam" : "ONNX import, SGD");
  }
}

TEST_F(DataParallel, CnnWithSyncBatchNormEqualsOneProcess) {
  for (bool adam : {false, true}) {
    for (DType dt : {kFloat64, kFloat32}) {
      RunSpec s;
      s.cnn = true;
      s.adam = adam;
      s.dtype = dt;
      s.steps = 3;
      s.per_rank = 3;
      const std::string what = std::string("CNN ") + (adam ? "Adam " : "SGD ") + dtype_name(dt);
      // Running statistics are buffers in the state dict, so they are compared too.
      expect_same_weights(*train_ddp(s), *train_reference(s), dt == kFloat64 ? 1e-10 : 1e-5, what);
    }
  }
}

TEST_F(DataParallel, BucketSizesAndAccumulationDoNotChangeTheResult) {
  RunSpec base;
  base.cnn = true;
  base.steps = 2;
  auto ref = train_reference(base);
  const int64_t n_params = static_cast<int64_t>(build(base)->parameters().size());
  for (double cap : {0.0, 0.0005, 25.0, 1e6}) {
    RunSpec s = base;
    s.ddp.bucket_cap_mb = cap;
    std::vector<std::vector<std::string>> buckets;
    expect_same_weights(*train_ddp(s, &buckets), *ref, 1e-10, "bucket_cap_mb=" + std::to_string(cap));
    if (cap == 0.0) {
      EXPECT_EQ(static_cast<int64_t>(buckets.size()), n_params);
    }
    if (cap >= 25.0) {
      EXPECT_EQ(buckets.size(), 1u);
    }
    if (cap == 0.0005) {  // 524 bytes: several buckets, the last layer's parameters first
      EXPECT_GT(buckets.size(), 1u);
      EXPECT_LT(static_cast<int64_t>(buckets.size()), n_params);
      EXPECT_EQ(buckets.front().front(), "5.bias");
    }
  }
  RunSpec acc = base;
  acc.accumulate = 3;
  RunSpec acc_ref = acc;
  expect_same_weights(*train_ddp(acc), *train_reference(acc_ref), 1e-10, "3 accumulation micro-steps");
}

TEST_F(DataParallel, DeterministicModeIsBitwiseRepeatableAndCompressionStaysClose) {
  RunSpec s;
  s.ddp.deterministic = true;
  s.ddp.bucket_cap_mb = 0.0005;
  s.dtype = kFloat32;
  auto a = train_ddp(s), b = train_ddp(s);
  expect_same_weights(*a, *b, 0.0, "two deterministic runs");
  for (const auto& [name, t] : a->state_dict()) EXPECT_TRUE(same_on_all_ranks(t)) << name;
  RunSpec c = s;
  c.ddp.deterministic = false;
  c.ddp.wire_dtype = WireDType::BFloat16;
  auto comp = train_ddp(c);
  for (const auto& [name, t] : comp->state_dict()) EXPECT_TRUE(same_on_all_ranks(t)) << name;
  expect_same_weights(*comp, *train_reference(s), 2e-2, "bfloat16 on the wire");
}

namespace {
/// Uses its second linear layer only when asked to.
class Branchy : public nn::Module {
 public:
  Branchy() : Module("Branchy") {
    a = register_module("a", std::make_shared<nn::Linear>(4, 2));
    b = register_module("b", std::make_shared<nn::Linear>(4, 2));
  }
  Tensor forward(const Tensor& x) override { return use_b ? a->forward(x) + b->forward(x) : a->forward(x); }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = false;
};
}  // namespace

TEST_F(DataParallel, UnusedParameters) {
  manual_seed(3);
  auto m = std::make_shared<Branchy>();
  {
    DataParallelOptions o;
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(m, world(), o);
    // Rank 0 uses b; the gradient of b is the average over ranks with zeros from the others.
    m->use_b = R() == 0;
    Tensor x = full({2, 4}, 1.0);
    ddp(x).sum().backward();
    ASSERT_TRUE(m->b->weight().grad().defined());
    EXPECT_NEAR(max_of(m->b->weight().grad()), 2.0 / N(), 1e-6);
    EXPECT_NEAR(max_of(m->a->weight().grad()), 2.0, 1e-6);
    // Unused everywhere: the gradient stays undefined, as in single-process training.
    m->zero_grad();
    m->use_b = false;
    ddp(x).sum().backward();
    EXPECT_FALSE(m->b->weight().grad().defined());
  }
  DistributedDataParallel strict(m, world());
  m->zero_grad();
  m->use_b = false;
  try {
    strict(full({2, 4}, 1.0)).sum().backward();
    FAIL() << "expected an error naming the unused parameters";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'b.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
  }
}

TEST_F(DataParallel, RanksWithDifferentModelsAreStoppedWithTheParameterName) {
  if (N() == 1) GTEST_SKIP() << "needs two ranks (run under mpiexec)";
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(4, R() == N() - 1 ? 5 : 3));
  try {
    DistributedDataParallel ddp(m, world());
    FAIL() << "expected a DistributedError";
  } catch (const DistributedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'0.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(N() - 1)), std::string::npos) << msg;
  }
}

TEST_F(DataParallel, ShardedLoaderShowsEverySampleOncePerEpochOverAllRanks) {
  // 103 samples, batch 4 per rank: the ranks together see each sample exactly once per epoch, in
  // the global order one loader with batch 4 N would give, and reshuffled the same way on every rank.
  const int64_t S = 103, b = 4;
  auto ds = std::make_shared<data::TensorDataset>(arange(0, static_cast<double>(S), 1, kFloat32).reshape({S, 1}),
                                                  zeros({S}, kInt64));
  data::DataLoaderOptions o;
  o.batch_size = b;
  o.shuffle = true;
  o.seed = 5;
  o.num_shards = N();
  o.shard = R();
  data::DataLoader loader(ds, o);
  data::DataLoaderOptions one = o;
  one.batch_size = b * N();
  one.num_shards = 1;
  one.shard = 0;
  data::DataLoader single(ds, one);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> mine, reference;
    data::Batch batch;
    while (loader.next(batch)) mine.insert(mine.end(), batch.indices.begin(), batch.indices.end());
    while (single.next(batch)) reference.insert(reference.end(), batch.indices.begin(), batch.indices.end());
    // Gather every rank's indices (padded with -1 to a common length).
    Tensor len = full({1}, static_cast<double>(mine.size()), kInt64);
    const auto lens = world()->all_gather(len).to_vector<int64_t>();
    int64_t longest = 0;
    for (int64_t l : lens) longest = std::max(longest, l);
    std::vector<int64_t> padded(mine);
    padded.resize(static_cast<size_t>(longest), -1);
    Tensor t = tensor(padded, {longest});
    const auto all = world()->all_gather(t).to_vector<int64_t>();
    std::vector<int64_t> seen;
    for (int64_t v : all)
      if (v >= 0) seen.push_back(v);
    std::vector<int64_t> sorted_seen = seen;
    std::sort(sorted_seen.begin(), sorted_seen.end());
    std::vector<int64_t> expect(S);
    for (int64_t i = 0; i < S; ++i) expect[static_cast<size_t>(i)] = i;
    EXPECT_EQ(sorted_seen, expect) << "epoch " << epoch;
    // Step j of rank r is positions [j b N + r b, ...) of the single loader's order.
    for (size_t i = 0; i < mine.size() && static_cast<int64_t>(i) < (S / (b * N())) * b; ++i) {
      const size_t j = i / static_cast<size_t>(b), k = i % static_cast<size_t>(b);
      EXPECT_EQ(mine[i], reference[j * static_cast<size_t>(b * N()) + static_cast<size_t>(R() * b) + k]) << i;
    }
  }
}

TEST_F(DataParallel, CheckpointWrittenByRankZeroIsReadByEveryRank) {
  RunSpec s;
  s.adam = true;
  auto trained = train_ddp(s);
  // One file for the job: rank 0's pid names it.
  Tensor id = full({1}, static_cast<double>(getpid()), kInt64);
  world()->broadcast(id, 0);
  const std::string path = ::testing::TempDir() + "braid_ddp_" + std::to_string(id.to_vector<int64_t>()[0]) + ".braid";
  if (R() == 0) {
    Checkpoint ck;
    store_state(ck, "model.", *trained);
    save_checkpoint(path, ck);
  }
  world()->barrier();
  manual_seed(99);  // a different start, so that only the checkpoint can make them equal
  auto fresh = make_mlp();
  fresh->to(s.dtype);
  restore_state(load_checkpoint(path), "model.", *fresh);
  expect_same_weights(*fresh, *trained, 0.0, "restored on rank " + std::to_string(R()));
  for (const auto& [name, t] : fresh->state_dict()) EXPECT_TRUE(same_on_all_ranks(t)) << name;
  world()->barrier();
  if (R() == 0) std::remove(path.c_str());
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
