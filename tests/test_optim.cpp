// Optimizer, clipping and schedule tests. Parameters after 10 steps on a fixed linear-regression
// problem, clipped gradient norms and learning-rate sequences are compared with PyTorch's
// (tests/data/optim_reference.txt and optim_schedule_reference.txt, from make_optim_reference.py);
// clipping is also checked against closed forms, and state dicts by resuming bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "reference_file.h"
#include "test_paths.h"

namespace braid {
namespace {

using optim::ParamGroup;
using testing::RefCase;

const std::vector<RefCase>& optim_cases() {
  static const std::vector<RefCase> cases =
      testing::load_reference(std::string(braid::test::data_dir()) + "/optim_reference.txt");
  return cases;
}

const std::vector<RefCase>& schedule_cases() {
  static const std::vector<RefCase> cases =
      testing::load_reference(std::string(braid::test::data_dir()) + "/optim_schedule_reference.txt");
  return cases;
}

const RefCase& find_case(const std::vector<RefCase>& cases, const std::string& name) {
  for (const RefCase& c : cases)
    if (c.name == name) return c;
  throw std::runtime_error("no reference case " + name);
}

/// The options of a case whose keys start with prefix ("opt.", "group0."), prefix removed.
std::map<std::string, double> options_with_prefix(const RefCase& c, const std::string& prefix) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : c.params)
    if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = std::strtod(v.at(0).c_str(), nullptr);
  return out;
}

/// Builds an optimizer through its typed options struct from PyTorch-named defaults.
std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& kind, const std::map<std::string, double>& o,
                                                 std::vector<ParamGroup> groups) {
  auto get = [&](const char* k, double fallback) { return o.count(k) ? o.at(k) : fallback; };
  if (kind == "sgd") {
    optim::SGDOptions s;
    s.lr = get("lr", s.lr);
    s.momentum = get("momentum", 0);
    s.dampening = get("dampening", 0);
    s.weight_decay = get("weight_decay", 0);
    s.nesterov = get("nesterov", 0) != 0;
    s.maximize = get("maximize", 0) != 0;
    return std::make_unique<optim::SGD>(std::move(groups), s);
  }
  if (kind == "adam" || kind == "adamw") {
    optim::AdamOptions a;
    optim::AdamWOptions w;
    a.lr = w.lr = get("lr", a.lr);
    a.betas = w.betas = {get("beta1", a.betas.first), get("beta2", a.betas.second)};
    a.eps = w.eps = get("eps", a.eps);
    a.weight_decay = get("weight_decay", a.weight_decay);
    w.weight_decay = get("weight_decay", w.weight_decay);
    a.amsgrad = w.amsgrad = get("amsgrad", 0) != 0;
    a.maximize = w.maximize = get("maximize", 0) != 0;
    if (kind == "adam") return std::make_unique<optim::Adam>(std::move(groups), a);
    return std::make_unique<optim::AdamW>(std::move(groups), w);
  }
  if (kind == "rmsprop") {
    optim::RMSpropOptions r;
    r.lr = get("lr", r.lr);
    r.alpha = get("alpha", r.alpha);
    r.eps = get("eps", r.eps);
    r.weight_decay = get("weight_decay", r.weight_decay);
    r.momentum = get("momentum", r.momentum);
    r.centered = get("centered", 0) != 0;
    r.maximize = get("maximize", 0) != 0;
    return std::make_unique<optim::RMSprop>(std::move(groups), r);
  }
  if (kind == "adagrad") {
    optim::AdagradOptions a;
    a.lr = get("lr", a.lr);
    a.lr_decay = get("lr_decay", a.lr_decay);
    a.weight_decay = get("weight_decay", a.weight_decay);
    a.initial_accumulator_value = get("initial_accumulator_value", a.initial_accumulator_value);
    a.eps = get("eps", a.eps);
    a.maximize = get("maximize", 0) != 0;
    return std::make_unique<optim::Adagrad>(std::move(groups), a);
  }
  throw std::runtime_error("unknown optimizer " + kind);
}

