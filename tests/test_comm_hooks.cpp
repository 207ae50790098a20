// DistributedDataParallel's communication hooks (braid/distributed/comm_hooks.h), run plainly and
// under `mpiexec -n 2` and `-n 4`: top-K's selection, error feedback and DGC's momentum
// correction against the same rules written out here on plain vectors; sent + residual equal to
// the accumulated gradient exactly (float64); k = 100% equal to DistributedDataParallel bit for
// bit; PowerSGD at full rank equal to it to rounding and exact on a rank-1 average; both hooks'
// traffic against their formulas, their checkpoints, and the errors. The hierarchical all-reduce
// (braid/distributed/hierarchical.h) at 4 ranks as 2 nodes x 2: the layout, the flat all-reduce's
// bits on integer-valued data, 1/L of the bytes across nodes by the counters, and DDP over it.
// Join (uneven inputs) against PyTorch's definition computed here step by step on one process.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "braid/autograd.h"
#include "braid/distributed.h"
#include "braid/distributed/hierarchical.h"
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

std::vector<double> host(const Tensor& t) { return t.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>(); }

Tensor from(const std::vector<double>& v) { return tensor(v, {static_cast<int64_t>(v.size())}); }

/// Rank r's gradient at a step: integers and halves, distinct per rank, with ties in magnitude.
std::vector<double> gradient(int64_t n, int rank, int step) {
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = static_cast<double>((i * 7 + rank * 3 + step * 5) % n) - (n - 1) / 2.0;
  return g;
}

/// The rule written out: the k largest |v| (ties to the lower index), in increasing index order.
std::vector<int64_t> top_k(const std::vector<double>& v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return std::abs(v[a]) > std::abs(v[b]); });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

GradBucket bucket_of(const Tensor& buffer) {
  GradBucket b;
  b.buffer = buffer;
  b.parameters = {buffer};
  b.offsets = {0};
  return b;
}

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 12)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(12, 3));
  m->to(kFloat64);
  return m;
}

/// Trains mlp(1) for steps SGD steps on this rank's shard with an optional hook; the parameters.
std::vector<Tensor> train(const CommHookPtr& hook, int steps, double lr = 0.1, int64_t* elements = nullptr) {
  auto m = mlp(1);
  DistributedDataParallel ddp(m, world(), {.bucket_cap_mb = 0});  // one bucket per parameter
  if (hook) ddp.register_comm_hook(hook);
  optim::SGD opt(m->parameters(), {.lr = lr});
  world()->reset_traffic();
  for (int s = 0; s < steps; ++s) {
    Generator g(50 + static_cast<uint64_t>(s));
    Tensor x = randn({8 * N(), 6}, kFloat64, &g), y = randint(0, 3, {8 * N()}, kInt64, &g);
    opt.zero_grad();
    nn::cross_entropy(ddp(x.narrow(0, 8 * R(), 8)), y.narrow(0, 8 * R(), 8)).backward();
    opt.step();
  }
  if (elements) {
    const Traffic t = world()->traffic();
    *elements = t.all_reduce.elements + t.all_gather.elements;
  }
  return m->parameters();
}

}  // namespace

class CommHooks : public DistTest {};

TEST_F(CommHooks, TopKSendsTheLargestEntriesAndKeepsTheRestExactly) {
  const int64_t n = 20;
  TopKHook hook({.ratio = 0.2});  // k = 4
  std::vector<std::vector<double>> residual(static_cast<size_t>(N()), std::vector<double>(n, 0.0));
  for (int step = 0; step < 3; ++step) {
    world()->reset_traffic();
    GradBucket b = bucket_of(from(gradient(n, R(), step)));
    b.step = step;
    const std::vector<double> before = hook.residual(0).defined() ? host(hook.residual(0)) : std::vector<double>(n, 0.0);
    hook.launch(world(), b);
    hook.finish(world(), b);
    // Every rank's selection, replayed: what the average must be.
    std::vector<double> expect(n, 0.0);
    for (int r = 0; r < N(); ++r) {
      auto& res = residual[static_cast<size_t>(r)];
      const auto g = gradient(n, r, step);
      for (int64_t i = 0; i < n; ++i) res[i] += g[i];
      for (int64_t i : top_k(res, 4)) expect[i] += res[i], res[i] = 0;
    }
    for (double& e : expect) e *= 1.0 / N();
    EXPECT_EQ(host(b.buffer), expect) << "step " << step;
    EXPECT_EQ(host(hook.residual(0)), residual[static_cast<size_t>(R())]) << "step " << step;
    // Nothing lost: this rank's sent entries plus its new residual are its old residual plus g.
    const auto g = gradient(n, R(), step);
    const auto now = host(hook.residual(0));
    int64_t sent = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double s = now[i] == 0 ? before[i] + g[i] : 0.0;
      sent += now[i] == 0 && s != 0;
      EXPECT_EQ(s + now[i], before[i] + g[i]) << i;
    }
    EXPECT_LE(sent, 4);
    // Two all-gathers (values, indices) of N k elements; no all-reduce.
    const Traffic t = world()->traffic();
    EXPECT_EQ(t.all_gather.calls, N() > 1 ? 2 : 2);
    EXPECT_EQ(t.all_gather.elements, 2 * N() * 4);
    EXPECT_EQ(t.all_reduce.calls, 0);
  }
}

