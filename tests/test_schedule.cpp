// Pipeline schedules: the bubble of GPipe and 1F1B against GPipe's closed form (K-1)/(M+K-1),
// 1F1B's bound on live activations, and the validator's errors for broken schedules.
#include <gtest/gtest.h>

#include "braid/distributed/schedule.h"
#include "braid/error.h"

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
