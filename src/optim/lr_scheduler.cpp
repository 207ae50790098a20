// Learning-rate schedules with the formulas of torch/optim/lr_scheduler.py (PyTorch 1.13), so that
// a schedule's sequence matches PyTorch's: the chainable ones (StepLR, MultiStepLR, ExponentialLR)
// scale the groups' current rates, OneCycleLR and CosineWithWarmup compute each step's rate in
// closed form from the rates at construction.
#include "braid/optim/lr_scheduler.h"

#include <cmath>
#include <numbers>

namespace braid::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name) : optimizer_(optimizer), name_(std::move(name)) {
  for (const ParamGroup& g : optimizer_.param_groups()) base_lrs_.push_back(g.lr());
}

void LRScheduler::step() {
  ++last_epoch_;
  std::vector<double> lrs = compute_lr();
  auto& groups = optimizer_.param_groups();
  BRAID_CHECK(groups.size() == lrs.size(), name_, ": the optimizer has ", groups.size(),
              " parameter groups but had ", lrs.size(), " when the scheduler was made");
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set("lr", lrs[g]);
  apply_extras();
  last_lrs_ = std::move(lrs);
}

std::map<std::string, double> LRScheduler::state_dict() const {
  std::map<std::string, double> s{{"last_epoch", static_cast<double>(last_epoch_)}};
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    s["base_lr." + std::to_string(g)] = base_lrs_[g];
    s["last_lr." + std::to_string(g)] = last_lrs_[g];
  }
  return s;
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& state) {
  auto get = [&](const std::string& key) {
    auto it = state.find(key);
    BRAID_CHECK(it != state.end(), name_, ".load_state_dict: missing '", key, "'");
    return it->second;
  };
  const size_t n = base_lrs_.size();
  BRAID_CHECK(state.size() == 1 + 2 * n, name_, ".load_state_dict: expected ", 1 + 2 * n, " entries (last_epoch and ",
              n, " base_lr and last_lr), got ", state.size(), "; is it from an optimizer with other parameter groups?");
  std::vector<double> base(n), last(n);
  const double epoch = get("last_epoch");
  for (size_t g = 0; g < n; ++g) {
    base[g] = get("base_lr." + std::to_string(g));
    last[g] = get("last_lr." + std::to_string(g));
  }
  last_epoch_ = static_cast<int64_t>(epoch);
  base_lrs_ = std::move(base);
  last_lrs_ = std::move(last);
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size() && g < n; ++g) groups[g].set("lr", last_lrs_[g]);
  apply_extras();
}

// ---- chainable schedules ----

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  BRAID_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  step();
}

std::vector<double> StepLR::compute_lr() {
  std::vector<double> lrs;
  const bool decay = last_epoch() != 0 && last_epoch() % step_size_ == 0;
  for (const ParamGroup& g : optimizer().param_groups()) lrs.push_back(decay ? g.lr() * gamma_ : g.lr());
  return lrs;
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, "MultiStepLR"), gamma_(gamma) {
  for (int64_t m : milestones) ++milestones_[m];
  step();
}

std::vector<double> MultiStepLR::compute_lr() {
  auto it = milestones_.find(last_epoch());
  const double factor = it == milestones_.end() ? 1.0 : std::pow(gamma_, it->second);
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer().param_groups()) lrs.push_back(it == milestones_.end() ? g.lr() : g.lr() * factor);
  return lrs;
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  step();
}

std::vector<double> ExponentialLR::compute_lr() {
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer().param_groups()) lrs.push_back(last_epoch() == 0 ? g.lr() : g.lr() * gamma_);
  return lrs;
}

// ---- closed-form schedules ----

CosineWithWarmup::CosineWithWarmup(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : LRScheduler(optimizer, "CosineWithWarmup"), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  BRAID_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps, "CosineWithWarmup: need 0 <= warmup_steps <= total_steps, got ",
              warmup_steps, " and ", total_steps);
  step();
}

