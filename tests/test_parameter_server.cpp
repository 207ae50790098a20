// Parameter-server training (braid/distributed/parameter_server.h), run plainly and under
// `mpiexec -n 2` and `-n 4` (1 server and 1 or 3 workers; 2 servers and 2 workers): placement by
// its rules; the synchronous mode bit for bit against synchronous data parallelism written out here
// (the workers' gradients added in worker order, averaged, one optimizer step) and against
// DistributedDataParallel itself with one and two workers; the staleness bound from every pull's
// clocks and versions with one worker delayed, also with 2 servers of variables too large to send
// eagerly; asynchronous training ending with every worker holding the servers' variables; dynamic
// batches: every batch computed once, staleness 0 bit for bit against data parallelism over the
// batch order, the bound in rounds from every pull; errors.
#include <thread>

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

class ParameterServers : public DistTest {};

std::shared_ptr<nn::Sequential> mlp(int64_t hidden = 8) {
  manual_seed(12);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(5, hidden)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(hidden, 3));
  m->to(kFloat64);
  return m;
}

std::pair<Tensor, Tensor> batch(int step, int64_t rows) {
  Generator g(500 + static_cast<uint64_t>(step));
  return {randn({rows, 5}, kFloat64, &g), randint(0, 3, {rows}, kInt64, &g)};
}

OptimizerFactory sgd() {
  return [](const std::vector<Tensor>& p) {
    return std::make_shared<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  };
}

/// Synchronous data parallelism written out: each batch's gradient, added in the order given, times
/// 1 / (batches), and one optimizer step.
void averaged_step(nn::Module& ref, optim::Optimizer& opt, const std::vector<std::pair<Tensor, Tensor>>& batches) {
  std::vector<Tensor> sum;
  const auto ps = ref.parameters();
  for (const auto& [x, y] : batches) {
    ref.zero_grad();
    nn::cross_entropy(ref.forward(x), y).backward();
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor g = ps[i].grad().reshape({ps[i].numel()}).clone();
      if (sum.size() <= i) sum.push_back(g);
      else sum[i] = sum[i] + g;
    }
  }
  for (size_t i = 0; i < ps.size(); ++i)
    Tensor(ps[i]).set_grad((sum[i] * (1.0 / static_cast<double>(batches.size()))).view(ps[i].shape()));
  opt.step();
}

constexpr int kToken = 7300;  // the workers' word to each other about the delayed one

/// Trains steps steps; worker w takes rows [4 w, 4 w + 4) of each step's batch. Returns the model.
std::shared_ptr<nn::Sequential> run(const ParameterServerOptions& o, int steps, std::vector<PullRecord>* pulls = nullptr,
                                    int delayed_worker = -1, int64_t hidden = 8) {
  auto m = mlp(hidden);
  ParameterServer ps(m, sgd(), world(), o);
  if (ps.is_server()) {
    ps.serve();
    return m;
  }
  const int w = ps.worker_index();
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, 4 * ps.workers());
    m->zero_grad();
    nn::cross_entropy(m->forward(x.narrow(0, 4 * w, 4)), y.narrow(0, 4 * w, 4)).backward();
    // The delayed worker pushes its first gradient only once every other worker has pushed s and
    // read back (they tell it): they then stand s steps ahead of it, and their next pull must wait
    // for it, so the bound is reached on every machine (an event, not a sleep).
    const bool bounded = delayed_worker >= 0 && o.staleness > 0;
    if (bounded && w == delayed_worker && s == 0) {
      for (int other = 0; other < ps.workers(); ++other) {
        Tensor token = zeros({1}, kFloat64, Device::cpu());
        if (other != w) world()->recv(token, o.servers + other, kToken);
      }
    }
    ps.push_pull();
    if (bounded && w != delayed_worker && s + 1 == o.staleness)
      world()->send(zeros({1}, kFloat64, Device::cpu()), o.servers + delayed_worker, kToken);
  }
  ps.finish();
  if (pulls) *pulls = ps.pulls();
  return m;
}

