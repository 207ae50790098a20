// LocalSGD: periodic averaging of the ranks' parameter deltas and an outer optimizer step.
//
// Note [Local SGD equals data parallelism at H = 1]
// With H = 1 and outer SGD at learning rate 1, a synchronisation sets every rank's parameters to
// anchor - mean_r (anchor - theta_r). With inner SGD, theta_r = anchor - lr g_r, so in exact
// arithmetic that is anchor - lr mean_r g_r: DistributedDataParallel's step. In floating point the
// two round differently (a difference of nearly equal numbers here, a product there), so they are
// equal bit for bit when every intermediate is exact (the test's dyadic data) and to rounding
// otherwise.
//
// Note [Automatic period]
// As EDDL's automatic weight-averaging period: every rank measures its mean local step (from one
// step() return to the next call) and the last synchronisation's time; the slowest rank's figures
// (one all-reduce of max, so that every rank picks the same H and no rank waits at a collective
// the others skip) set H to the least period whose synchronisation takes at most max_comm_fraction
// of the time: sync / (H step + sync) <= f, i.e. H >= sync (1 - f) / (f step).
//
// Note [One all-reduce per sync]
// A synchronisation moves the parameters' deltas and the floating-point buffers (BatchNorm's running
// statistics, averaged rather than kept per rank) in one flat buffer per dtype and device, so that
// the group's counter shows one all-reduce of Psi elements per sync for a model of one dtype: H
// times fewer calls and bytes than data parallelism's per-step buckets. The automatic period adds
// one all-reduce of two numbers per sync (the slowest rank's times); a fixed period adds nothing.
// Integer buffers (BatchNorm's batch counter) advance alike on every rank and are left alone.
#include "braid/distributed/local_sgd.h"

#include <chrono>
#include <cmath>
#include <map>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One all-reduce (average) per dtype and device over the tensors' flattened values, written back.
void average_in_place(const std::vector<Tensor>& tensors, ProcessGroup& group) {
  std::map<std::pair<int, std::pair<int, int>>, std::vector<Tensor>> by_kind;
  for (const Tensor& t : tensors)
    by_kind[{static_cast<int>(t.dtype()), {static_cast<int>(t.device().type), t.device().index}}].push_back(t);
  for (auto& [kind, list] : by_kind) {
    std::vector<Tensor> flat;
    for (const Tensor& t : list) flat.push_back(t.reshape({t.numel()}));
    Tensor buffer = concat(flat, 0).contiguous();
    group.all_reduce(buffer, ReduceOp::Average);
    int64_t at = 0;
    for (Tensor t : list) {
      t.copy_(buffer.narrow(0, at, t.numel()).view(t.shape()));
      at += t.numel();
    }
  }
}
}  // namespace

int64_t choose_period(double step_seconds, double sync_seconds, double fraction, int64_t max_period) {
  BRAID_CHECK(fraction > 0 && fraction < 1, "choose_period: the fraction must be in (0, 1), got ", fraction);
  if (step_seconds <= 0 || sync_seconds <= 0) return 1;
  const double h = std::ceil(sync_seconds * (1 - fraction) / (fraction * step_seconds) - 1e-12);
  return std::clamp<int64_t>(static_cast<int64_t>(h), 1, std::max<int64_t>(max_period, 1));
}