std::vector<double> CosineWithWarmup::compute_lr() {
  const int64_t s = last_epoch();
  std::vector<double> lrs;
  for (double base : base_lrs()) {
    if (s < warmup_) {
      lrs.push_back(base * static_cast<double>(s + 1) / static_cast<double>(warmup_));
    } else {
      const double p = std::min(1.0, static_cast<double>(s - warmup_) / static_cast<double>(std::max<int64_t>(1, total_ - warmup_)));
      lrs.push_back(min_lr_ + (base - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * p)));
    }
  }
  return lrs;
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, const OneCycleOptions& options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr), options) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, const std::vector<double>& max_lrs, const OneCycleOptions& options)
    : LRScheduler(optimizer, "OneCycleLR"), opts_(options) {
  const auto& o = opts_;
  auto& groups = optimizer.param_groups();
  BRAID_CHECK(o.total_steps > 0, "OneCycleLR: total_steps must be positive, got ", o.total_steps);
  BRAID_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got ", o.pct_start);
  BRAID_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear", "OneCycleLR: unknown anneal_strategy '",
              o.anneal_strategy, "'; known: cos, linear");
  BRAID_CHECK(max_lrs.size() == groups.size(), "OneCycleLR: expected ", groups.size(), " values of max_lr (one per parameter group), got ",
              max_lrs.size());
  const double total = static_cast<double>(o.total_steps);
  enum { kInitial = 0, kMax = 1, kMin = 2, kMaxMomentum = 0, kBaseMomentum = 1 };
  if (o.three_phase) {
    phases_ = {{o.pct_start * total - 1, kInitial, kMax, kMaxMomentum, kBaseMomentum},
               {2 * o.pct_start * total - 2, kMax, kInitial, kBaseMomentum, kMaxMomentum},
               {total - 1, kInitial, kMin, kMaxMomentum, kMaxMomentum}};
  } else {
    phases_ = {{o.pct_start * total - 1, kInitial, kMax, kMaxMomentum, kBaseMomentum},
               {total - 1, kMax, kMin, kBaseMomentum, kMaxMomentum}};
  }
  for (double m : max_lrs) {
    const double initial = m / o.div_factor;
    lrs_.push_back({initial, m, initial / o.final_div_factor});
  }
  if (o.cycle_momentum) {
    const ParamGroup& g0 = groups.front();
    momentum_key_ = g0.options.count("momentum") ? "momentum" : g0.options.count("beta1") ? "beta1" : "";
    BRAID_CHECK(!momentum_key_.empty(), "OneCycleLR: cycle_momentum needs an optimizer with a 'momentum' or 'beta1' option, and ",
                optimizer.name(), " has neither; set OneCycleOptions::cycle_momentum = false");
    momenta_.assign(groups.size(), {o.max_momentum, o.base_momentum});
  }
  step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (opts_.anneal_strategy == "linear") return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::locate() const {
  const int64_t s = last_epoch();
  BRAID_CHECK(s <= opts_.total_steps, "OneCycleLR: tried to step ", s + 1, " times; total_steps is ", opts_.total_steps);
  const double x = static_cast<double>(s);
  double start = 0;
  for (size_t i = 0; i + 1 < phases_.size(); ++i) {
    if (x <= phases_[i].end_step) return {&phases_[i], (x - start) / (phases_[i].end_step - start)};
    start = phases_[i].end_step;
  }
  return {&phases_.back(), (x - start) / (phases_.back().end_step - start)};
}

std::vector<double> OneCycleLR::compute_lr() {
  auto [phase, pct] = locate();
  std::vector<double> lrs;
  for (const auto& l : lrs_) lrs.push_back(anneal(l[phase->lr_start], l[phase->lr_end], pct));
  return lrs;
}

void OneCycleLR::apply_extras() {
  if (momentum_key_.empty()) return;
  auto [phase, pct] = locate();
  auto& groups = optimizer().param_groups();
  for (size_t g = 0; g < groups.size() && g < momenta_.size(); ++g)
    groups[g].set(momentum_key_, anneal(momenta_[g][phase->mom_start], momenta_[g][phase->mom_end], pct));
}

}  // namespace braid::optim
