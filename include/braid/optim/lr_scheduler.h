// Learning-rate schedules: each sets the "lr" of every parameter group of an optimizer, once at
// construction (epoch 0) and again at each step(), with PyTorch's formulas (torch.optim.lr_scheduler)
// so that the sequences match. Call step() after optimizer.step(). A scheduler refers to its
// optimizer, which must outlive it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "braid/optim/optimizer.h"

namespace braid::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one epoch (or step) and sets the groups' learning rates.
  void step();
  /// The learning rate this scheduler last set, per group.
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  /// The number of step() calls since construction (0 right after it).
  int64_t last_epoch() const { return last_epoch_; }
  const std::string& name() const { return name_; }

  /// "last_epoch", "base_lr.<g>" and "last_lr.<g>" per group.
  std::map<std::string, double> state_dict() const;
  /// Restores the state and sets the groups' learning rates (and a cycled momentum) to those of
  /// the restored epoch, so resuming does not depend on whether the optimizer or the scheduler is
  /// loaded first. Throws ValueError for a missing key or another number of groups.
  void load_state_dict(const std::map<std::string, double>& state);

 protected:
  LRScheduler(Optimizer& optimizer, std::string name);
  /// The learning rates for last_epoch(), one per group. Chainable schedules (StepLR, ...) scale the
  /// groups' current rates, as PyTorch's do; closed-form ones work from base_lrs().
  virtual std::vector<double> compute_lr() = 0;
  /// Applies anything besides the learning rate that the schedule sets at last_epoch() (OneCycleLR's momentum).
  virtual void apply_extras() {}
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() { return optimizer_; }

 private:
  Optimizer& optimizer_;
  std::string name_;
  int64_t last_epoch_ = -1;
  std::vector<double> base_lrs_;  // the groups' learning rates at construction
  std::vector<double> last_lrs_;
};

/// lr *= gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> compute_lr() override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// lr *= gamma at each milestone epoch (a milestone listed k times multiplies by gamma^k).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> compute_lr() override;

 private:
  std::map<int64_t, int> milestones_;  // epoch -> count
  double gamma_;
};

/// lr *= gamma every epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 protected:
  std::vector<double> compute_lr() override;

 private:
  double gamma_;
};

/// Linear warmup, then cosine annealing to min_lr. At step s (0 after construction), for a group
/// whose learning rate was base at construction, with W = warmup_steps and T = total_steps:
///   s < W:   lr = base * (s + 1) / W
///   s >= W:  lr = min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2,  p = min(1, (s - W) / max(1, T - W))
/// so the first step already trains at base / W, the peak base is reached at s = W - 1 and held at
/// s = W, and lr reaches min_lr at s = T and stays there.
class CosineWithWarmup : public LRScheduler {
 public:
  CosineWithWarmup(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);

 protected:
  std::vector<double> compute_lr() override;

 private:
  int64_t warmup_;
  int64_t total_;
  double min_lr_;
};

struct OneCycleOptions {
  int64_t total_steps = 0;  // required
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // "cos" or "linear"
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

/// The one-cycle policy (Smith and Topin), as torch.optim.lr_scheduler.OneCycleLR: lr rises from
/// max_lr / div_factor to max_lr over the first pct_start of total_steps, then anneals to
/// max_lr / div_factor / final_div_factor (three_phase: back down to the initial lr first, then to
/// the minimum). With cycle_momentum the group's "momentum" (SGD, RMSprop) or "beta1" (Adam, AdamW)
/// moves inversely between max_momentum and base_momentum; as in PyTorch this also turns on
/// momentum for an SGD made without it. Stepping past total_steps throws.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, const OneCycleOptions& options);
  /// One max_lr per parameter group.
  OneCycleLR(Optimizer& optimizer, const std::vector<double>& max_lrs, const OneCycleOptions& options);

 protected:
  std::vector<double> compute_lr() override;
  void apply_extras() override;

 private:
  struct Phase {
    double end_step;
    int lr_start, lr_end;    // indices into a group's lrs_: initial, max, min
    int mom_start, mom_end;  // indices into a group's momenta_: max, base
  };
  /// The phase containing last_epoch() and the fraction of it done.
  std::pair<const Phase*, double> locate() const;
  double anneal(double start, double end, double pct) const;

  OneCycleOptions opts_;
  std::vector<Phase> phases_;
  std::vector<std::vector<double>> lrs_;      // per group: initial, max, min
  std::vector<std::vector<double>> momenta_;  // per group: max_momentum, base_momentum
  std::string momentum_key_;                  // "momentum", "beta1", or "" when not cycling
};

}  // namespace braid::optim