// ---- the fixed problem: pred = X @ W.T + b, loss = mse(pred, Y) ----

struct Problem {
  Tensor W, b, unused, X, Y;

  explicit Problem(DType dt) {
    const RefCase p = find_case(optim_cases(), "problem");  // a copy: GCC 13 warns of a dangling reference otherwise
    W = p.tensor("W").to(dt).set_requires_grad(true);
    b = p.tensor("b").to(dt).set_requires_grad(true);
    unused = p.tensor("unused").to(dt).set_requires_grad(true);
    X = p.tensor("X").to(dt);
    Y = p.tensor("Y").to(dt);
  }
  void backward() const { nn::mse_loss(matmul(X, W.mT()) + b, Y).backward(); }
  /// One group {W, b, unused}, or two, {W, unused} and {b}, with the case's per-group options.
  std::vector<ParamGroup> groups(const RefCase& c) const {
    if (options_with_prefix(c, "group0.").empty() && options_with_prefix(c, "group1.").empty())
      return {{{W, b, unused}, {}}};
    return {{{W, unused}, options_with_prefix(c, "group0.")}, {{b}, options_with_prefix(c, "group1.")}};
  }
};

DType case_dtype(const RefCase& c) { return c.str("dtype") == "float32" ? kFloat32 : kFloat64; }
// The tolerances the issue sets: 1e-5 in float32, 1e-10 in float64 (absolute and relative).
double case_tol(const RefCase& c) { return c.str("dtype") == "float32" ? 1e-5 : 1e-10; }

void expect_params_match(const RefCase& c, const Problem& pr) {
  const double tol = case_tol(c);
  std::string where;
  EXPECT_LE(testing::tolerance_ratio(pr.W, c.ref("W"), tol, tol, &where), 1.0) << "W " << where;
  EXPECT_LE(testing::tolerance_ratio(pr.b, c.ref("b"), tol, tol, &where), 1.0) << "b " << where;
  // A parameter that never had a gradient is neither moved nor given state.
  Problem fresh(case_dtype(c));
  EXPECT_TRUE(equal(pr.unused, fresh.unused));
}

class OptimizerReference : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerReference, TenStepsMatchPyTorch) {
  const RefCase& c = find_case(optim_cases(), GetParam());
  Problem pr(case_dtype(c));
  auto opt = make_optimizer(c.str("optimizer"), options_with_prefix(c, "opt."), pr.groups(c));
  for (int i = 0; i < 10; ++i) {
    opt->zero_grad();
    pr.backward();
    opt->step();
  }
  expect_params_match(c, pr);
  if (c.str("optimizer") == "adagrad") {  // Adagrad creates its state up front, as PyTorch's does
    ASSERT_NE(opt->state(pr.unused), nullptr);
    EXPECT_EQ(opt->state(pr.unused)->scalars.at("step"), 0);
  } else {
    EXPECT_EQ(opt->state(pr.unused), nullptr) << "a parameter without gradient got optimizer state";
  }
  EXPECT_NE(opt->state(pr.W), nullptr);
}

INSTANTIATE_TEST_SUITE_P(PyTorch, OptimizerReference,
                         ::testing::ValuesIn(testing::reference_names(optim_cases(), "optim/")),
                         [](const auto& info) { return testing::gtest_name(info.param); });

class ClipReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ClipReference, ClippedTrainingMatchesPyTorch) {
  const RefCase& c = find_case(optim_cases(), GetParam());
  Problem pr(case_dtype(c));
  auto opt = make_optimizer(c.str("optimizer"), options_with_prefix(c, "opt."), pr.groups(c));
  std::vector<double> norms;
  for (int i = 0; i < 10; ++i) {
    opt->zero_grad();
    pr.backward();
    norms.push_back(optim::clip_grad_norm_({pr.W, pr.b, pr.unused}, c.num("max_norm"), c.num("norm_type")));
    opt->step();
  }
  expect_params_match(c, pr);
  std::string where;
  const double tol = case_tol(c);
  EXPECT_LE(testing::tolerance_ratio(tensor(norms, {10}), c.ref("norms"), tol, tol, &where), 1.0) << "norms " << where;
}