LocalSGD::LocalSGD(std::shared_ptr<nn::Module> module, ProcessGroupPtr group, const LocalSGDOptions& o)
    : module_(std::move(module)), group_(group ? std::move(group) : world()), options_(o) {
  BRAID_CHECK(module_ != nullptr, "LocalSGD: the module is null");
  BRAID_CHECK(o.period >= 0, "LocalSGD: period must be >= 0 (0: automatic), got ", o.period);
  BRAID_CHECK(o.outer == "sgd" || o.outer == "nesterov", "LocalSGD: outer must be 'sgd' or 'nesterov', got '", o.outer,
              "'");
  BRAID_CHECK(o.outer_lr > 0 && o.outer_momentum >= 0 && o.outer_momentum < 1, "LocalSGD: outer_lr must be > 0 and ",
              "outer_momentum in [0, 1), got ", o.outer_lr, " and ", o.outer_momentum);
  BRAID_CHECK(o.max_comm_fraction > 0 && o.max_comm_fraction < 1 && o.max_period >= 1, "LocalSGD: max_comm_fraction ",
              "must be in (0, 1) and max_period >= 1, got ", o.max_comm_fraction, " and ", o.max_period);
  for (const auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    names_.push_back(name);
    params_.push_back(p);
  }
  detail::check_and_broadcast_model(*module_, *group_, true, "LocalSGD");
  NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    anchor_.push_back(p.detach().clone());
    if (o.outer == "nesterov") momentum_.push_back(zeros_like(p));
  }
  period_ = o.period > 0 ? o.period : 1;
}

bool LocalSGD::step() {
  const double now = now_seconds();
  if (last_time_ > 0) step_seconds_ += now - last_time_, ++intervals_;
  if (++local_steps_ < period_) {
    last_time_ = now;
    return false;
  }
  synchronise();
  last_time_ = now_seconds();
  return true;
}

bool LocalSGD::sync_now() {
  if (local_steps_ == 0) return false;  // the same on every rank: they step together
  synchronise();
  last_time_ = 0;  // what follows (evaluation, a checkpoint) is not a local step
  return true;
}

void LocalSGD::synchronise() {
  NoGradGuard no_grad;
  const double t0 = now_seconds();
  std::vector<Tensor> deltas, averaged;
  for (size_t i = 0; i < params_.size(); ++i) deltas.push_back(anchor_[i] - params_[i].detach());
  averaged = deltas;
  if (options_.average_buffers)  // in the same flat buffers: one all-reduce per dtype (Note [One all-reduce per sync])
    for (const auto& [name, b] : module_->named_buffers())
      if (is_floating(b.dtype())) averaged.push_back(b);
  average_in_place(averaged, *group_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (momentum_.empty()) {
      anchor_[i].add_(deltas[i], -options_.outer_lr);
    } else {  // PyTorch's SGD with nesterov: buf = mu buf + d; step = d + mu buf
      momentum_[i].mul_(options_.outer_momentum).add_(deltas[i]);
      anchor_[i].add_(deltas[i] + momentum_[i] * options_.outer_momentum, -options_.outer_lr);
    }
    params_[i].detach().copy_(anchor_[i]);
  }
  sync_seconds_ = now_seconds() - t0;
  ++syncs_;
  local_steps_ = 0;
  if (options_.period == 0) {
    const double mean_step = intervals_ > 0 ? step_seconds_ / static_cast<double>(intervals_) : 0.0;
    Tensor t = tensor(std::vector<double>{mean_step, sync_seconds_}, {2}, Device::cpu());
    group_->all_reduce(t, ReduceOp::Max);
    const auto v = t.to_vector<double>();
    period_ = choose_period(v[0], v[1], options_.max_comm_fraction, options_.max_period);
  }
  step_seconds_ = 0, intervals_ = 0;
}

void LocalSGD::store(Checkpoint& ckpt, const std::string& prefix) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    ckpt.tensors[prefix + "anchor." + names_[i]] = anchor_[i].clone();
    if (!momentum_.empty()) ckpt.tensors[prefix + "momentum." + names_[i]] = momentum_[i].clone();
  }
  ckpt.integers[prefix + "period"] = period_;
  ckpt.integers[prefix + "syncs"] = syncs_;
  ckpt.integers[prefix + "local_steps"] = local_steps_;
  ckpt.integers[prefix + "intervals"] = intervals_;
  ckpt.scalars[prefix + "step_seconds"] = step_seconds_;
  ckpt.scalars[prefix + "sync_seconds"] = sync_seconds_;
}