TEST_F(CommHooks, DgcMomentumCorrectionAccumulatesVelocityAndMasksIt) {
  const int64_t n = 12;
  const double m = 0.5;
  TopKHook hook({.ratio = 0.25, .momentum = m});  // k = 3
  std::vector<double> u(n, 0.0), v(n, 0.0);
  for (int step = 0; step < 3; ++step) {
    GradBucket b = bucket_of(from(gradient(n, R(), step)));
    hook.launch(world(), b);
    hook.finish(world(), b);
    const auto g = gradient(n, R(), step);
    for (int64_t i = 0; i < n; ++i) u[i] = m * u[i] + g[i], v[i] += u[i];
    for (int64_t i : top_k(v, 3)) u[i] = 0, v[i] = 0;
    EXPECT_EQ(host(hook.residual(0)), v) << "step " << step;
  }
}

TEST_F(CommHooks, WarmUpAndClippingFollowTheirFormulas) {
  TopKHook warm({.ratio = 0.001, .warmup_steps = 4});
  EXPECT_DOUBLE_EQ(warm.ratio_at(0), 0.25);
  EXPECT_NEAR(warm.ratio_at(2), std::sqrt(0.25 * 0.001), 1e-15);  // geometric midpoint
  EXPECT_DOUBLE_EQ(warm.ratio_at(4), 0.001);
  EXPECT_DOUBLE_EQ(warm.ratio_at(100), 0.001);
  // Dense (ratio 1) with clipping: the average of each rank's gradient scaled to norm <= 1 / sqrt(N).
  TopKHook clip({.ratio = 1.0, .clip_norm = 1.0});
  GradBucket b = bucket_of(from({3.0 * (R() + 1), 4.0 * (R() + 1)}));  // norm 5 (r + 1)
  clip.launch(world(), b);
  clip.finish(world(), b);
  const double each = 1.0 / std::sqrt(static_cast<double>(N()));
  const auto got = host(b.buffer);
  EXPECT_NEAR(got[0], 0.6 * each, 1e-15);
  EXPECT_NEAR(got[1], 0.8 * each, 1e-15);
}

TEST_F(CommHooks, TopKOfEveryEntryIsDataParallelBitForBit) {
  const auto plain = train(nullptr, 5);
  const auto topk = train(std::make_shared<TopKHook>(TopKOptions{.ratio = 1.0}), 5);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(amax(abs(plain[i] - topk[i])).item(), 0.0) << i;
}

TEST_F(CommHooks, SparseTrainingKeepsRanksIdenticalAndSendsKValuesAndIndices) {
  int64_t dense = 0, sparse = 0;
  (void)train(nullptr, 4, 0.1, &dense);
  const auto params = train(std::make_shared<TopKHook>(TopKOptions{.ratio = 0.1}), 4, 0.1, &sparse);
  // Per step: DDP all-reduces the 6*12 + 12 + 12*3 + 3 = 123 parameters; top-K gathers N k values
  // and N k indices per parameter (k = round(0.1 n), at least 1): 7 + 1 + 4 + 1 = 13.
  EXPECT_EQ(dense, 4 * 123);
  EXPECT_EQ(sparse, 4 * 2 * N() * 13);
  for (const Tensor& p : params) {  // every rank applied the same update
    Tensor all = world()->all_gather(p.to(Device::cpu()));
    for (int r = 1; r < N(); ++r) EXPECT_EQ(amax(abs(all.select(0, r) - all.select(0, 0))).item(), 0.0);
  }
}