INSTANTIATE_TEST_SUITE_P(PyTorch, ClipReference, ::testing::ValuesIn(testing::reference_names(optim_cases(), "clip/")),
                         [](const auto& info) { return testing::gtest_name(info.param); });

class OneCycleTrainingReference : public ::testing::TestWithParam<std::string> {};

TEST_P(OneCycleTrainingReference, ScheduledTrainingMatchesPyTorch) {
  const RefCase& c = find_case(optim_cases(), GetParam());
  Problem pr(case_dtype(c));
  auto opt = make_optimizer(c.str("optimizer"), options_with_prefix(c, "opt."), pr.groups(c));
  optim::OneCycleOptions o;
  o.total_steps = 10;
  optim::OneCycleLR sched(*opt, c.num("max_lr"), o);
  for (int i = 0; i < 10; ++i) {
    opt->zero_grad();
    pr.backward();
    opt->step();
    sched.step();
  }
  expect_params_match(c, pr);
}

INSTANTIATE_TEST_SUITE_P(PyTorch, OneCycleTrainingReference,
                         ::testing::ValuesIn(testing::reference_names(optim_cases(), "onecycle_training/")),
                         [](const auto& info) { return testing::gtest_name(info.param); });

TEST(OptimizerReferenceFile, CoversEveryOptimizerInBothDtypes) {
  std::set<std::string> seen;
  for (const RefCase& c : optim_cases())
    if (c.name.rfind("optim/", 0) == 0) seen.insert(c.str("optimizer") + "/" + c.str("dtype"));
  for (const char* kind : {"sgd", "adam", "adamw", "rmsprop", "adagrad"})
    for (const char* dt : {"float32", "float64"}) EXPECT_TRUE(seen.count(std::string(kind) + "/" + dt)) << kind << " " << dt;
}

// ---- schedules ----

std::unique_ptr<optim::LRScheduler> make_scheduler(const RefCase& c, optim::Optimizer& opt) {
  const std::string kind = c.name.substr(9, c.name.find('/', 9) - 9);  // after "schedule/"
  if (kind == "step") return std::make_unique<optim::StepLR>(opt, static_cast<int64_t>(c.num("step_size")), c.num("gamma"));
  if (kind == "multistep") {
    std::vector<int64_t> m;
    for (const std::string& w : c.words("milestones")) m.push_back(std::stoll(w));
    return std::make_unique<optim::MultiStepLR>(opt, m, c.num("gamma"));
  }
  if (kind == "exponential") return std::make_unique<optim::ExponentialLR>(opt, c.num("gamma"));
  if (kind == "cosine_warmup")
    return std::make_unique<optim::CosineWithWarmup>(opt, static_cast<int64_t>(c.num("warmup_steps")),
                                                     static_cast<int64_t>(c.num("total_steps")), c.num("min_lr"));
  if (kind.rfind("onecycle", 0) == 0) {
    optim::OneCycleOptions o;
    o.total_steps = static_cast<int64_t>(c.num("total_steps"));
    o.pct_start = c.num("pct_start", o.pct_start);
    o.anneal_strategy = c.has("anneal_strategy") ? c.str("anneal_strategy") : o.anneal_strategy;
    o.three_phase = c.num("three_phase", 0) != 0;
    o.cycle_momentum = c.num("cycle_momentum", 1) != 0;
    o.div_factor = c.num("div_factor", o.div_factor);
    o.final_div_factor = c.num("final_div_factor", o.final_div_factor);
    o.base_momentum = c.num("base_momentum", o.base_momentum);
    o.max_momentum = c.num("max_momentum", o.max_momentum);
    std::vector<double> max_lrs;
    for (const std::string& w : c.words("max_lr")) max_lrs.push_back(std::stod(w));
    return std::make_unique<optim::OneCycleLR>(opt, max_lrs, o);
  }
  throw std::runtime_error("unknown schedule " + kind);
}

