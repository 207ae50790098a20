// braid-train's data dimension: DistributedDataParallel (--zero-stage 0, with --compress's hook) or
// ShardedDataParallel (ZeRO stages 1 to 3) and the optimizer, behind one interface, with checkpoints
// in the unsharded format either way (Note [Checkpoints of a sharded run] in replicas.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "braid/checkpoint.h"
#include "braid/distributed.h"
#include "braid/optim.h"
#include "compress.h"

namespace braid::zoo {

struct ReplicaOptions {
  /// 0: DistributedDataParallel with data_parallel and compression; 1 to 3: ShardedDataParallel.
  int zero_stage = 0;
  distributed::DataParallelOptions data_parallel;
  Compression compression;
  /// --local-sgd H: each rank steps its own optimizer and LocalSGD averages every H steps (0: the
  /// automatic period); -1: off.
  int64_t local_sgd = -1;
  distributed::LocalSGDOptions local;
};

class Replicas {
 public:
  /// Collective over group. Sharding and local SGD refuse a compression hook.
  Replicas(std::shared_ptr<nn::Module> model, distributed::ProcessGroupPtr group, const ReplicaOptions& options,
           const distributed::OptimizerFactory& make_optimizer);
  ~Replicas();

  Tensor forward(const Tensor& x);
  void zero_grad();
  /// The optimizer's step through scaler (a disabled scaler is the plain step); sharded runs step
  /// their shard and all-gather (no loss scaling there).
  void step(optim::GradScaler& scaler);
  /// Local SGD: averages the replicas now if they stepped since the last sync (collective), so that
  /// what is evaluated, checkpointed and exported is the averaged model; nothing otherwise.
  void sync_now();
  optim::Optimizer& optimizer() { return *optimizer_; }
  int zero_stage() const { return zero_stage_; }
  /// What travels between the replicas, in a line.
  std::string describe() const;
  /// The bucket autotune's report (empty while it runs, and for sharded runs).
  std::string autotune_report() const;

  /// The model's and optimizer's state under "model." and "optim." as store_state writes them for
  /// an unsharded model: on every rank at stage 0; at stages 1 to 3 every rank writes its shard to
  /// shard_path (save_sharded_checkpoint) and rank 0 alone returns them joined. With local SGD the
  /// parameters are the last synchronised ones and LocalSGD's state is under "localsgd."
  /// (Note [Local SGD checkpoints]). run (the run's step, schedule, RNG and loader position) goes
  /// into every rank's shard file, so that the shards alone resume the run, and into the result.
  /// Collective.
  Checkpoint model_state(const std::string& shard_path, const Checkpoint& run = {});
  /// Loads model_state()'s format (from any stage and world size).
  void restore(const Checkpoint& ckpt);
  /// Stage 3: gathers the parameters back into the model for good (collective); a no-op otherwise.
  void finish();

 private:
  std::shared_ptr<nn::Module> model_;
  int zero_stage_;
  bool hooked_ = false;  // a compression hook whose state each rank checkpoints itself
  distributed::ProcessGroupPtr group_;
  std::unique_ptr<distributed::DistributedDataParallel> ddp_;
  std::unique_ptr<distributed::ShardedDataParallel> sdp_;
  std::unique_ptr<distributed::LocalSGD> local_;
  std::shared_ptr<optim::Optimizer> optimizer_;
};

/// What --resume reads (Note [Resuming from a sharded run] in replicas.cpp): a checkpoint file
/// (checkpoint.braid, of any stage), a sharded run's manifest (checkpoint.shards; its rank files are
/// joined), or an output folder, where the newer of the two by step is taken. used: the file read.
Checkpoint load_run_checkpoint(const std::string& path, Device device, std::string* used = nullptr);
/// After an unsharded run has written checkpoint.braid in folder: removes a sharded run's manifest
/// and rank files left there, which would otherwise compete with it on a folder --resume.
void remove_stale_shards(const std::string& folder);

}  // namespace braid::zoo