TEST_F(CommHooks, PowerSGDAtFullRankIsDataParallelAndItsTrafficIsRNPlusM) {
  const auto plain = train(nullptr, 5);
  int64_t elements = 0;
  // A fresh Q each step (Note [PowerSGD]: a warm-started Q turns towards the leading singular vectors,
  // which is its purpose, and resolves the smallest directions less precisely).
  const auto psgd = train(std::make_shared<PowerSGDHook>(
                              PowerSGDOptions{.rank = 12, .warm_start = false, .min_compression_rate = 0}),
                          5, 0.1, &elements);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LE(amax(abs(plain[i] - psgd[i])).item(), 1e-12) << i;
  // Per step: Linear(6, 12)'s weight (12 x 6, r = 6) sends P 12 x 6 and Q 6 x 6; Linear(12, 3)'s
  // (3 x 12, r = 3) P 3 x 3 and Q 12 x 3; the biases go whole: 12 + 3.
  EXPECT_EQ(elements, 5 * (72 + 36 + 9 + 36 + 12 + 3));
  // start_step: the plain all-reduce until then, so the first steps are DDP's bit for bit.
  const auto late = train(std::make_shared<PowerSGDHook>(PowerSGDOptions{.rank = 1, .start_step = 5}), 5);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(amax(abs(plain[i] - late[i])).item(), 0.0) << i;
}

TEST_F(CommHooks, PowerSGDOfRankOneIsExactOnARankOneAverage) {
  // Rank r's gradient (r + 1) a b^T: the average is a rank-1 matrix, which one power iteration finds.
  const std::vector<double> a{1, -2, 0.5, 3}, bv{2, 1, -1};
  std::vector<double> m;
  for (double x : a)
    for (double y : bv) m.push_back((R() + 1) * x * y);
  Tensor w = from(m).reshape({4, 3});
  GradBucket b;
  b.buffer = w.reshape({12}).clone();
  b.parameters = {w};
  b.offsets = {0};
  PowerSGDHook hook({.rank = 1, .error_feedback = true, .min_compression_rate = 0});
  hook.launch(world(), b);
  hook.finish(world(), b);
  const double mean = (N() + 1) / 2.0;
  const auto got = host(b.buffer);
  for (size_t i = 0; i < 12; ++i) EXPECT_NEAR(got[i], mean * a[i / 3] * bv[i % 3], 1e-12) << i;
}

TEST_F(CommHooks, CheckpointedHooksContinueAsIfUninterrupted) {
  const int64_t n = 16;
  TopKHook a({.ratio = 0.25, .momentum = 0.5});
  for (int step = 0; step < 2; ++step) {
    GradBucket b = bucket_of(from(gradient(n, R(), step)));
    a.launch(world(), b);
    a.finish(world(), b);
  }
  Checkpoint ck;
  a.store(ck, "hook.");
  TopKHook b_hook({.ratio = 0.25, .momentum = 0.5});
  b_hook.restore(ck, "hook.");
  GradBucket x = bucket_of(from(gradient(n, R(), 2))), y = bucket_of(from(gradient(n, R(), 2)));
  a.launch(world(), x);
  a.finish(world(), x);
  b_hook.launch(world(), y);
  b_hook.finish(world(), y);
  EXPECT_EQ(host(x.buffer), host(y.buffer));
  EXPECT_EQ(host(a.residual(0)), host(b_hook.residual(0)));
  Checkpoint bad;
  bad.tensors["hook.x.residual"] = zeros({2});
  EXPECT_THROW(b_hook.restore(bad, "hook."), ValueError);
}