/// Every worker's parameters equal, and equal to the server that holds each (bitwise).
void expect_workers_hold_the_servers_variables(const nn::Module& m, const ParameterServerOptions& o,
                                              int64_t hidden = 8) {
  auto probe = mlp(hidden);
  ParameterServer layout(probe, sgd(), world(), o);  // the same placement, to know who holds what
  const auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor all = world()->all_gather(params[i].to(Device::cpu()));
    const int holder = layout.placement()[i];
    for (int r = o.servers; r < N(); ++r)
      EXPECT_EQ(amax(abs(all.select(0, r) - all.select(0, holder))).item(), 0.0) << "parameter " << i << " rank " << r;
  }
}

}  // namespace

TEST_F(ParameterServers, GreedyPlacementIsNeverWorseThanRoundRobin) {
  const std::vector<int64_t> skewed{100, 1, 1, 1, 1, 1, 1, 1, 90, 80};
  const auto rr = place_variables(skewed, 2, Placement::RoundRobin), greedy = place_variables(skewed, 2, Placement::Greedy);
  EXPECT_EQ(rr, (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(max_load(skewed, rr, 2), 193);      // 100 + 1 + 1 + 1 + 90
  EXPECT_EQ(max_load(skewed, greedy, 2), 170);  // 90 + 80 against 100 and the seven 1s
  EXPECT_EQ(greedy[0], 0);
  EXPECT_EQ(greedy[8], 1);
  EXPECT_EQ(greedy[9], 1);
  Generator g(3);
  for (int trial = 0; trial < 200; ++trial) {
    const auto v = randint(1, 1000, {17}, kInt64, &g).to(Device::cpu()).to_vector<int64_t>();
    for (int s : {2, 3, 5})
      EXPECT_LE(max_load(v, place_variables(v, s, Placement::Greedy), s),
                max_load(v, place_variables(v, s, Placement::RoundRobin), s));
  }
}

TEST_F(ParameterServers, SynchronousIsDataParallelBitForBit) {
  if (N() < 2) GTEST_SKIP() << "needs a server and a worker";
  for (int servers : {1, N() == 4 ? 2 : 1}) {
    SCOPED_TRACE(detail::cat(servers, " servers"));
    const ParameterServerOptions o{.servers = servers, .staleness = 0};
    const int W = N() - servers;
    auto m = run(o, 4);
    // Synchronous data parallelism on one process: each worker's gradient on its rows, added in
    // worker order, times 1 / W, and one SGD step.
    auto ref = mlp();
    optim::SGD opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int s = 0; s < 4; ++s) {
      auto [x, y] = batch(s, 4 * W);
      std::vector<std::pair<Tensor, Tensor>> rows;
      for (int w = 0; w < W; ++w) rows.emplace_back(x.narrow(0, 4 * w, 4), y.narrow(0, 4 * w, 4));
      averaged_step(*ref, opt, rows);
    }
    if (R() >= servers) {
      const auto got = m->parameters(), want = ref->parameters();
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(amax(abs(got[i] - want[i])).item(), 0.0) << i;
    }
    expect_workers_hold_the_servers_variables(*m, o);
  }
}

TEST_F(ParameterServers, SynchronousIsDistributedDataParallelBitForBit) {
  if (N() < 2) GTEST_SKIP() << "needs a server and a worker";
  // DistributedDataParallel itself over the workers (a split of the world) on the same shards: with
  // one or two workers its average is the PS's bit for bit whatever the order of its additions
  // (a + b = b + a, and halving is exact), so this needs no written-out reference.
  std::vector<int> layouts{N() - 1};
  if (N() >= 3) layouts.push_back(N() - 2);
  for (int servers : layouts) {
    const int W = N() - servers;
    SCOPED_TRACE(detail::cat(servers, " servers, ", W, " workers"));
    auto m = run({.servers = servers, .staleness = 0}, 4);
    auto workers = world()->split(R() >= servers ? 0 : -1, R());
    if (!workers) continue;
    auto ref = mlp();
    DistributedDataParallel ddp(ref, workers, {.deterministic = true});
    optim::SGD opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
    const int w = workers->rank();
    for (int s = 0; s < 4; ++s) {
      auto [x, y] = batch(s, 4 * W);
      ref->zero_grad();
      nn::cross_entropy(ref->forward(x.narrow(0, 4 * w, 4)), y.narrow(0, 4 * w, 4)).backward();
      opt.step();
    }
    const auto got = m->parameters(), want = ref->parameters();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(amax(abs(got[i] - want[i])).item(), 0.0) << i;
  }
}

TEST_F(ParameterServers, NoWorkerReadsVariablesMoreThanStalenessStepsOld) {
  if (N() < 3) GTEST_SKIP() << "needs two workers";
  // 1 server; and at 4 ranks 2 servers of variables too large to be sent eagerly (a hidden layer of
  // 4096: 160 KB and 128 KB), where an answer's send waits for the worker's receive.
  std::vector<std::pair<int, int64_t>> layouts{{1, 8}};
  if (N() == 4) layouts.emplace_back(2, 4096);
  for (const auto& [servers, hidden] : layouts) {
    for (int staleness : {1, 2}) {
      SCOPED_TRACE(detail::cat("staleness ", staleness, ", ", servers, " servers, hidden ", hidden));
      const ParameterServerOptions o{.servers = servers, .staleness = staleness};
      const int W = N() - servers;
      std::vector<PullRecord> pulls;
      auto m = run(o, 12, &pulls, /*delayed_worker=*/0, hidden);
      if (R() >= servers) {
        ASSERT_EQ(pulls.size(), 12u * static_cast<size_t>(servers));
        for (const PullRecord& p : pulls) {
          // SSP: a worker at clock c continues only once the slowest has pushed c - s steps, and the
          // variables it reads hold at least every worker's first c - s gradients (one version each).
          EXPECT_LE(p.clock - p.slowest, staleness) << "clock " << p.clock << " server " << p.server;
          EXPECT_GE(p.version, W * std::max<int64_t>(0, p.clock - staleness)) << "clock " << p.clock;
        }
        // And the bound is reached: before the delayed worker's first push, every other worker read
        // at clock s with the slowest at 0, s steps ahead; its next pull had to wait (the bound).
        if (R() != servers) {
          for (int k = 0; k < servers; ++k) {
            const PullRecord& p = pulls[static_cast<size_t>((staleness - 1) * servers + k)];
            EXPECT_EQ(p.clock, staleness);
            EXPECT_EQ(p.slowest, 0) << "server " << k;
          }
        }
      }
      expect_workers_hold_the_servers_variables(*m, o, hidden);
    }
  }
}

TEST_F(ParameterServers, AsynchronousTrainingEndsWithEveryWorkerHoldingTheServersVariables) {
  if (N() < 2) GTEST_SKIP() << "needs a server and a worker";
  const ParameterServerOptions o{.servers = N() == 4 ? 2 : 1, .placement = Placement::RoundRobin, .staleness = -1};
  auto m = run(o, 6);
  expect_workers_hold_the_servers_variables(*m, o);
}

/// Dynamic batches: trains the batches 0 .. T - 1 (batch b: batch(100 + b, 4)) as the servers hand
/// them out; returns the model and, through claimed, the batches this worker computed.
std::shared_ptr<nn::Sequential> run_claims(const ParameterServerOptions& o, std::vector<int64_t>* claimed,
                                           std::vector<PullRecord>* pulls = nullptr, int delayed_worker = -1) {
  auto m = mlp();
  ParameterServer ps(m, sgd(), world(), o);
  if (ps.is_server()) {
    ps.serve();
    return m;
  }
  // With a delayed worker and a bound, events make the lag (no sleep): the delayed worker claims
  // first (batch 0, round 0) and the others wait for its word; they then compute batches 1 .. K,
  // K = (s + 1) W - 1, the last of round s, which need no variables newer than version 0, and tell
  // it of each; only after all K does it push batch 0. So the batch K is computed exactly s rounds
  // behind, and every later claim of theirs waits for the delayed worker: the bound binds.
  const int W = ps.workers(), me = ps.worker_index();
  const bool hold = delayed_worker >= 0 && o.staleness > 0;
  const int64_t K = (o.staleness + 1) * W - 1;
  const int late = o.servers + delayed_worker;
  std::vector<Tensor> word(static_cast<size_t>(W));
  std::vector<WorkPtr> posted(static_cast<size_t>(W));
  auto listen = [&](int v) {
    word[static_cast<size_t>(v)] = zeros({1}, kInt64, Device::cpu());
    posted[static_cast<size_t>(v)] = world()->irecv(word[static_cast<size_t>(v)], o.servers + v, kToken);
  };
  auto say = [&](int64_t what, int to) { world()->send(full({1}, static_cast<double>(what), kInt64, Device::cpu()), to, kToken); };
  if (hold && me != delayed_worker) {
    Tensor go = zeros({1}, kInt64, Device::cpu());
    world()->recv(go, late, kToken);
  }
  int64_t b = ps.next_batch();
  if (hold && me == delayed_worker) {
    for (int v = 0; v < W; ++v)
      if (v != me) say(0, o.servers + v), listen(v);
    for (int64_t heard = 0; heard < K; std::this_thread::yield())
      for (int v = 0; v < W; ++v)
        if (v != me && posted[static_cast<size_t>(v)]->is_completed()) posted[static_cast<size_t>(v)]->wait(), ++heard, listen(v);
  }
  for (; b >= 0; b = ps.next_batch()) {
    claimed->push_back(b);
    auto [x, y] = batch(100 + static_cast<int>(b), 4);
    m->zero_grad();
    nn::cross_entropy(m->forward(x), y).backward();
    if (hold && me != delayed_worker && b <= K) say(b, late);
  }
  if (hold && me != delayed_worker) say(-1, late);  // the end of its words
  for (int v = 0; hold && me == delayed_worker && v < W; ++v)
    if (v != me) posted[static_cast<size_t>(v)]->wait();  // each one's -1: every batch <= K was heard
  ps.finish();
  if (pulls) *pulls = ps.pulls();
  return m;
}

/// Every batch 0 .. T - 1 was computed by exactly one worker.
void expect_every_batch_once(const std::vector<int64_t>& mine, int servers, int64_t T) {
  Tensor count = zeros({T}, kFloat64, Device::cpu());
  for (int64_t b : mine) count.narrow(0, b, 1).fill_(count.narrow(0, b, 1).item() + 1);
  world()->all_reduce(count);
  EXPECT_EQ(amax(abs(count - ones({T}, kFloat64, Device::cpu()))).item(), 0.0) << "servers " << servers;
}

TEST_F(ParameterServers, DynamicBatchesAtStalenessZeroAreDataParallelOverTheBatchOrderBitForBit) {
  if (N() < 2) GTEST_SKIP() << "needs a server and a worker";
  for (int servers : {1, N() == 4 ? 2 : 1}) {
    const int W = N() - servers;
    const int64_t T = 3 * W + 1;  // the last round has one batch
    SCOPED_TRACE(detail::cat(servers, " servers, ", W, " workers, ", T, " batches"));
    const ParameterServerOptions o{.servers = servers, .staleness = 0, .dynamic_batches = T};
    std::vector<int64_t> mine;
    std::vector<PullRecord> pulls;
    auto m = run_claims(o, &mine, &pulls);
    expect_every_batch_once(mine, servers, T);
    // Synchronous data parallelism over the batch order: step r averages batches r W .. r W + W - 1,
    // added in that order.
    auto ref = mlp();
    optim::SGD opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int64_t r = 0; r * W < T; ++r) {
      std::vector<std::pair<Tensor, Tensor>> round;
      for (int64_t b = r * W; b < std::min<int64_t>(T, r * W + W); ++b) round.push_back(batch(100 + static_cast<int>(b), 4));
      averaged_step(*ref, opt, round);
    }
    if (R() >= servers) {
      const auto got = m->parameters(), want = ref->parameters();
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(amax(abs(got[i] - want[i])).item(), 0.0) << i;
      // Every batch of round r was computed on the variables after round r - 1 exactly.
      for (const PullRecord& p : pulls) EXPECT_EQ(p.version, p.batch / W) << "batch " << p.batch << " server " << p.server;
    }
    expect_workers_hold_the_servers_variables(*m, o);
  }
}

