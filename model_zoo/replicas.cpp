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

Replicas::Replicas(std::shared_ptr<nn::Module> model, ProcessGroupPtr group, const ReplicaOptions& options,
                   const OptimizerFactory& make_optimizer)
    : model_(std::move(model)), zero_stage_(options.zero_stage), group_(group ? std::move(group) : world()) {
  const Compression& compression = options.compression;
  BRAID_CHECK(zero_stage_ >= 0 && zero_stage_ <= 3, "braid-train: --zero-stage must be 0, 1, 2 or 3, got ",
              zero_stage_);
  const bool plain = !compression.hook && compression.wire == WireDType::Native && !options.data_parallel.autotune;
  if (options.local_sgd >= 0) {
    BRAID_CHECK(zero_stage_ == 0 && plain, "braid-train: --local-sgd averages parameters every H steps: it takes no ",
                "--zero-stage, --compress (", compression.description, ") or --autotune-buckets");
    LocalSGDOptions o = options.local;
    o.period = options.local_sgd;
    local_ = std::make_unique<LocalSGD>(model_, group_, o);
    optimizer_ = make_optimizer(model_->parameters());
    return;
  }
  if (zero_stage_ == 0) {
    DataParallelOptions o = options.data_parallel;
    o.wire_dtype = compression.wire;
    ddp_ = std::make_unique<DistributedDataParallel>(model_, group_, o);
    if (compression.hook) ddp_->register_comm_hook(compression.hook);
    optimizer_ = make_optimizer(model_->parameters());
    return;
  }
  BRAID_CHECK(plain, "braid-train: --zero-stage ", zero_stage_, " reduce-scatters its own buckets: it takes no ",
              "--compress (", compression.description, ") or --autotune-buckets");
  sdp_ = std::make_unique<ShardedDataParallel>(
      model_, make_optimizer, group_,
      ShardedOptions{.stage = zero_stage_, .bucket_cap_mb = options.data_parallel.bucket_cap_mb});
  optimizer_ = std::shared_ptr<optim::Optimizer>(std::shared_ptr<void>(), &sdp_->optimizer());
}

std::string Replicas::describe() const {
  if (local_)
    return local_->options().period == 0
               ? detail::cat("local SGD: parameters averaged at an automatic period (outer ", local_->options().outer,
                             ", rate ", local_->options().outer_lr, ")")
               : detail::cat("local SGD: parameters averaged every ", local_->period(), " steps (outer ",
                             local_->options().outer, ", rate ", local_->options().outer_lr, ")");
  if (sdp_) return detail::cat("ZeRO stage ", zero_stage_, ": gradients reduce-scattered, parameters all-gathered");
  return ddp_->comm_hook().name();
}

Replicas::~Replicas() = default;

Tensor Replicas::forward(const Tensor& x) { return ddp_ ? (*ddp_)(x) : sdp_ ? (*sdp_)(x) : model_->forward(x); }

void Replicas::zero_grad() {
  if (sdp_) sdp_->zero_grad();
  else optimizer_->zero_grad();
}

void Replicas::step(optim::GradScaler& scaler) {
  if (!sdp_) {
    scaler.step(*optimizer_);
    if (local_) local_->step();
    return;
  }
  BRAID_CHECK(!scaler.is_enabled(), "braid-train: --zero-stage ", zero_stage_,
              " steps the optimizer on its shard, where loss scaling is not done yet; use --amp bf16 or off");
  sdp_->step();
}

void Replicas::sync_now() {
  if (local_) local_->sync_now();
}

std::string Replicas::autotune_report() const { return ddp_ ? ddp_->autotune_report() : std::string(); }

Checkpoint Replicas::model_state(const std::string& shard_path) {
  Checkpoint ck;
  if (!sdp_) {
    store_state(ck, "model.", *model_);
    store_state(ck, "optim.", *optimizer_);
    if (local_) {
      local_->store(ck, "localsgd.");
      // The parameters LocalSGD averages, by name (frozen ones are not among them).
      for (size_t i = 0; i < local_->names().size(); ++i)
        ck.tensors["model." + local_->names()[i]] = local_->anchor()[i].clone();
    }
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
  if (!local_) return;
  if (ckpt.integers.count("localsgd.period")) return local_->restore(ckpt, "localsgd.");
  // A checkpoint of another kind of run: its parameters become the synchronised ones.
  Checkpoint start;
  local_->store(start, "localsgd.");
  for (auto& [name, t] : start.tensors)
    t = name.rfind("localsgd.anchor.", 0) == 0 ? ckpt.tensors.at("model." + name.substr(16)).clone() : zeros_like(t);
  local_->restore(start, "localsgd.");
}

void Replicas::finish() {
  if (!sdp_) return;
  optimizer_.reset();
  sdp_.reset();
}

}  // namespace braid::zoo