TEST_F(CommHooks, HooksAreRegisteredBeforeTheFirstBackwardAndOptionsAreChecked) {
  auto m = mlp(2);
  DistributedDataParallel ddp(m, world());
  EXPECT_EQ(ddp.comm_hook().name(), "allreduce");
  nn::cross_entropy(ddp(zeros({2, 6}, kFloat64)), zeros({2}, kInt64)).backward();
  EXPECT_EQ(ddp.steps(), 1);
  try {
    ddp.register_comm_hook(std::make_shared<TopKHook>());
    ADD_FAILURE() << "registered after a backward";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("before the first backward (1 have run with allreduce)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(TopKHook({.ratio = 0}), ValueError);
  EXPECT_THROW(TopKHook({.ratio = 0.1, .momentum = 1.0}), ValueError);
  EXPECT_THROW(PowerSGDHook({.rank = 0}), ValueError);
}

class Hierarchical : public DistTest {};

TEST_F(Hierarchical, LayoutFollowsRanksPerNode) {
  const NodeLayout two = node_layout(world(), {.ranks_per_node = 2});
  EXPECT_EQ(two.nodes, (N() + 1) / 2);
  EXPECT_EQ(two.node, R() / 2);
  EXPECT_EQ(two.local_rank, R() % 2);
  EXPECT_EQ(two.hierarchical(), N() == 4);
  EXPECT_EQ(make_hierarchical_group(world(), {.ranks_per_node = 2}) != nullptr, N() == 4);
  // 4 ranks as nodes of 3 and 1: uneven, so flat.
  const NodeLayout three = node_layout(world(), {.ranks_per_node = 3});
  EXPECT_EQ(three.even, N() % 3 == 0 || N() < 3);
  EXPECT_FALSE(three.hierarchical());
  // Every rank here runs on one host.
  EXPECT_EQ(node_layout(world()).nodes, 1);
  EXPECT_THROW(node_layout(world(), {.ranks_per_node = -1}), ValueError);
}

TEST_F(Hierarchical, IntegerDataGivesTheFlatBitsWithAQuarterOfTheBytesAcrossNodes) {
  auto h = make_hierarchical_group(world(), {.ranks_per_node = 2, .min_bytes = 0});
  if (!h) GTEST_SKIP() << "needs 2 nodes of 2 ranks (mpiexec -n 4)";
  for (int64_t n : {1, 3, 7, 1000, 40001}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
      for (WireDType wire : {WireDType::Native, WireDType::Float16}) {
        // Integers below 2^10: exact in float16, and every partial sum exact.
        Tensor i = arange(0, static_cast<double>(n), 1, kFloat64) * (R() + 1);
        Tensor mine = (i - floor(i * (1.0 / 97.0)) * 97.0).to(kFloat32);  // (i (r + 1)) mod 97
        Tensor flat = mine.clone(), hier = mine.clone();
        world()->all_reduce(flat, op, {.wire_dtype = wire});
        h->intra()->reset_traffic(), h->inter()->reset_traffic();
        h->all_reduce_async(hier, op, {.wire_dtype = wire})->wait();
        EXPECT_EQ(amax(abs(flat - hier)).item(), 0.0) << "n " << n;
        // Across nodes: this rank's segment of n / 2, once; inside the node: the whole buffer twice.
        const int64_t l = h->layout().local_rank, segment = n * (l + 1) / 2 - n * l / 2;
        EXPECT_EQ(h->inter()->traffic().all_reduce.elements, segment) << "n " << n;
        EXPECT_EQ(h->intra()->traffic().reduce_scatter.elements + h->intra()->traffic().all_gather.elements, 2 * n);
      }
    }
  }
  // Random data: the same to rounding.
  Generator g(9 + static_cast<uint64_t>(R()));
  Tensor x = randn({5000}, kFloat64, &g), flat = x.clone(), hier = x.clone();
  world()->all_reduce(flat, ReduceOp::Average);
  h->all_reduce(hier, ReduceOp::Average);
  EXPECT_LE(amax(abs(flat - hier)).item(), 1e-14);
  // Below min_bytes the flat all-reduce serves: nothing crosses the phases' groups.
  auto small = make_hierarchical_group(world(), {.ranks_per_node = 2});
  small->inter()->reset_traffic();
  Tensor t = ones({100});
  small->all_reduce(t);
  EXPECT_EQ(small->inter()->traffic().all_reduce.calls, 0);
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>()[0], static_cast<float>(N()));
}

TEST_F(Hierarchical, DataParallelOverNodesEqualsFlatDataParallel) {
  auto h = make_hierarchical_group(world(), {.ranks_per_node = 2, .min_bytes = 0});
  if (!h) GTEST_SKIP() << "needs 2 nodes of 2 ranks (mpiexec -n 4)";
  auto run = [&](ProcessGroupPtr group) {
    auto m = mlp(1);
    DistributedDataParallel ddp(m, group);
    optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int s = 0; s < 5; ++s) {
      Generator g(70 + static_cast<uint64_t>(s));
      Tensor x = randn({8 * N(), 6}, kFloat64, &g), y = randint(0, 3, {8 * N()}, kInt64, &g);
      opt.zero_grad();
      nn::cross_entropy(ddp(x.narrow(0, 8 * R(), 8)), y.narrow(0, 8 * R(), 8)).backward();
      opt.step();
    }
    return m->parameters();
  };
  h->inter()->reset_traffic();
  const auto flat = run(world()), hier = run(h);
  EXPECT_EQ(h->inter()->traffic().all_reduce.calls, 5);  // one bucket per step went across nodes
  for (size_t i = 0; i < flat.size(); ++i) EXPECT_LE(amax(abs(flat[i] - hier[i])).item(), 1e-12) << i;
}