TEST_F(ParameterServers, DynamicBatchesNeverComputeOnVariablesMoreThanStalenessRoundsOld) {
  if (N() < 3) GTEST_SKIP() << "needs two workers";
  for (int servers : {1, N() == 4 ? 2 : 1}) {
    for (int staleness : {1, 2, -1}) {
      const int W = N() - servers;
      const int64_t T = 8 * W + 1;
      SCOPED_TRACE(detail::cat("staleness ", staleness, ", ", servers, " servers, ", T, " batches"));
      const ParameterServerOptions o{.servers = servers, .staleness = staleness, .dynamic_batches = T};
      std::vector<int64_t> mine;
      std::vector<PullRecord> pulls;
      auto m = run_claims(o, &mine, &pulls, /*delayed_worker=*/0);
      expect_every_batch_once(mine, servers, T);
      if (R() >= servers) {
        ASSERT_EQ(pulls.size(), mine.size() * static_cast<size_t>(servers));
        for (size_t i = 0; i < pulls.size(); ++i) {
          const PullRecord& p = pulls[i];
          EXPECT_EQ(p.batch, mine[i / static_cast<size_t>(servers)]);
          EXPECT_EQ(p.clock, p.batch / W);
          if (staleness >= 0) {
            EXPECT_LE(p.clock - p.version, staleness) << "batch " << p.batch << " server " << p.server;
          }
        }
      }
      if (staleness > 0) {
        // The batch K = (s + 1) W - 1 was computed on version 0, s rounds behind (run_claims).
        double at_bound = 0;
        for (const PullRecord& p : pulls)
          if (p.batch == (staleness + 1) * W - 1) at_bound += p.clock - p.version == staleness ? 1 : 0;
        EXPECT_EQ(all_reduce(full({1}, at_bound, kFloat64, Device::cpu())).item(), servers);
      }
      expect_workers_hold_the_servers_variables(*m, o);
    }
  }
}

