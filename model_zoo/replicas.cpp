// braid-train's data dimension (replicas.h).
//
// Note [Checkpoints of a sharded run]
// braid-train's checkpoint is one file in the unsharded format (store_state's "model." and
// "optim." entries), whatever the stage, so that any run resumes from it at any world size and
// stage, DDP included, and so that evaluation and export read it as they read any other. A sharded
// run gets there through the filesystem: every rank writes its shard with save_sharded_checkpoint
// (atomic, generations), and rank 0 reads the shards back and joins them with unshard(). Rank 0
// then holds the whole model and optimizer state for a moment, which the zoo's models afford; a
// model that does not fit one rank keeps save_sharded_checkpoint's files and never joins them.
#include "replicas.h"

namespace braid::zoo {

using namespace distributed;

Replicas::Replicas(std::shared_ptr<nn::Module> model, int zero_stage, ProcessGroupPtr group,
                   const DataParallelOptions& options, const Compression& compression,
                   const OptimizerFactory& make_optimizer)
    : model_(std::move(model)), zero_stage_(zero_stage), group_(group ? std::move(group) : world()) {
  BRAID_CHECK(zero_stage >= 0 && zero_stage <= 3, "braid-train: --zero-stage must be 0, 1, 2 or 3, got ", zero_stage);
  if (zero_stage == 0) {
    DataParallelOptions o = options;
    o.wire_dtype = compression.wire;
    ddp_ = std::make_unique<DistributedDataParallel>(model_, group_, o);
    if (compression.hook) ddp_->register_comm_hook(compression.hook);
    optimizer_ = make_optimizer(model_->parameters());
    return;
  }
  BRAID_CHECK(!compression.hook && compression.wire == WireDType::Native && !options.autotune,
              "braid-train: --zero-stage ", zero_stage, " reduce-scatters its own buckets: it takes no --compress (",
              compression.description, ") or --autotune-buckets");
  sdp_ = std::make_unique<ShardedDataParallel>(
      model_, make_optimizer, group_,
      ShardedOptions{.stage = zero_stage, .bucket_cap_mb = options.bucket_cap_mb, .broadcast_buffers = true});
  optimizer_ = std::shared_ptr<optim::Optimizer>(std::shared_ptr<void>(), &sdp_->optimizer());
}

Replicas::~Replicas() = default;

Tensor Replicas::forward(const Tensor& x) { return ddp_ ? (*ddp_)(x) : (*sdp_)(x); }

void Replicas::zero_grad() {
  if (sdp_) sdp_->zero_grad();
  else optimizer_->zero_grad();
}

void Replicas::step(optim::GradScaler& scaler) {
  if (ddp_) {
    scaler.step(*optimizer_);
    return;
  }
  BRAID_CHECK(!scaler.is_enabled(), "braid-train: --zero-stage ", zero_stage_,
              " steps the optimizer on its shard, where loss scaling is not done yet; use --amp bf16 or off");
  sdp_->step();
}

std::string Replicas::autotune_report() const { return ddp_ ? ddp_->autotune_report() : std::string(); }

Checkpoint Replicas::model_state(const std::string& shard_path) {
  Checkpoint ck;
  if (ddp_) {
    store_state(ck, "model.", *model_);
    store_state(ck, "optim.", *optimizer_);
    return ck;
  }
  save_sharded_checkpoint(shard_path, sdp_->state_shard(), group_);
  if (group_->rank() != 0) return ck;
  return ShardedDataParallel::unshard(load_sharded_checkpoint(shard_path));
}

void Replicas::restore(const Checkpoint& ckpt) {
  if (sdp_) return sdp_->load_full(ckpt);
  restore_state(ckpt, "model.", *model_);
  restore_state(ckpt, "optim.", *optimizer_);
}

void Replicas::finish() {
  if (!sdp_) return;
  optimizer_.reset();
  sdp_.reset();
}

}  // namespace braid::zoo