void LocalSGD::restore(const Checkpoint& ckpt, const std::string& prefix, LocalSGDResume resume) {
  // Every entry is checked before anything changes.
  for (size_t i = 0; i < names_.size(); ++i) {
    for (const char* kind : {"anchor.", "momentum."}) {
      if (std::string(kind) == "momentum." && momentum_.empty()) continue;
      const std::string key = prefix + kind + names_[i];
      auto it = ckpt.tensors.find(key);
      BRAID_CHECK(it != ckpt.tensors.end(), "LocalSGD::restore: ", ckpt.source, " has no '", key, "'");
      BRAID_CHECK(it->second.shape() == params_[i].shape(), "LocalSGD::restore: '", key, "' in ", ckpt.source,
                  " has shape ", shape_str(it->second.shape()), ", the parameter ", shape_str(params_[i].shape()));
    }
  }
  BRAID_CHECK(ckpt.integers.count(prefix + "period") && ckpt.integers.count(prefix + "syncs"),
              "LocalSGD::restore: ", ckpt.source, " has no '", prefix, "period' or '", prefix, "syncs'");
  const bool exact = resume == LocalSGDResume::Exact;
  int64_t local_steps = 0;
  if (exact) {
    for (const char* key : {"local_steps", "intervals"})
      BRAID_CHECK(ckpt.integers.count(prefix + key), "LocalSGD::restore: an exact resume needs '", prefix, key,
                  "', which ", ckpt.source, " does not have (written before it was stored)");
    for (const char* key : {"step_seconds", "sync_seconds"})
      BRAID_CHECK(ckpt.scalars.count(prefix + key), "LocalSGD::restore: an exact resume needs '", prefix, key,
                  "', which ", ckpt.source, " does not have");
    local_steps = ckpt.integers.at(prefix + "local_steps");
    const int64_t period = ckpt.integers.at(prefix + "period");
    BRAID_CHECK(period >= 1 && local_steps >= 0 && local_steps < period, "LocalSGD::restore: ", ckpt.source,
                " has local_steps ", local_steps, " and period ", period, "; expected 0 <= local_steps < period");
    // Ranks that disagree on when to synchronise would hang at the next sync: compare before changing.
    std::vector<double> v{static_cast<double>(period), static_cast<double>(local_steps), -static_cast<double>(period),
                          -static_cast<double>(local_steps)};
    Tensor t = tensor(v, {4}, Device::cpu());
    group_->all_reduce(t, ReduceOp::Max);
    const auto m = t.to_vector<double>();
    BRAID_CHECK(m[0] == -m[2] && m[1] == -m[3], "LocalSGD::restore: the ranks' checkpoints disagree on the period (",
                -m[2], " to ", m[0], ") or the local steps since the last sync (", -m[3], " to ", m[1], "), so they ",
                "would not synchronise together; rank ", group_->rank(), "'s ", ckpt.source, " has ", period, " and ",
                local_steps);
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < names_.size(); ++i) {
    anchor_[i].copy_(ckpt.tensors.at(prefix + "anchor." + names_[i]));
    if (!momentum_.empty()) momentum_[i].copy_(ckpt.tensors.at(prefix + "momentum." + names_[i]));
    if (!exact) params_[i].detach().copy_(anchor_[i]);
  }
  period_ = ckpt.integers.at(prefix + "period");
  syncs_ = ckpt.integers.at(prefix + "syncs");
  local_steps_ = local_steps;
  last_time_ = 0;  // another process's clock: the first interval after a restart is not measured
  if (exact) {
    intervals_ = ckpt.integers.at(prefix + "intervals");
    step_seconds_ = ckpt.scalars.at(prefix + "step_seconds");
    sync_seconds_ = ckpt.scalars.at(prefix + "sync_seconds");
  } else {
    step_seconds_ = 0, intervals_ = 0;
  }
}

}  // namespace braid::distributed
