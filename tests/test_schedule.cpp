// Pipeline schedules: the bubble of GPipe and 1F1B against GPipe's closed form (K-1)/(M+K-1),
// 1F1B's bound on live activations, and the validator's errors for broken schedules.
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