TEST_F(ParameterServers, BadOptionsAreRefusedNamingThem) {
  auto m = mlp();
  try {
    ParameterServer ps(m, sgd(), world(), {.servers = N()});
    ADD_FAILURE() << "no worker left, accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(N()) + " servers in a group of " + std::to_string(N()) +
                                         " ranks leave no worker"),
              std::string::npos)
        << e.what();
  }
  if (N() >= 2) {
    EXPECT_THROW(ParameterServer(m, sgd(), world(), {.servers = 1, .staleness = -2}), ValueError);
  }
  EXPECT_THROW(place_variables({1, 2}, 0, Placement::Greedy), ValueError);
  if (N() >= 2) {
    // The two ways of working are not mixed: next_batch() needs dynamic batches, push_pull() shards.
    ParameterServer shards(m, sgd(), world(), {.servers = 1});
    if (shards.is_server()) shards.serve();
    else {
      EXPECT_THROW(shards.next_batch(), ValueError);
      shards.finish();
    }
    auto m2 = mlp();
    ParameterServer claims(m2, sgd(), world(), {.servers = 1, .dynamic_batches = 1});
    if (claims.is_server()) claims.serve();
    else {
      EXPECT_THROW(claims.push_pull(), ValueError);
      while (claims.next_batch() >= 0) m2->zero_grad();
      claims.finish();
    }
  }
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
