// Pipeline schedules: the simulated bubble of GPipe and 1F1B against GPipe's closed form
// (K-1)/(M+K-1), of interleaved 1F1B against Megatron's (K-1)/(vM) and of ZB-H1 against the
// zero-bubble paper's (K-1)/(3M); each schedule's bound on live activations; the validator's errors
// for broken schedules; and the partitioner.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "braid/distributed/partition.h"
#include "braid/distributed/schedule.h"
#include "braid/error.h"
#include "braid/nn/nn.h"
#include "braid/ops.h"
#include "braid/random.h"

using namespace braid;
using namespace braid::distributed;
using K = PipeAction::Kind;

TEST(Schedule, GPipeAndOneFOneBBubbleMatchTheClosedForm) {
  for (int k : {1, 2, 4}) {
    for (int m : {1, 4, 8, 16}) {
      const double expect = static_cast<double>(k - 1) / (m + k - 1);
      for (double bc : {1.0, 2.0}) {
        const auto g = validate(gpipe_schedule(k, m), bc);
        const auto f = validate(one_f_one_b_schedule(k, m), bc);
        EXPECT_NEAR(g.bubble_fraction, expect, 1e-12) << "GPipe K=" << k << " M=" << m << " bc=" << bc;
        EXPECT_NEAR(f.bubble_fraction, expect, 1e-12) << "1F1B K=" << k << " M=" << m << " bc=" << bc;
        EXPECT_NEAR(g.makespan, (m + k - 1) * (1.0 + bc), 1e-12);
      }
    }
  }
}

TEST(Schedule, OneFOneBKeepsAtMostKMinusSActivations) {
  const int k = 4, m = 8;
  const auto g = validate(gpipe_schedule(k, m));
  const auto f = validate(one_f_one_b_schedule(k, m));
  for (int s = 0; s < k; ++s) {
    EXPECT_EQ(g.peak_live_activations[static_cast<size_t>(s)], m) << s;
    EXPECT_EQ(f.peak_live_activations[static_cast<size_t>(s)], std::min(k - s, m)) << s;
  }
}

TEST(Schedule, ValidatorNamesTheStagesOfADeadlock) {
  // Stage 0 waits for a gradient before it has sent the activation that would produce it.
  PipeSchedule p{"hand-made", 2, 1, {}};
  p.actions = {{{K::RecvGrad, 0}, {K::Forward, 0}, {K::SendActivation, 0}, {K::Backward, 0}, {K::Update, -1}},
               {{K::RecvActivation, 0}, {K::Forward, 0}, {K::Backward, 0}, {K::SendGrad, 0}, {K::Update, -1}}};
  try {
    validate(p);
    FAIL() << "expected a deadlock";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stage 0 waits forever at recv_grad 0 (action 0)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stage 1 waits forever at recv_act 0 (action 0)"), std::string::npos) << msg;
  }
}

