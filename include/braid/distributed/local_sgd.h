// Local SGD and DiLoCo (arXiv 2311.08105): every rank trains its own copy of the model for H steps
// with its own (inner) optimizer, then the ranks average how far they moved and an outer optimizer
// (SGD, or Nesterov momentum as DiLoCo) steps the last synchronised parameters along that average:
// one all-reduce every H steps instead of one per step, for clusters whose links are slow.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/checkpoint.h"
#include "braid/distributed/process_group.h"
#include "braid/nn/module.h"

namespace braid::distributed {

struct LocalSGDOptions {
  /// H: local steps between synchronisations; 0 chooses it as training runs (Note [Automatic
  /// period] in distributed/local_sgd.cpp) to keep communication under max_comm_fraction.
  int64_t period = 8;
  /// "sgd": anchor -= outer_lr x mean delta; "nesterov": with Nesterov momentum (DiLoCo's outer).
  std::string outer = "sgd";
  double outer_lr = 1.0;
  double outer_momentum = 0.9;
  /// The automatic period's target: sync time / (H x step time + sync time) at most this.
  double max_comm_fraction = 0.1;
  int64_t max_period = 1000;
  /// Average floating-point buffers (BatchNorm's running statistics) at each synchronisation.
  bool average_buffers = true;
};

/// The automatic period's rule: the least H >= 1 with sync / (H step + sync) <= fraction, at most
/// max_period (1 when nothing was measured yet).
int64_t choose_period(double step_seconds, double sync_seconds, double fraction, int64_t max_period);

class LocalSGD {
 public:
  /// Checks that every rank built the same model and broadcasts rank 0's parameters and buffers,
  /// which become the first synchronised ("anchor") parameters. Collective over group.
  LocalSGD(std::shared_ptr<nn::Module> module, ProcessGroupPtr group = nullptr, const LocalSGDOptions& options = {});

  /// Call after each local optimizer step. Every period-th call synchronises (collective: one
  /// all-reduce of the parameters' deltas per dtype, and of the buffers) and returns true.
  bool step();
  int64_t period() const { return period_; }
  const LocalSGDOptions& options() const { return options_; }
  /// Local steps since the last synchronisation, and synchronisations so far.
  int64_t local_steps() const { return local_steps_; }
  int64_t syncs() const { return syncs_; }
  /// The last synchronised parameters, by name.
  const std::vector<Tensor>& anchor() const { return anchor_; }

  // Note [Local SGD checkpoints]: what a restart needs is the last synchronised state, which is the
  // same on every rank: the anchor, the outer momentum, the period and the counters. A restart
  // resumes from the anchor (the local steps after it are not kept: each rank's are its own), so a
  // preempted and requeued job continues from its last synchronisation.
  /// Writes the state under prefix: tensors prefix + "anchor.<name>", prefix + "momentum.<name>",
  /// integers prefix + "period", "syncs".
  void store(braid::Checkpoint& ckpt, const std::string& prefix) const;
  /// Restores it and sets the module's parameters to the anchor.
  void restore(const braid::Checkpoint& ckpt, const std::string& prefix);

 private:
  void synchronise();
  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr group_;
  LocalSGDOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_, anchor_, momentum_;
  int64_t period_ = 1, local_steps_ = 0, syncs_ = 0, intervals_ = 0;
  double step_seconds_ = 0, sync_seconds_ = 0, last_time_ = 0;
};

}  // namespace braid::distributed