class Autotune : public DistTest {};

TEST_F(Autotune, TheRuleTakesTheLeastMedianAndTheFirstOfEquals) {
  EXPECT_EQ(choose_bucket_cap({1, 4, 16}, {{3, 1, 2}, {5, 0.5, 0.6}, {1.5, 9, 1.6}}), 4);  // medians 2, 0.6, 1.6
  EXPECT_EQ(choose_bucket_cap({1, 4}, {{1, 2}, {2, 1}}), 1);                                // 1.5 each
  EXPECT_THROW(choose_bucket_cap({1, 4}, {{1}}), ValueError);
}

TEST_F(Autotune, EveryRankKeepsTheSameCapAndTrainsAsWithoutIt) {
  auto run = [&](bool autotune, std::string* report, double* cap, size_t* buckets) {
    auto m = mlp(1);
    DistributedDataParallel ddp(
        m, world(), {.autotune = autotune, .autotune_caps_mb = {0, 1000}, .autotune_steps = 2});
    optim::SGD opt(m->parameters(), {.lr = 0.1});
    for (int s = 0; s < 6; ++s) {
      Generator g(90 + static_cast<uint64_t>(s));
      Tensor x = randn({8 * N(), 6}, kFloat64, &g), y = randint(0, 3, {8 * N()}, kInt64, &g);
      opt.zero_grad();
      nn::cross_entropy(ddp(x.narrow(0, 8 * R(), 8)), y.narrow(0, 8 * R(), 8)).backward();
      opt.step();
      if (autotune && s == 2) {
        EXPECT_TRUE(ddp.autotune_report().empty()) << "chose after 3 of 4 steps";
      }
    }
    if (report) *report = ddp.autotune_report(), *cap = ddp.bucket_cap_mb(), *buckets = ddp.bucket_names().size();
    return m->parameters();
  };
  std::string report;
  double cap = -1;
  size_t buckets = 0;
  const auto tuned = run(true, &report, &cap, &buckets);
  const auto plain = run(false, nullptr, nullptr, nullptr);
  EXPECT_NE(report.find("bucket cap 0 MB: median"), std::string::npos) << report;
  EXPECT_NE(report.find("chosen: "), std::string::npos) << report;
  ASSERT_TRUE(cap == 0 || cap == 1000) << cap;
  EXPECT_EQ(buckets, cap == 0 ? 4u : 1u);  // one bucket per parameter, or one for all
  const auto caps = world()->all_gather(full({1}, cap, kFloat64, Device::cpu())).to_vector<double>();
  for (double c : caps) EXPECT_EQ(c, cap) << "the ranks chose differently";
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LE(amax(abs(plain[i] - tuned[i])).item(), 1e-12) << i;
  auto m = mlp(1);
  DistributedDataParallel ddp(m, world(), {.autotune = true});
  EXPECT_THROW(ddp.register_comm_hook(std::make_shared<TopKHook>()), ValueError);
}

class UnevenInputs : public DistTest {};