/// The reference script's optimizer: two groups with lr 0.1 and 0.02 (SGD with momentum 0.9).
std::unique_ptr<optim::Optimizer> schedule_optimizer(const std::string& kind, std::vector<Tensor>& keep) {
  keep = {zeros({2}).set_requires_grad(true), zeros({2}).set_requires_grad(true)};
  std::vector<ParamGroup> groups = {{{keep[0]}, {{"lr", 0.1}}}, {{keep[1]}, {{"lr", 0.02}}}};
  if (kind == "sgd") return std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  return std::make_unique<optim::Adam>(groups, optim::AdamOptions{.lr = 0.1});
}

class ScheduleReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ScheduleReference, SequenceMatchesPyTorch) {
  const RefCase& c = find_case(schedule_cases(), GetParam());
  const std::string kind = c.str("optimizer");
  std::vector<Tensor> keep;
  auto opt = schedule_optimizer(kind, keep);
  auto sched = make_scheduler(c, *opt);
  const std::string momentum_key = kind == "sgd" ? "momentum" : "beta1";
  std::vector<double> lrs, moms;
  auto record = [&] {
    for (size_t g = 0; g < 2; ++g) {
      lrs.push_back(sched->get_last_lr().at(g));
      EXPECT_EQ(opt->param_groups()[g].lr(), sched->get_last_lr()[g]);
      moms.push_back(opt->param_groups()[g].get(momentum_key));
    }
  };
  record();
  for (int i = 0; i < 30; ++i) {
    opt->step();
    sched->step();
    record();
  }
  EXPECT_EQ(sched->last_epoch(), 30);
  std::string where;
  EXPECT_LE(testing::tolerance_ratio(tensor(lrs, {31, 2}), c.ref("lr"), 1e-13, 1e-16, &where), 1.0) << "lr " << where;
  if (c.has_tensor("momentum")) {
    EXPECT_LE(testing::tolerance_ratio(tensor(moms, {31, 2}), c.ref("momentum"), 1e-13, 1e-16, &where), 1.0)
        << "momentum " << where;
  }
}

INSTANTIATE_TEST_SUITE_P(PyTorch, ScheduleReference, ::testing::ValuesIn(testing::reference_names(schedule_cases(), "")),
                         [](const auto& info) { return testing::gtest_name(info.param); });

TEST(Schedules, CosineWithWarmupClosedForm) {
  std::vector<Tensor> keep;
  auto opt = schedule_optimizer("sgd", keep);
  optim::CosineWithWarmup sched(*opt, 4, 12, 0.01);
  // Warmup 0.1 * (s + 1) / 4, then 0.01 + 0.09 * (1 + cos(pi (s - 4) / 8)) / 2, then 0.01.
  std::vector<double> want = {0.025, 0.05, 0.075, 0.1, 0.1};
  for (int s = 5; s <= 12; ++s) want.push_back(0.01 + 0.09 * (1 + std::cos(std::numbers::pi * (s - 4) / 8.0)) / 2);
  want.push_back(0.01);
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_NEAR(sched.get_last_lr()[0], want[s], 1e-15) << "step " << s;
    sched.step();
  }
}

TEST(Schedules, OneCycleStepsPastTotalThrow) {
  std::vector<Tensor> keep;
  auto opt = schedule_optimizer("sgd", keep);
  optim::OneCycleLR sched(*opt, 0.1, {.total_steps = 3});
  for (int i = 0; i < 3; ++i) sched.step();
  EXPECT_THROW(sched.step(), ValueError);
}

TEST(Schedules, OneCycleMomentumNeedsAMomentumOption) {
  Tensor p = zeros({2}).set_requires_grad(true);
  optim::Adagrad opt({p});
  EXPECT_THROW(optim::OneCycleLR(opt, 0.1, {.total_steps = 10}), ValueError);
  optim::OneCycleLR ok(opt, 0.1, {.total_steps = 10, .cycle_momentum = false});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr(), 0.1 / 25);
}

// ---- state dicts: save, load, continue bitwise ----

struct ResumeCase {
  std::string name;
  std::string kind;
  std::map<std::string, double> options;
  std::string schedule;  // "", "step" or "onecycle"
};

