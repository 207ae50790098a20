// Data-parallel training: every rank holds the whole model and a shard of each batch, and the
// gradients are averaged across ranks while backward is still running. The model code does not
// change: DistributedDataParallel attaches to a Module's parameters (it does not wrap forward), so
// names, state dicts and checkpoints stay those of the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "braid/distributed/comm_hooks.h"
#include "braid/distributed/process_group.h"
#include "braid/nn/module.h"

namespace braid::distributed {

struct DataParallelOptions {
  /// Gradients are fused into buckets of about this many megabytes (2^20 bytes); each bucket's
  /// all-reduce starts as soon as backward has produced all of its gradients. 0 puts every
  /// parameter in its own bucket.
  double bucket_cap_mb = 25;
  /// Allow parameters that receive no gradient in a backward pass (they still take part, with
  /// zeros; one that no rank used keeps an undefined gradient). Off, such a parameter is an error
  /// naming it, as in PyTorch.
  bool find_unused_parameters = false;
  /// Send gradients as float16/bfloat16 (halves the traffic; see WireDType).
  WireDType wire_dtype = WireDType::Native;
  /// Fixed reduction order: N ranks give bitwise the same weights on every run.
  bool deterministic = false;
  /// Copy rank 0's buffers (BatchNorm running statistics) to every rank at construction.
  bool broadcast_buffers = true;
  /// On a group that spans several nodes with several ranks on each, all-reduce buckets of 64 KiB
  /// and more hierarchically (hierarchical.h: 1/L of the bytes cross between nodes); false: flat.
  bool hierarchical = true;
  /// Horovod's autotune: the first synchronised steps try each of autotune_caps_mb as the bucket cap
  /// for autotune_steps steps, time backward from its first bucket to its end (the slowest rank's
  /// median), and keep the fastest cap for the rest of training (autotune_report() says which).
  /// Only with the default all-reduce hook: other hooks keep state per bucket.
  bool autotune = false;
  std::vector<double> autotune_caps_mb = {1, 4, 16, 64};
  int autotune_steps = 5;
};

/// The autotune's rule: the cap whose median time is least (the first of equals).
double choose_bucket_cap(const std::vector<double>& caps_mb, const std::vector<std::vector<double>>& seconds);

/// Timings of the latest synchronised backward pass, for benchmarks and logs.
struct DataParallelStats {
  double backward_seconds = 0;  ///< from the first bucket launch to the end of backward's own work
  double exposed_seconds = 0;   ///< time backward's end spent waiting for all-reduces
  int64_t buckets = 0;
  int64_t bytes = 0;
};

class Join;

class DistributedDataParallel {
 public:
  /// Broadcasts module's parameters (and buffers) from rank 0 after checking that every rank built
  /// the same model (names, shapes, dtypes); a difference stops every rank with an error naming the
  /// first differing parameter and the ranks. Collective: every rank of group calls it.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroupPtr group = nullptr,
                                   const DataParallelOptions& options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// The model's forward (a convenience; calling the module directly is the same).
  Tensor forward(const Tensor& x) { return module_->forward(x); }
  Tensor operator()(const Tensor& x) { return forward(x); }
  nn::Module& module() { return *module_; }
  const ProcessGroupPtr& group() const { return group_; }

  /// While a NoSync guard lives, backward accumulates gradients locally without communicating
  /// (gradient accumulation); the first backward after it all-reduces what was accumulated.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), prev_(ddp.sync_) { ddp_.sync_ = false; }
    ~NoSync() { ddp_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };

  /// Reduces every bucket with hook instead of the all-reduce (comm_hooks.h: TopKHook,
  /// PowerSGDHook, or one's own), as PyTorch's register_comm_hook. Before the first backward:
  /// ValueError after it. Every rank registers the same kind of hook.
  void register_comm_hook(CommHookPtr hook);
  /// The hook in use (allreduce_hook from the options unless one was registered).
  CommHook& comm_hook() { return *hook_; }
  /// Synchronised backward passes so far (GradBucket::step of the next one).
  int64_t steps() const { return steps_; }
  /// A resumed run's count, so that a hook's schedule (warm-up, start step) continues from it.
  void set_steps(int64_t steps) { steps_ = steps; }
  /// The bucket cap in use (options' bucket_cap_mb, or the autotune's choice once it has made it).
  double bucket_cap_mb() const { return cap_mb_; }
  /// Empty until the autotune has chosen; then a line per cap tried and the choice.
  const std::string& autotune_report() const { return autotune_report_; }

