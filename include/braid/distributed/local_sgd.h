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

/// What LocalSGD::restore puts back (Note [Local SGD checkpoints]).
enum class LocalSGDResume {
  /// The last synchronisation: the parameters become the anchor and the period starts afresh. What a
  /// requeued job does, from the one checkpoint that rank 0 wrote.
  LastSync,
  /// Exactly where store() was called, mid-period too: the module's parameters are left as the
  /// caller restored them (this rank's own, from this rank's own checkpoint, with its optimizer's
  /// state), and the local step counter and the automatic period's measurements come back.
  Exact,
};

class LocalSGD {
 public:
  /// Checks that every rank built the same model and broadcasts rank 0's parameters and buffers,
  /// which become the first synchronised ("anchor") parameters. Collective over group.
  LocalSGD(std::shared_ptr<nn::Module> module, ProcessGroupPtr group = nullptr, const LocalSGDOptions& options = {});

  /// Call after each local optimizer step. Every period-th call synchronises (collective: one
  /// all-reduce of the parameters' deltas per dtype, and of the buffers) and returns true.
  bool step();
  /// Synchronises now when a local step was taken since the last synchronisation, and returns
  /// whether it did: collective, every rank calls it at the same point, e.g. at an epoch's end so
  /// that evaluation, the checkpoint and an export see the averaged model, not this rank's copy.
  bool sync_now();
  int64_t period() const { return period_; }
  const LocalSGDOptions& options() const { return options_; }
  /// Local steps since the last synchronisation, and synchronisations so far.
  int64_t local_steps() const { return local_steps_; }
  int64_t syncs() const { return syncs_; }
  /// The last synchronised parameters, by name.
  const std::vector<Tensor>& anchor() const { return anchor_; }

  /// The names of the parameters it averages (those that require gradients), in anchor()'s order.
  const std::vector<std::string>& names() const { return names_; }

  // Note [Local SGD checkpoints]: what a restart needs is the last synchronised state, which is the
  // same on every rank: the anchor, the outer momentum, the period and the counters. A restart
  // resumes from the anchor by default (LocalSGDResume::LastSync: the local steps after it are each
  // rank's own, and one file from rank 0 cannot hold them), so a preempted and requeued job
  // continues from its last synchronisation. A program that keeps one checkpoint per rank (its
  // parameters and inner optimizer) can continue exactly instead (LocalSGDResume::Exact), mid-period
  // too; the local step counter is then the same on every rank, which restore checks, since ranks
  // that disagree on when to synchronise would wait for each other forever.
  /// Writes the state under prefix: tensors prefix + "anchor.<name>", prefix + "momentum.<name>",
  /// integers prefix + "period", "syncs", "local_steps", "intervals", scalars prefix +
  /// "step_seconds", "sync_seconds" (the automatic period's measurements).
  void store(braid::Checkpoint& ckpt, const std::string& prefix) const;
  /// Restores it (every entry checked first, naming the checkpoint and the key); LastSync sets the
  /// module's parameters to the anchor. Exact is collective over the group (one small all-reduce).
  void restore(const braid::Checkpoint& ckpt, const std::string& prefix,
               LocalSGDResume resume = LocalSGDResume::LastSync);

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