namespace {
/// Batches per rank: different on every rank, so that ranks finish at different steps.
int64_t batches_of(int rank) {
  static const int64_t counts[] = {5, 3, 2, 5};
  return N() == 1 ? 4 : counts[rank % 4];
}
std::pair<Tensor, Tensor> uneven_batch(int64_t step, int rank) {
  Generator g(1000 + 100 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(step));
  return {randn({4, 3}, kFloat64, &g), randn({4, 2}, kFloat64, &g)};
}
std::shared_ptr<nn::Linear> uneven_model() {
  manual_seed(21);
  auto m = std::make_shared<nn::Linear>(3, 2);
  m->to(kFloat64);
  return m;
}
/// PyTorch's definition, step by step on one process: at step t the ranks with more than t batches
/// contribute their gradients (each the sum over its `micro` batches micro t .. micro t + micro - 1),
/// divided by N (or by how many they are); SGD, rate 0.1, with momentum b = g, then
/// b = momentum * b + g (a finished rank does not step its optimizer, so its momentum is stale; the
/// final model comes from a rank that stepped every time). Returns the steps of the longest rank.
int64_t join_reference(nn::Module& ref, int64_t micro, bool initial, double momentum) {
  std::vector<Tensor> buf;
  int64_t longest = 0;
  for (int r = 0; r < N(); ++r) longest = std::max(longest, batches_of(r));
  for (int64_t t = 0; t < longest; ++t) {
    std::vector<Tensor> sum;
    int active = 0;
    for (int r = 0; r < N(); ++r) {
      if (t >= batches_of(r)) continue;
      ++active;
      ref.zero_grad();
      for (int64_t k = micro * t; k < micro * t + micro; ++k) {
        auto [x, y] = uneven_batch(k, r);
        nn::mse_loss(ref.forward(x), y).backward();
      }
      const auto ps = ref.parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        if (sum.size() <= i) sum.push_back(ps[i].grad().clone());
        else sum[i] = sum[i] + ps[i].grad();
      }
    }
    NoGradGuard no_grad;
    const auto ps = ref.parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor g = sum[i] * (1.0 / (initial ? N() : active));
      if (buf.size() <= i) buf.push_back(g);
      else buf[i] = buf[i] * momentum + g;
      Tensor(ps[i]).add_(momentum > 0 ? buf[i] : g, -0.1);
    }
  }
  return longest;
}
/// Every rank's parameters equal want (to 1e-12), and each other's bit for bit.
void expect_joined(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(amax(abs(got[i] - want[i])).item(), 1e-12) << i;
    Tensor all = world()->all_gather(got[i].to(Device::cpu()));
    for (int r = 1; r < N(); ++r) EXPECT_EQ(amax(abs(all.select(0, r) - all.select(0, 0))).item(), 0.0);
  }
}
}  // namespace

TEST_F(UnevenInputs, JoinGivesPyTorchsResultAndEveryRankEndsAlike) {
  for (auto [initial, momentum] : {std::pair{true, 0.0}, std::pair{false, 0.0}, std::pair{true, 0.9}}) {
    SCOPED_TRACE(initial ? "divide by the initial world size" : "divide by the ranks still training");
    SCOPED_TRACE(momentum);
    auto ref = uneven_model();
    const int64_t longest = join_reference(*ref, 1, initial, momentum);
    auto m = uneven_model();
    DistributedDataParallel ddp(m, world());
    optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = momentum});
    Join join(ddp, {.divide_by_initial_world_size = initial});
    for (int64_t t = 0; t < batches_of(R()); ++t) {
      auto [x, y] = uneven_batch(t, R());
      opt.zero_grad();
      nn::mse_loss(ddp(x), y).backward();
      opt.step();
    }
    join.finish();
    EXPECT_EQ(join.shadowed_steps(), longest - batches_of(R()));
    expect_joined(m->parameters(), ref->parameters());
  }
  auto m = uneven_model();
  DistributedDataParallel tuned(m, world(), {.autotune = true});
  EXPECT_THROW(Join(tuned, JoinOptions{}), ValueError);
}

TEST_F(UnevenInputs, JoinWithGradientAccumulationUnderNoSync) {
  // Each step accumulates two micro-batches, the first under NoSync (no communication), the second
  // synchronised. A finished rank shadows only the synchronised backward passes (Note [Join]), so
  // the definition is the one above with each rank's gradient the sum of its two micro-batches'.
  auto ref = uneven_model();
  const int64_t longest = join_reference(*ref, 2, true, 0.0);
  auto m = uneven_model();
  DistributedDataParallel ddp(m, world());
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  Join join(ddp);
  for (int64_t t = 0; t < batches_of(R()); ++t) {
    opt.zero_grad();
    {
      DistributedDataParallel::NoSync accumulate(ddp);
      auto [x, y] = uneven_batch(2 * t, R());
      nn::mse_loss(ddp(x), y).backward();
    }
    auto [x, y] = uneven_batch(2 * t + 1, R());
    nn::mse_loss(ddp(x), y).backward();
    opt.step();
  }
  join.finish();
  EXPECT_EQ(join.shadowed_steps(), longest - batches_of(R()));
  expect_joined(m->parameters(), ref->parameters());
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
