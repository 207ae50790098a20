// Sharded data parallelism (ZeRO stages 1, 2 and 3; FSDP): every rank takes a shard of each batch,
// as with DistributedDataParallel, but keeps the optimizer's state (stage 1), the averaged
// gradients (stage 2) and the parameters (stage 3) of only its 1/N of the model. Backward
// reduce-scatters each gradient bucket as soon as it is complete and the optimizer steps this
// rank's shard; at stages 1 and 2 the updated shards are all-gathered into every rank's whole
// model, at stage 3 each unit (a layer) gathers its parameters just before its forward and again
// before its backward and frees them after. Model code does not change: stages 1 and 2 attach to
// the parameters, stage 3 puts a transparent unit module in place of each sharded layer, and names
// and state dicts stay the model's.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "braid/checkpoint.h"
#include "braid/distributed/process_group.h"
#include "braid/nn/module.h"
#include "braid/optim/optimizer.h"

namespace braid::distributed {

struct ShardedOptions {
  /// 1: the optimizer's state is sharded; 2: the averaged gradients too (the full-size gradient
  /// buffer of a bucket lives only while its reduce-scatter runs); 3: the parameters too.
  int stage = 2;
  /// Gradients travel in buckets of about this many megabytes, launched as backward completes
  /// them (the buckets of DistributedDataParallel with the same cap, in the same order).
  double bucket_cap_mb = 25;
  /// Copy rank 0's buffers (BatchNorm running statistics) to every rank at construction.
  bool broadcast_buffers = true;
  /// Stage 3: start each unit's all-gather while the unit before it computes, in forward and in
  /// backward (in the order of the previous training step).
  bool prefetch = true;
  /// Stage 3: the modules (dotted names) whose parameters are gathered and freed together; each
  /// takes the parameters under it that no unit inside it takes. Empty: the model's children that
  /// hold parameters (looking through a child that is the only one). Parameters under no unit (the
  /// model's own) stay whole, as at stage 2. A unit stands in for its module, so a layer that
  /// needs its child to be of a certain class (TransformerEncoderLayer's self_attn) cannot have
  /// that child as a unit: name the layer instead.
  std::vector<std::string> units = {};
};

/// Makes the optimizer of this rank's shard from its parameters: one flat tensor per bucket (this
/// rank's segment of it). Any braid optimizer whose update is elementwise (SGD, Adam, AdamW,
/// RMSprop, Adagrad) steps exactly as it would on the whole model; gradient clipping by global
/// norm needs the norm over every rank's shard.
using OptimizerFactory = std::function<std::shared_ptr<optim::Optimizer>(const std::vector<Tensor>& shard)>;

/// Bytes of model state that this rank holds (ZeRO's "model states"): parameters, gradients and
/// the optimizer's state.
struct ModelStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t total() const { return parameters + gradients + optimizer; }
};

class ShardedUnit;

class ShardedDataParallel {
 public:
  /// Checks that every rank built the same model, broadcasts rank 0's parameters and buffers,
  /// moves each bucket's parameters into one flat buffer (the module's tensors become views of it)
  /// and makes the shard's optimizer. Collective over group.
  ShardedDataParallel(std::shared_ptr<nn::Module> module, const OptimizerFactory& make_optimizer,
                      ProcessGroupPtr group = nullptr, const ShardedOptions& options = {});
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  Tensor forward(const Tensor& x) { return module_->forward(x); }
  Tensor operator()(const Tensor& x) { return forward(x); }
  nn::Module& module() { return *module_; }
  const ProcessGroupPtr& group() const { return group_; }
  int stage() const { return options_.stage; }
  /// The shard's optimizer (for learning-rate schedulers and its state dict).
  optim::Optimizer& optimizer() { return *optimizer_; }

  /// Stage 3 leaves each unit's parameters freed (shape [0]) outside its forward and backward, and
  /// its destructor gathers them back into the model (collectively) and takes the units out.
  ///
  /// Steps the optimizer on this rank's shard with the gradients averaged over the group (summed
  /// over the backward passes since zero_grad), then all-gathers the updated parameters. Collective.
  void step();
  /// Drops the shard's gradients.
  void zero_grad();