TEST(Schedule, ValidatorRejectsBrokenStructure) {
  auto expect_error = [](PipeSchedule p, const std::string& part) {
    try {
      validate(p);
      ADD_FAILURE() << "expected an error containing '" << part << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  PipeSchedule missing_recv = gpipe_schedule(2, 2);
  auto& s1 = missing_recv.actions[1];
  s1.erase(std::find(s1.begin(), s1.end(), PipeAction{K::RecvActivation, 1}));
  expect_error(missing_recv, "stage 1: F1 (action 2) has no recv_act 1 before it");
  PipeSchedule twice = one_f_one_b_schedule(2, 2);
  twice.actions[0].insert(twice.actions[0].begin(), PipeAction{K::Forward, 0});
  expect_error(twice, "appears twice");
  PipeSchedule no_update = gpipe_schedule(2, 1);
  no_update.actions[1].pop_back();
  expect_error(no_update, "does not end with update");
  PipeSchedule backwards = gpipe_schedule(1, 1);
  std::swap(backwards.actions[0][0], backwards.actions[0][1]);
  expect_error(backwards, "comes before F0");
  EXPECT_THROW(gpipe_schedule(0, 4), ValueError);
}

// ---- interleaved 1F1B and ZB-H1 ----

namespace {

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << part << "'";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

size_t index_of(const std::vector<PipeAction>& a, PipeAction x) {
  return static_cast<size_t>(std::find(a.begin(), a.end(), x) - a.begin());
}

}  // namespace

TEST(Schedule, InterleavedBubbleIsMegatronsClosedForm) {
  // A chunk's forward costs 1/v and its backward 2/v, so a rank's work is 1F1B's 3M; Megatron's
  // bubble (K-1)(f+b)/v gives the makespan 3M + 3(K-1)/v. Costs are powers of two, so the
  // simulation is exact and its ratios are the doubles nearest the closed forms (Note [Exact bubble]).
  for (int k : {2, 4}) {
    for (int v : {2, 4}) {
      for (int m = k; m <= 4 * k; m += k) {
        const auto r = validate(interleaved_schedule(k, m, v));
        const auto base = validate(one_f_one_b_schedule(k, m));
        EXPECT_EQ(r.makespan, 3.0 * m + 3.0 * (k - 1) / v) << "K=" << k << " v=" << v << " M=" << m;
        EXPECT_EQ(r.bubble_over_ideal, static_cast<double>(k - 1) / (v * m)) << "K=" << k << " M=" << m;
        EXPECT_EQ(r.bubble_fraction, static_cast<double>(k - 1) / (v * m + k - 1)) << "K=" << k << " M=" << m;
        EXPECT_EQ(base.bubble_over_ideal, static_cast<double>(k - 1) / m);  // v times larger
      }
    }
  }
}

TEST(Schedule, InterleavedKeepsMegatronsWarmUpPlusOneActivations) {
  // Rank s holds its 2(K-s-1) + (v-1)K warm-up forwards and the first steady forward, each a
  // chunk's (1/v of a stage's) activation; with M = K, rank 0's warm-up would exceed vM.
  for (int k : {2, 4}) {
    for (int m : {k, 2 * k, 4 * k}) {
      const int v = 2;
      const auto r = validate(interleaved_schedule(k, m, v));
      for (int s = 0; s < k; ++s) {
        const int bound = std::min(v * m, 2 * (k - s - 1) + (v - 1) * k + 1);
        EXPECT_EQ(r.peak_live_activations[static_cast<size_t>(s)], bound) << "K=" << k << " M=" << m << " s=" << s;
        EXPECT_EQ(r.peak_awaiting_input_grad[static_cast<size_t>(s)], bound);
      }
    }
  }
}

TEST(Schedule, InterleavedWrapsFromTheLastRankToTheFirst) {
  const auto p = interleaved_schedule(2, 2, 2);
  ASSERT_EQ(p.chunks, 2);
  // Virtual stage 1 (rank 1, chunk 0) feeds virtual stage 2 (rank 0, chunk 1), whose gradient returns.
  const auto& r0 = p.actions[0];
  const auto& r1 = p.actions[1];
  EXPECT_LT(index_of(r1, {K::SendActivation, 0, 0}), r1.size());
  EXPECT_LT(index_of(r0, {K::RecvActivation, 0, 1}), index_of(r0, {K::Forward, 0, 1}));
  EXPECT_LT(index_of(r0, {K::SendGrad, 0, 1}), r0.size());
  EXPECT_LT(index_of(r1, {K::RecvGrad, 0, 0}), index_of(r1, {K::Backward, 0, 0}));
  EXPECT_EQ(index_of(r0, {K::RecvActivation, 0, 0}), r0.size());  // virtual stage 0 receives nothing
  EXPECT_EQ(index_of(r1, {K::SendActivation, 0, 1}), r1.size());  // virtual stage 3 is the last
  EXPECT_EQ(PipeAction({K::RecvActivation, 3, 1}).str(), "recv_act 3 chunk 1");
}

TEST(Schedule, ZeroBubbleH1BubbleIsAThirdOfOneFOneBs) {
  // F = B = W = 1: every stage idles K - 1 units, 1F1B's stages 3(K - 1).
  for (int k : {2, 4}) {
    for (int m = k; m <= 4 * k; ++m) {
      const auto r = validate(zb_h1_schedule(k, m), StepCosts{});
      const auto base = validate(one_f_one_b_schedule(k, m), StepCosts{});
      EXPECT_EQ(r.makespan, 3.0 * m + k - 1) << "K=" << k << " M=" << m;
      EXPECT_EQ(r.bubble_over_ideal, (k - 1) / (3.0 * m)) << "K=" << k << " M=" << m;
      EXPECT_EQ(r.bubble_fraction, (k - 1) / (3.0 * m + k - 1)) << "K=" << k << " M=" << m;
      EXPECT_EQ(base.bubble_over_ideal, 3.0 * (k - 1) / (3.0 * m));
    }
  }
}

TEST(Schedule, ZeroBubbleH1KeepsOneFOneBsActivationMemory) {
  // Until their input gradient, stage s holds K - s activations, as in 1F1B; counted until W,
  // every stage holds K, 1F1B's peak (its stage 0).
  for (int k : {2, 4}) {
    for (int m : {k, 2 * k, 4 * k}) {
      const auto z = validate(zb_h1_schedule(k, m));
      const auto f = validate(one_f_one_b_schedule(k, m));
      for (int s = 0; s < k; ++s) {
        const size_t su = static_cast<size_t>(s);
        EXPECT_EQ(z.peak_awaiting_input_grad[su], k - s) << "K=" << k << " M=" << m << " s=" << s;
        EXPECT_EQ(f.peak_awaiting_input_grad[su], k - s);
        EXPECT_EQ(f.peak_live_activations[su], k - s);
        EXPECT_EQ(z.peak_live_activations[su], k) << "K=" << k << " M=" << m << " s=" << s;
      }
      EXPECT_EQ(*std::max_element(z.peak_live_activations.begin(), z.peak_live_activations.end()),
                *std::max_element(f.peak_live_activations.begin(), f.peak_live_activations.end()));
    }
  }
}

TEST(Schedule, ValidatorNamesStageAndActionOfBrokenInterleavedSchedules) {
  // The wrap-around receive (rank 0's chunk 1 from rank 1's chunk 0) is missing.
  PipeSchedule no_wrap = interleaved_schedule(2, 2, 2);
  auto& r0 = no_wrap.actions[0];
  r0.erase(r0.begin() + static_cast<long>(index_of(r0, {K::RecvActivation, 1, 1})));
  const size_t f = index_of(r0, {K::Forward, 1, 1});
  expect_error([&] { validate(no_wrap); },
               "stage 0: F1 chunk 1 (action " + std::to_string(f) + ") has no recv_act 1 chunk 1 before it");
  // Rank 0 waits for the wrap-around activation before running the chunk that produces it.
  PipeSchedule early = interleaved_schedule(2, 2, 2);
  auto& e0 = early.actions[0];
  e0.erase(e0.begin() + static_cast<long>(index_of(e0, {K::RecvActivation, 0, 1})));
  e0.insert(e0.begin(), PipeAction{K::RecvActivation, 0, 1});
  expect_error([&] { validate(early); },
               "stage 0 waits forever at recv_act 0 chunk 1 (action 0); "
               "stage 1 waits forever at recv_act 0 chunk 0 (action 0)");
  PipeSchedule bad_chunk = interleaved_schedule(2, 2, 2);
  bad_chunk.actions[1][0].chunk = 2;
  expect_error([&] { validate(bad_chunk); }, "stage 1: recv_act 0 chunk 2 (action 0) names chunk 2 of 2");
  PipeSchedule beyond_last = interleaved_schedule(2, 2, 2);
  auto& b1 = beyond_last.actions[1];
  b1.insert(b1.begin() + static_cast<long>(index_of(b1, {K::Forward, 0, 1})) + 1, PipeAction{K::SendActivation, 0, 1});
  expect_error([&] { validate(beyond_last); }, "send_act 0 chunk 1 (action ");
  expect_error([&] { validate(beyond_last); }, "it is the model's last virtual stage");
  expect_error([] { interleaved_schedule(4, 6, 2); }, "micro_batches (6) must be a multiple of stages (4)");
  expect_error([] { interleaved_schedule(2, 4, 1); }, "chunks (model chunks per stage) must be at least 2");
}

TEST(Schedule, ValidatorNamesStageAndActionOfBrokenZeroBubbleSchedules) {
  PipeSchedule w_first = zb_h1_schedule(2, 2);
  auto& a = w_first.actions[1];
  std::swap(a[index_of(a, {K::BackwardInput, 0})], a[index_of(a, {K::BackwardWeight, 0})]);
  expect_error([&] { validate(w_first); },
               "stage 1: W0 (action " + std::to_string(index_of(a, {K::BackwardWeight, 0})) + ") comes before BI0");
  PipeSchedule no_w = zb_h1_schedule(2, 2);
  auto& b = no_w.actions[0];
  const size_t bi = index_of(b, {K::BackwardInput, 1});
  b.erase(b.begin() + static_cast<long>(index_of(b, {K::BackwardWeight, 1})));
  expect_error([&] { validate(no_w); }, "stage 0: BI1 (action " + std::to_string(bi) + ") is never followed by W1");
  PipeSchedule late_grad = zb_h1_schedule(2, 2);
  auto& c = late_grad.actions[1];
  const size_t send = index_of(c, {K::SendGrad, 0}), input = index_of(c, {K::BackwardInput, 0});
  std::swap(c[send], c[input]);
  expect_error([&] { validate(late_grad); },
               "stage 1: BI0 (action " + std::to_string(send) + ") has no send_grad 0 after it");
  PipeSchedule both = zb_h1_schedule(2, 2);
  both.actions[0].insert(both.actions[0].end() - 1, PipeAction{K::Backward, 0});
  expect_error([&] { validate(both); }, "runs the whole backward, and the split one too");
  expect_error([] { zb_h1_schedule(4, 3); }, "micro_batches (3) must be at least stages (4)");
  expect_error([] { validate(zb_h1_schedule(2, 2), StepCosts{.backward_weight = 0}); }, "backward_weight 0");
}

TEST(Schedule, MakeScheduleByName) {
  EXPECT_EQ(make_schedule("gpipe", 2, 4).actions, gpipe_schedule(2, 4).actions);
  EXPECT_EQ(make_schedule("1f1b", 2, 4).actions, one_f_one_b_schedule(2, 4).actions);
  EXPECT_EQ(make_schedule("interleaved", 2, 4, 3).actions, interleaved_schedule(2, 4, 3).actions);
  EXPECT_EQ(make_schedule("zb-h1", 2, 4).actions, zb_h1_schedule(2, 4).actions);
  expect_error([] { make_schedule("pipedream", 2, 4); },
               "unknown schedule 'pipedream'; known: gpipe, 1f1b, interleaved, zb-h1");
}

// ---- partitioning ----

namespace {

std::vector<LayerProfile> synthetic_layers(uint64_t seed, int n) {
  Generator g(seed);
  const auto f = rand({n}, kFloat64, &g, 0.5, 3.0).to_vector<double>();
  const auto b = rand({n}, kFloat64, &g, 1.0, 6.0).to_vector<double>();
  const auto a = rand({n}, kFloat64, &g, 1e3, 1e6).to_vector<double>();
  const auto p = rand({n}, kFloat64, &g, 0, 1e6).to_vector<double>();
  std::vector<LayerProfile> layers;
  for (int i = 0; i < n; ++i)
    layers.push_back({"layer" + std::to_string(i), f[static_cast<size_t>(i)] * 1e-3, b[static_cast<size_t>(i)] * 1e-3,
                      static_cast<int64_t>(a[static_cast<size_t>(i)]), static_cast<int64_t>(p[static_cast<size_t>(i)])});
  return layers;
}

/// The slowest stage of every way to cut n layers into k non-empty stages, by enumeration: an
/// independent check of the dynamic program, with the cost of Note [Partition cost model].
double brute_force(const std::vector<LayerProfile>& l, int k, double bandwidth) {
  const int n = static_cast<int>(l.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> cuts;
  std::function<void(int, int)> rec = [&](int start, int left) {
    if (left == 1) {
      std::vector<int> firsts{0};
      firsts.insert(firsts.end(), cuts.begin(), cuts.end());
      double worst = 0;
      for (size_t s = 0; s < firsts.size(); ++s) {
        const int i = firsts[s], j = s + 1 < firsts.size() ? firsts[s + 1] : n;
        double c = 0;
        for (int x = i; x < j; ++x) c += l[static_cast<size_t>(x)].forward_seconds + l[static_cast<size_t>(x)].backward_seconds;
        if (j < n) c += 2.0 * static_cast<double>(l[static_cast<size_t>(j - 1)].output_bytes) / bandwidth;
        worst = std::max(worst, c);
      }
      best = std::min(best, worst);
      return;
    }
    for (int c = start + 1; c <= n - left + 1; ++c) {
      cuts.push_back(c);
      rec(c, left - 1);
      cuts.pop_back();
    }
  };
  rec(0, k);
  return best;
}

}  // namespace

TEST(Partition, DynamicProgramFindsTheBestPlanOfEveryEnumeration) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const auto layers = synthetic_layers(seed, 9);
    for (int k = 1; k <= 4; ++k) {
      PartitionOptions o;
      o.bandwidth = 1e9;
      const PartitionPlan plan = partition(layers, k, o);
      ASSERT_EQ(plan.first_layer.size(), static_cast<size_t>(k));
      EXPECT_NEAR(plan.bottleneck_seconds, brute_force(layers, k, 1e9), 1e-15) << "seed " << seed << " K " << k;
      EXPECT_NEAR(*std::max_element(plan.stage_seconds.begin(), plan.stage_seconds.end()), plan.bottleneck_seconds, 1e-15);
    }
  }
}

TEST(Partition, MemoryLimitAndManualCuts) {
  // Four equal layers of 1 MB of parameters (4 MB with gradients and optimizer states) and no
  // activations: 2 stages under a 8 MB limit must take two layers each.
  std::vector<LayerProfile> layers(4, LayerProfile{"x", 1e-3, 2e-3, 0, 1000000});
  layers[0].forward_seconds = 10e-3;  // unlimited, the slow first layer would stand alone
  PartitionOptions free;
  EXPECT_EQ(partition(layers, 2, free).first_layer, (std::vector<int>{0, 1}));
  PartitionOptions limited;
  limited.memory_limit = 8000000;
  const PartitionPlan p = partition(layers, 2, limited);
  EXPECT_EQ(p.first_layer, (std::vector<int>{0, 2}));
  EXPECT_EQ(p.stage_bytes, (std::vector<int64_t>{8000000, 8000000}));
  limited.memory_limit = 3000000;
  try {
    partition(layers, 2, limited);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("largest single layer needs 4000000 bytes"), std::string::npos) << e.what();
  }
  PartitionOptions manual;
  manual.cuts = {3};
  const PartitionPlan m = partition(layers, 2, manual);
  EXPECT_EQ(m.first_layer, (std::vector<int>{0, 3}));
  EXPECT_NE(m.str(layers).find("stage 1: layers 3-3"), std::string::npos) << m.str(layers);
  manual.cuts = {0};
  EXPECT_THROW(partition(layers, 2, manual), ValueError);
}

TEST(Partition, ProfileMeasuresEveryLayer) {
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(6, 16)).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(16, 3));
  const auto prof = profile_layers(model, zeros({4, 6}), 3);
  ASSERT_EQ(prof.size(), 3u);
  EXPECT_EQ(prof[0].output_bytes, 4 * 16 * 4);
  EXPECT_EQ(prof[0].parameter_bytes, (6 * 16 + 16) * 4);
  EXPECT_EQ(prof[1].parameter_bytes, 0);
  EXPECT_EQ(prof[2].output_bytes, 4 * 3 * 4);
  for (const auto& p : prof) {
    EXPECT_GT(p.forward_seconds, 0.0) << p.name;
    EXPECT_GT(p.backward_seconds, 0.0) << p.name;
  }
  for (const Tensor& w : model.parameters()) EXPECT_FALSE(w.grad().defined());
}
