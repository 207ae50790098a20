// Sharded data parallelism (ZeRO stages 1 and 2): every rank holds the whole model and a shard of
// each batch, as with DistributedDataParallel, but each rank keeps the optimizer's state (stage 1)
// and the averaged gradients (stage 2) of only its 1/N of the parameters. Backward reduce-scatters
// each gradient bucket as soon as it is complete, the optimizer steps this rank's shard, and the
// updated shards are all-gathered into every rank's parameters: the traffic of an all-reduce, a
// fraction of the memory. Like DistributedDataParallel it attaches to a Module's parameters, so
// model code, names and state dicts do not change.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "braid/distributed/process_group.h"
#include "braid/nn/module.h"
#include "braid/optim/optimizer.h"

namespace braid::distributed {

struct ShardedOptions {
  /// 1: the optimizer's state is sharded; 2: the averaged gradients too (the full-size gradient
  /// buffer of a bucket lives only while its reduce-scatter runs).
  int stage = 2;
  /// Gradients travel in buckets of about this many megabytes, launched as backward completes
  /// them (the buckets of DistributedDataParallel with the same cap, in the same order).
  double bucket_cap_mb = 25;
  /// Copy rank 0's buffers (BatchNorm running statistics) to every rank at construction.
  bool broadcast_buffers = true;
};

/// Makes the optimizer of this rank's shard from its parameters: one flat tensor per bucket (this
/// rank's segment of it; float32 master copies where the model is float16 or bfloat16). Any
/// braid optimizer whose update is elementwise (SGD, Adam, AdamW, RMSprop, Adagrad) steps exactly
/// as it would on the whole model.
using OptimizerFactory = std::function<std::shared_ptr<optim::Optimizer>(const std::vector<Tensor>& shard)>;

/// Bytes of model state that this rank holds (ZeRO's "model states"): parameters, gradients, and
/// the optimizer's state with any float32 master copies.
struct ModelStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t total() const { return parameters + gradients + optimizer; }
};

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

  /// Steps the optimizer on this rank's shard with the gradients averaged over the group (summed
  /// over the backward passes since zero_grad), then all-gathers the updated parameters. Collective.
  void step();
  /// Drops the shard's gradients.
  void zero_grad();

  /// What this rank holds now (the memory formulas of benchmarks/README.md count the same).
  ModelStateBytes model_state_bytes() const;
  /// The parameters' names in each bucket, in launch order (DistributedDataParallel's bucket_names).
  std::vector<std::vector<std::string>> bucket_names() const;
  /// This rank's range [begin, end) of bucket b's flat buffer.
  std::pair<int64_t, int64_t> shard_range(size_t bucket) const;

 private:
  struct Bucket;
  void on_grad_ready(size_t param);
  void launch_ready_buckets();
  void launch(size_t bucket);
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
  std::shared_ptr<optim::Optimizer> optimizer_;
};

}  // namespace braid::distributed