  /// While a NoSync guard lives, backward accumulates the parameters' gradients locally; the first
  /// backward after it reduce-scatters what was accumulated (gradient accumulation, and a
  /// pipeline's micro-batches). Stages 1 and 2 (stage 3 frees the parameters it would accumulate
  /// into: ValueError).
  class NoSync {
   public:
    explicit NoSync(ShardedDataParallel& sdp);
    ~NoSync() { sdp_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    ShardedDataParallel& sdp_;
    bool prev_;
  };
  /// Stage 3: the whole parameters and buffers by the model's names (every rank gets them; the
  /// units gather one at a time). Collective. At stages 1 and 2 it is the module's state_dict().
  nn::StateDict full_state_dict();

  // Note [Sharded checkpoints]
  // state_shard() is what this rank holds, by the model's parameter names: for each parameter
  // the piece of it in this rank's segments ("model.<name>" with "model.<name>.offset" into the
  // flattened parameter, its shape and index), the optimizer state's pieces ("optim.<name>.<state>"),
  // the optimizer's options ("optim.group.0.*") and the buffers ("buffer.<name>"). It does not
  // depend on the stage or the buckets, so unshard() can join N ranks' shards into the checkpoint
  // of an unsharded model and optimizer (store_state's "model." and "optim." entries) and
  // load_full() can cut one for any other number of ranks or stage.
  /// This rank's shard of the model and optimizer state (no communication).
  Checkpoint state_shard() const;
  /// Joins every rank's state_shard() into one checkpoint with "model.<name>" (parameters and
  /// buffers) and "optim.*" entries as store_state writes them for the model and for an optimizer
  /// over its parameters; other entries of the first shard are kept. Throws ValueError naming a
  /// parameter the shards do not cover.
  static Checkpoint unshard(const std::vector<Checkpoint>& shards);
  /// Loads a checkpoint in unshard()'s format (or store_state's, from an unsharded run): the
  /// parameters and buffers, and this rank's segments of the optimizer's state.
  void load_full(const Checkpoint& full);

  /// What this rank holds now (the memory formulas of benchmarks/README.md count the same).
  ModelStateBytes model_state_bytes() const;
  /// The parameters' names in each bucket, in launch order (DistributedDataParallel's bucket_names).
  std::vector<std::vector<std::string>> bucket_names() const;
  /// This rank's range [begin, end) of bucket b's flat buffer.
  std::pair<int64_t, int64_t> shard_range(size_t bucket) const;

  struct Bucket;  // distributed/sharded_internal.h

 private:
  friend class ShardedUnit;
  void make_buckets(const std::vector<std::vector<size_t>>& plans, const std::vector<bool>& is_unit);
  std::vector<std::vector<size_t>> plan_units(std::vector<bool>& is_unit, std::vector<std::string>& unit_paths);
  void wrap_units(const std::vector<std::string>& unit_paths);
  void gather(size_t bucket);
  void start_gather(size_t bucket);
  void prefetch(size_t bucket, bool forward);
  void learn_order();
  void release(size_t bucket);
  Tensor run_unit(size_t bucket, nn::Module& inner, const Tensor& x);
  void on_grad_ready(size_t param);
  void launch_ready_buckets();
  void launch(size_t bucket);
  void harvest(Bucket& bucket);
  void finish_backward();

  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr group_;
  ShardedOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<int> hook_ids_;
  std::vector<size_t> bucket_of_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<bool> ready_;
  size_t next_launch_ = 0;
  bool in_backward_ = false;
  bool sync_ = true;
  // Stage 3's prefetching (Note [Prefetching units]): the units in this step's forward so far, and
  // from the previous step, each unit's successor in forward and in backward.
  std::vector<size_t> forward_now_;
  std::map<size_t, size_t> next_in_forward_, next_in_backward_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> wrapped_;  // stage 3: (path, the original)
};

/// Writes every rank's checkpoint (each rank passes its own, e.g. state_shard() plus its run
/// state) as path.g<generation>.rank<r> and then, on rank 0, the manifest path naming them, each
/// file atomically: a crash at any point leaves the previous manifest and its files in place. The
/// previous generation's files are removed once the new manifest is written. Collective.
void save_sharded_checkpoint(const std::string& path, const Checkpoint& mine, const ProcessGroupPtr& group = nullptr);
/// The checkpoints of every rank that wrote path's manifest, in rank order (any number of ranks
/// may read them).
std::vector<Checkpoint> load_sharded_checkpoint(const std::string& path);

}  // namespace braid::distributed