std::unique_ptr<optim::LRScheduler> resume_scheduler(const std::string& s, optim::Optimizer& opt) {
  if (s == "step") return std::make_unique<optim::StepLR>(opt, 3, 0.5);
  if (s == "onecycle") return std::make_unique<optim::OneCycleLR>(opt, 0.05, optim::OneCycleOptions{.total_steps = 12});
  if (s == "cosine") return std::make_unique<optim::CosineWithWarmup>(opt, 3, 12, 0.001);
  return nullptr;
}

class StateDictResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(StateDictResume, ContinuesBitwiseIdentically) {
  const ResumeCase& rc = GetParam();
  RefCase groups_case;  // two groups with different options, as a checkpoint would see
  groups_case.params = {{"group0.weight_decay", {"0.01"}}, {"group1.lr", {"0.03"}}};
  auto train = [](Problem& pr, optim::Optimizer& opt, optim::LRScheduler* sched, int steps) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      pr.backward();
      opt.step();
      if (sched) sched->step();
    }
  };
  // Uninterrupted: 4 steps, snapshot, 6 more.
  Problem a(kFloat32);
  auto opt_a = make_optimizer(rc.kind, rc.options, a.groups(groups_case));
  auto sched_a = resume_scheduler(rc.schedule, *opt_a);
  train(a, *opt_a, sched_a.get(), 4);
  Tensor W4 = a.W.detach().clone(), b4 = a.b.detach().clone();
  optim::OptimizerState saved = opt_a->state_dict();
  std::map<std::string, double> saved_sched = sched_a ? sched_a->state_dict() : std::map<std::string, double>{};
  train(a, *opt_a, sched_a.get(), 6);

  // Resumed: fresh parameters holding the snapshot, a fresh optimizer and scheduler, then 6 steps.
  Problem b(kFloat32);
  {
    NoGradGuard no_grad;
    b.W.copy_(W4);
    b.b.copy_(b4);
  }
  auto opt_b = make_optimizer(rc.kind, rc.options, b.groups(groups_case));
  auto sched_b = resume_scheduler(rc.schedule, *opt_b);
  opt_b->load_state_dict(saved);
  if (sched_b) sched_b->load_state_dict(saved_sched);
  train(b, *opt_b, sched_b.get(), 6);

  EXPECT_TRUE(equal(a.W, b.W)) << a.W.to_string() << "\n" << b.W.to_string();
  EXPECT_TRUE(equal(a.b, b.b));
  // The saved state was a snapshot: the 6 further steps did not change it.
  EXPECT_EQ(saved.scalars.count("state.0.step") ? saved.scalars.at("state.0.step") : 4.0, 4.0);
  optim::OptimizerState end_a = opt_a->state_dict(), end_b = opt_b->state_dict();
  EXPECT_EQ(end_a.scalars, end_b.scalars);
  ASSERT_EQ(end_a.tensors.size(), end_b.tensors.size());
  for (const auto& [k, t] : end_a.tensors) EXPECT_TRUE(equal(t, end_b.tensors.at(k))) << k;
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, StateDictResume,
    ::testing::Values(ResumeCase{"sgd_nesterov_step", "sgd", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", 1}}, "step"},
                      ResumeCase{"sgd_onecycle", "sgd", {{"lr", 0.05}, {"momentum", 0.9}}, "onecycle"},
                      ResumeCase{"adam_amsgrad_cosine", "adam", {{"lr", 0.01}, {"amsgrad", 1}}, "cosine"},
                      ResumeCase{"adamw_onecycle", "adamw", {{"lr", 0.01}}, "onecycle"},
                      ResumeCase{"rmsprop_centered", "rmsprop", {{"momentum", 0.5}, {"centered", 1}}, ""},
                      ResumeCase{"adagrad", "adagrad", {{"lr_decay", 0.01}}, "step"}),
    [](const auto& info) { return info.param.name; });

