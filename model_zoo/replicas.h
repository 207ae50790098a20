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

class Replicas {
 public:
  /// Collective over group. zero_stage 0 uses options and compression; 1 to 3 shard (buckets of
  /// options.bucket_cap_mb), and refuse a compression hook.
  Replicas(std::shared_ptr<nn::Module> model, int zero_stage, distributed::ProcessGroupPtr group,
           const distributed::DataParallelOptions& options, const Compression& compression,
           const distributed::OptimizerFactory& make_optimizer);
  ~Replicas();

  Tensor forward(const Tensor& x);
  void zero_grad();
  /// The optimizer's step through scaler (a disabled scaler is the plain step); sharded runs step
  /// their shard and all-gather (no loss scaling there).
  void step(optim::GradScaler& scaler);
  optim::Optimizer& optimizer() { return *optimizer_; }
  int zero_stage() const { return zero_stage_; }
  /// The bucket autotune's report (empty while it runs, and for sharded runs).
  std::string autotune_report() const;

  /// The model's and optimizer's state under "model." and "optim." as store_state writes them for
  /// an unsharded model: on every rank at stage 0; at stages 1 to 3 every rank writes its shard to
  /// shard_path (save_sharded_checkpoint) and rank 0 alone returns them joined. Collective.
  Checkpoint model_state(const std::string& shard_path);
  /// Loads model_state()'s format (from any stage and world size).
  void restore(const Checkpoint& ckpt);
  /// Stage 3: gathers the parameters back into the model for good (collective); a no-op otherwise.
  void finish();

 private:
  std::shared_ptr<nn::Module> model_;
  int zero_stage_;
  distributed::ProcessGroupPtr group_;
  std::unique_ptr<distributed::DistributedDataParallel> ddp_;
  std::unique_ptr<distributed::ShardedDataParallel> sdp_;
  std::shared_ptr<optim::Optimizer> optimizer_;
};

}  // namespace braid::zoo