  /// Names of the parameters in each bucket, in launch order (the reverse of registration).
  std::vector<std::vector<std::string>> bucket_names() const;
  const DataParallelStats& last_stats() const { return stats_; }

 private:
  friend class Join;
  struct Bucket;
  void shadow_backward();
  void on_grad_ready(size_t param);
  void launch_ready_buckets();
  void launch(size_t bucket);
  void finish_buckets();
  void finish_backward();

  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr group_;
  DataParallelOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<int> hook_ids_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<bool> ready_;
  size_t next_launch_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
  double first_launch_time_ = 0;
  DataParallelStats stats_;
  CommHookPtr hook_;
  int64_t steps_ = 0;
  Join* join_ = nullptr;  // while a Join is attached: each pass first counts the ranks still training
  int active_ranks_ = 0;
  double cap_mb_ = 25;
  // The autotune: which cap is being timed, and the times so far per cap.
  size_t tuning_ = 0;
  std::vector<std::vector<double>> tuned_seconds_;
  std::string autotune_report_;
  void make_buckets(double cap_mb);
  void autotune_step(double seconds);
};

struct JoinOptions {
  /// Average each gradient over the ranks the job started with, the finished ones adding zeros
  /// (PyTorch's default); false: over the ranks still training.
  bool divide_by_initial_world_size = true;
};

/// Uneven inputs, as PyTorch's Join with DistributedDataParallel's join hook: ranks whose shards
/// hold different numbers of batches each run their own loop, and a rank that runs out calls
/// finish(), where it takes part in the others' gradient all-reduces with zeros (it "shadows" them)
/// until every rank is done; then every rank takes the parameters and buffers of the rank that
/// trained the most steps (the last to finish), so all end alike. While a Join is attached, every
/// backward first all-reduces how many ranks are still training: one small all-reduce per step.
///
///   Join join(ddp);
///   for (auto& [x, y] : my_batches) { ...forward, backward, step... }
///   join.finish();
class Join {
 public:
  /// Attaches to ddp (not with autotune, whose timing all-reduces a finished rank could not match).
  explicit Join(DistributedDataParallel& ddp, const JoinOptions& options = {});
  /// Detaches. Call finish() first: a rank that leaves without it leaves the others waiting.
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;
  /// Shadows the other ranks' steps until all have finished, then syncs the final model. Collective.
  void finish();
  /// Steps this rank shadowed in finish().
  int64_t shadowed_steps() const { return shadowed_; }
  const JoinOptions& options() const { return options_; }

 private:
  friend class DistributedDataParallel;
  int count_active(bool active);
  DistributedDataParallel& ddp_;
  JoinOptions options_;
  int64_t shadowed_ = 0;
  bool finished_ = false;
};

/// BatchNorm whose batch statistics are those of the whole global batch: the per-rank sums are
/// all-reduced in forward, and autograd all-reduces their gradients in backward. Same parameters,
/// buffers and names as BatchNorm1d/2d; on a world of one it is BatchNorm.
class SyncBatchNorm : public nn::Module {
 public:
  SyncBatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                ProcessGroupPtr group = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  int64_t num_features_;
  double eps_, momentum_;
  bool affine_;
  ProcessGroupPtr group_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

/// Replaces every BatchNorm1d/2d under module with a SyncBatchNorm holding the same tensors (as
/// torch.nn.SyncBatchNorm.convert_sync_batchnorm); returns the number replaced.
int convert_sync_batchnorm(nn::Module& module, ProcessGroupPtr group = nullptr);

}  // namespace braid::distributed