TEST(StateDict, FormatNamesGroupsAndState) {
  Problem pr(kFloat64);
  optim::Adam opt(std::vector<ParamGroup>{{{pr.W, pr.unused}, {{"lr", 0.5}}}, {{pr.b}, {}}}, {.amsgrad = true});
  pr.backward();
  opt.step();
  optim::OptimizerState s = opt.state_dict();
  EXPECT_EQ(s.scalars.at("group.0.num_params"), 2);
  EXPECT_EQ(s.scalars.at("group.1.num_params"), 1);
  EXPECT_EQ(s.scalars.at("group.0.lr"), 0.5);
  EXPECT_EQ(s.scalars.at("group.1.lr"), 1e-3);
  EXPECT_EQ(s.scalars.at("group.1.amsgrad"), 1);
  EXPECT_EQ(s.scalars.at("state.0.step"), 1);  // W
  EXPECT_EQ(s.scalars.count("state.1.step"), 0u);  // unused: no gradient, no state
  EXPECT_EQ(s.scalars.at("state.2.step"), 1);  // b
  for (const char* k : {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "state.2.exp_avg"})
    EXPECT_EQ(s.tensors.count(k), 1u) << k;
  EXPECT_EQ(s.tensors.size(), 6u);
  // After one step exp_avg = (1 - beta1) g exactly as computed from the gradient.
  EXPECT_TRUE(allclose(s.tensors.at("state.2.exp_avg"), pr.b.grad() * 0.1, 1e-15, 0));
}

template <typename E, typename F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(StateDict, LoadRejectsMismatchesWithoutChangingAnything) {
  Problem pr(kFloat32);
  optim::SGD sgd({pr.W, pr.b}, {.lr = 0.1, .momentum = 0.9});
  pr.backward();
  sgd.step();
  const optim::OptimizerState before = sgd.state_dict();

  optim::Adam adam({pr.W, pr.b});
  adam.step();
  std::string m = message_of<ValueError>([&] { sgd.load_state_dict(adam.state_dict()); });
  EXPECT_NE(m.find("SGD.load_state_dict"), std::string::npos) << m;
  EXPECT_NE(m.find("another optimizer"), std::string::npos) << m;

  optim::OptimizerState bad_shape = before;
  bad_shape.tensors["state.1.momentum_buffer"] = zeros({4});
  m = message_of<ValueError>([&] { sgd.load_state_dict(bad_shape); });
  EXPECT_NE(m.find("'state.1.momentum_buffer' has shape [4]"), std::string::npos) << m;
  EXPECT_NE(m.find("parameter 1 has shape [3]"), std::string::npos) << m;

  optim::OptimizerState bad_dtype = before;
  bad_dtype.tensors["state.0.momentum_buffer"] = zeros({3, 4}, kFloat64);
  EXPECT_THROW(sgd.load_state_dict(bad_dtype), ValueError);

  optim::OptimizerState bad_group = before;
  bad_group.scalars["group.0.lr"] = 7;  // would be loaded if the checks came after the writes
  bad_group.scalars["group.0.num_params"] = 3;
  m = message_of<ValueError>([&] { sgd.load_state_dict(bad_group); });
  EXPECT_NE(m.find("'group.0.num_params' is 3 but this optimizer's group 0 has 2 parameters"), std::string::npos) << m;

  optim::OptimizerState extra = before;
  extra.scalars["state.5.step"] = 1;
  EXPECT_THROW(sgd.load_state_dict(extra), ValueError);

  const optim::OptimizerState after = sgd.state_dict();
  EXPECT_EQ(after.scalars, before.scalars);
  for (const auto& [k, t] : before.tensors) EXPECT_TRUE(equal(t, after.tensors.at(k))) << k;
}

TEST(StateDict, SchedulerStateRestoresLearningRate) {
  std::vector<Tensor> keep;
  auto opt = schedule_optimizer("sgd", keep);
  optim::StepLR sched(*opt, 2, 0.5);
  for (int i = 0; i < 5; ++i) sched.step();
  auto s = sched.state_dict();
  EXPECT_EQ(s.at("last_epoch"), 5);
  EXPECT_EQ(s.at("last_lr.0"), 0.1 * 0.25);
  std::vector<Tensor> keep2;
  auto opt2 = schedule_optimizer("sgd", keep2);
  optim::StepLR sched2(*opt2, 2, 0.5);
  sched2.load_state_dict(s);
  EXPECT_EQ(opt2->param_groups()[0].lr(), 0.1 * 0.25);
  EXPECT_EQ(opt2->param_groups()[1].lr(), 0.02 * 0.25);
  sched.step();
  sched2.step();
  EXPECT_EQ(sched.get_last_lr(), sched2.get_last_lr());
  s.erase("last_lr.1");
  EXPECT_THROW(sched2.load_state_dict(s), ValueError);
}

// ---- construction errors and zero_grad ----

TEST(OptimizerErrors, OptionsAndParametersAreChecked) {
  Tensor w = zeros({2}).set_requires_grad(true);
  std::string m = message_of<ValueError>([&] { optim::SGD({w}, {}); });
  EXPECT_NE(m.find("SGD: parameter group 0 has no learning rate"), std::string::npos) << m;
  m = message_of<ValueError>([&] { optim::SGD({{{w}, {{"mometum", 0.9}}}}, {.lr = 0.1}); });
  EXPECT_NE(m.find("unknown option 'mometum'; known: dampening, lr, maximize, momentum, nesterov, weight_decay"),
            std::string::npos)
      << m;
  m = message_of<ValueError>([&] { optim::SGD({w}, {.lr = 0.1, .nesterov = true}); });
  EXPECT_NE(m.find("Nesterov momentum requires a momentum and zero dampening"), std::string::npos) << m;
  m = message_of<ValueError>([&] { optim::Adam({w}, {.betas = {0.9, 1.0}}); });
  EXPECT_NE(m.find("Adam: invalid beta2 1"), std::string::npos) << m;
  m = message_of<ValueError>([&] { optim::AdamW({w, w}); });
  EXPECT_NE(m.find("appears in more than one place"), std::string::npos) << m;
  m = message_of<ValueError>([&] { optim::RMSprop({w * 2.0}); });
  EXPECT_NE(m.find("not a leaf tensor"), std::string::npos) << m;
  m = message_of<ValueError>([&] { optim::Adagrad(std::vector<Tensor>{}); });
  EXPECT_NE(m.find("Adagrad: got an empty parameter list"), std::string::npos) << m;
  m = message_of<IndexError>([&] { optim::Adagrad({w}).param_groups()[0].set("momentum", 0.9); });
  EXPECT_NE(m.find("no option 'momentum'"), std::string::npos) << m;
}

TEST(Optimizer, ZeroGradDropsOrZeroesGradients) {
  Problem pr(kFloat64);
  optim::SGD opt({pr.W, pr.b}, {.lr = 0.1});
  pr.backward();
  opt.zero_grad(false);
  ASSERT_TRUE(pr.W.grad().defined());
  EXPECT_EQ(sum(abs(pr.W.grad())).item(), 0.0);
  opt.zero_grad();
  EXPECT_FALSE(pr.W.grad().defined());
  EXPECT_FALSE(pr.b.grad().defined());
}

TEST(Optimizer, SgdStepClosedForm) {
  // One plain step is p - lr * g; with weight decay p - lr * (g + wd p).
  Tensor p = tensor(std::vector<double>{1.0, -2.0}, {2}).set_requires_grad(true);
  p.set_grad(tensor(std::vector<double>{0.5, 0.25}, {2}));
  optim::SGD opt({p}, {.lr = 0.1, .weight_decay = 0.2});
  opt.step();
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1.0 - 0.1 * (0.5 + 0.2), -2.0 - 0.1 * (0.25 - 0.4)}));
}

// A backend's fused Adam step (Note [Fused kernels]) is the composite update, written here
// from torch/optim/adam.py's single-tensor path with braid's ops: every operation rounds where the
// composite's does, so the two agree bit for bit, in both dtypes, for Adam and AdamW, with amsgrad.
// Large enough (100,000 elements) for the fused loop to run on every thread.
TEST(Optimizer, FusedAdamStepIsTheCompositeUpdate) {
  Generator gen(5);
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  for (DType dt : {kFloat32, kFloat64})
    for (bool decoupled : {false, true})
      for (bool amsgrad : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (decoupled ? " AdamW" : " Adam") + (amsgrad ? " amsgrad" : ""));
        const Tensor p0 = randn({100000}, dt, &gen);
        Tensor p = p0.clone().set_requires_grad(true);
        std::unique_ptr<optim::Optimizer> opt;
        if (decoupled) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions{.lr = lr, .weight_decay = wd, .amsgrad = amsgrad});
        else opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p}, optim::AdamOptions{.lr = lr, .weight_decay = wd, .amsgrad = amsgrad});
        NoGradGuard no_grad;
        Tensor q = p0.clone(), m = zeros_like(q), v = zeros_like(q), mv = zeros_like(q);
        for (int step = 1; step <= 3; ++step) {
          const Tensor g0 = randn({100000}, dt, &gen);
          p.set_grad(g0.clone());
          opt->step();
          Tensor g = g0;
          if (decoupled) q.mul_(1 - lr * wd);
          else g = q * wd + g0;
          m.mul_(b1).add_(g * (1 - b1));
          v.mul_(b2).add_((g * g) * (1 - b2));
          if (amsgrad) mv.copy_(maximum(mv, v));
          const Tensor& second = amsgrad ? mv : v;
          q.add_((m / (sqrt(second) / std::sqrt(1 - std::pow(b2, step)) + eps)) * (-lr / (1 - std::pow(b1, step))));
          ASSERT_TRUE(equal(p.detach(), q)) << "step " << step;
        }
      }
}

// ---- clip_grad_norm_ closed forms ----

TEST(ClipGradNorm, ScalesToMaxNormAndReturnsTotal) {
  Tensor a = zeros({2}, kFloat64).set_requires_grad(true), b = zeros({1}, kFloat64).set_requires_grad(true);
  Tensor none = zeros({3}, kFloat64).set_requires_grad(true);  // no gradient: ignored
  a.set_grad(tensor(std::vector<double>{3, 0}, {2}));
  b.set_grad(tensor(std::vector<double>{-4}, {1}));
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_({a, b, none}, 1.0), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_DOUBLE_EQ(a.grad().to_vector<double>()[0], 3 * coef);
  EXPECT_DOUBLE_EQ(b.grad().to_vector<double>()[0], -4 * coef);
  // Below max_norm nothing changes.
  EXPECT_NEAR(optim::clip_grad_norm_({a, b}, 10.0), 5 * coef, 1e-15);
  EXPECT_DOUBLE_EQ(a.grad().to_vector<double>()[0], 3 * coef);
}

TEST(ClipGradNorm, InfinityAndOneNorms) {
  Tensor a = zeros({3}, kFloat64).set_requires_grad(true);
  a.set_grad(tensor(std::vector<double>{1, -7, 2}, {3}));
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_({a}, 100.0, std::numeric_limits<double>::infinity()), 7.0);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_({a}, 100.0, 1.0), 10.0);
  EXPECT_NEAR(optim::clip_grad_norm_({a}, 100.0, 3.0), std::cbrt(1 + 343 + 8), 1e-14);
  EXPECT_EQ(optim::clip_grad_norm_({zeros({2}).set_requires_grad(true)}, 1.0), 0.0);  // no gradients
}

TEST(ClipGradNorm, NonFiniteTotal) {
  Tensor a = zeros({2}, kFloat64).set_requires_grad(true);
  a.set_grad(tensor(std::vector<double>{std::nan(""), 1}, {2}));
  std::string m = message_of<ValueError>([&] { optim::clip_grad_norm_({a}, 1.0, 2.0, true); });
  EXPECT_NE(m.find("clip_grad_norm_: the total norm of order 2"), std::string::npos) << m;
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_({a}, 1.0, std::numeric_limits<double>::infinity())));
  EXPECT_TRUE(std::isnan(a.grad().to_vector<double>()[1]));  // clipped anyway, as PyTorch
}

}  // namespace
}  // namespace braid
