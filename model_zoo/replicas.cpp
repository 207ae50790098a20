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
//
// Note [Resuming from a sharded run]
// Every rank's shard file also carries the run's state (step, schedule, RNG, loader position and
// --zero-stage; unshard() keeps the first shard's), so the shards alone resume the run: --resume
// takes their manifest (checkpoint.shards) as it takes checkpoint.braid, joining the rank files of
// any number of ranks on every rank. They matter when a job dies between the two writes: the
// shards are then a step ahead of checkpoint.braid, and a --resume of the output folder (what
// model_zoo/slurm/train.sbatch passes) takes whichever of the two is at the later step. An
// unsharded run's checkpoint.braid is the newest state of its folder, so after writing it rank 0
// removes a sharded run's manifest and files left there (remove_stale_shards), and a folder never
// holds shards newer than its run.
#include "replicas.h"

#include <cstdio>
#include <filesystem>

namespace braid::zoo {

using namespace distributed;
namespace fs = std::filesystem;

namespace {

void merge_into(Checkpoint& ck, const Checkpoint& run) {
  for (const auto& [k, t] : run.tensors) ck.tensors[k] = t;
  for (const auto& [k, v] : run.scalars) ck.scalars[k] = v;
  for (const auto& [k, v] : run.integers) ck.integers[k] = v;
  for (const auto& [k, v] : run.strings) ck.strings[k] = v;
}

bool is_manifest(const Checkpoint& c) {
  return c.tensors.empty() && c.integers.count("generation") && c.integers.count("ranks") && c.strings.count("file.0");
}

/// A checkpoint file, or a sharded run's manifest with its rank files joined.
Checkpoint read_run_checkpoint(const std::string& path, Device device) {
  Checkpoint c = load_checkpoint(path, device);
  if (!is_manifest(c)) return c;
  std::vector<Checkpoint> shards = load_sharded_checkpoint(path);
  BRAID_CHECK(shards[0].integers.count("step"), "braid-train: --resume ", path, ": these shards carry no run state ",
              "(step, loader position), as an older braid-train wrote them; resume from checkpoint.braid");
  Checkpoint full = ShardedDataParallel::unshard(shards);
  for (auto& [k, t] : full.tensors) t = t.to(device);
  full.source = path;
  return full;
}

}  // namespace

Checkpoint load_run_checkpoint(const std::string& path, Device device, std::string* used) {
  std::string chosen = path;
  if (fs::is_directory(path)) {
    const std::string plain = (fs::path(path) / "checkpoint.braid").string();
    const std::string sharded = (fs::path(path) / "checkpoint.shards").string();
    const bool has_plain = fs::exists(plain), has_sharded = fs::exists(sharded);
    BRAID_CHECK(has_plain || has_sharded, "braid-train: --resume ", path, ": the folder holds no checkpoint.braid and ",
                "no checkpoint.shards (a sharded run's manifest)");
    chosen = has_plain ? plain : sharded;
    if (has_plain && has_sharded) {
      Checkpoint a = read_run_checkpoint(plain, device), b = read_run_checkpoint(sharded, device);
      const bool newer = b.integer("step") > a.integer("step");  // Note [Resuming from a sharded run]
      if (used) *used = newer ? sharded : plain;
      return newer ? b : a;
    }
  }
  if (used) *used = chosen;
  return read_run_checkpoint(chosen, device);
}

void remove_stale_shards(const std::string& folder) {
  const fs::path manifest = fs::path(folder) / "checkpoint.shards";
  std::error_code ec;
  if (!fs::exists(manifest, ec)) return;
  Checkpoint m;
  try {
    m = load_checkpoint(manifest.string());
  } catch (const Error&) {
    return;  // not a manifest that braid-train wrote: left alone
  }
  if (!is_manifest(m)) return;
  fs::remove(manifest, ec);  // first, so that no manifest names a removed file
  for (int64_t r = 0; r < m.integer("ranks"); ++r) fs::remove(fs::path(folder) / m.string("file." + std::to_string(r)), ec);
}

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
    if (compression.hook) ddp_->register_comm_hook(compression.hook), hooked_ = true;
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

// Note [Hook state in checkpoints]
// A compression hook's state (top-K's residual and DGC's velocity, PowerSGD's error and Q) is each
// rank's own, so rank 0's checkpoint cannot hold it: every rank writes its own next to the
// checkpoint, checkpoint.hook.rank<r>.braid (atomically, as every checkpoint), with the step and
// the world size. A resume at the same world size whose files carry the checkpoint's step restores
// them, and continues bit for bit; otherwise (other world size, a file missing or a step apart,
// as after a crash between the writes) error feedback starts from zero, and rank 0 says why. The
// hooks' step counter (DGC's warm-up, PowerSGD's start) continues from the checkpoint's step.
namespace {
std::string hook_file(const std::filesystem::path& folder, int rank) {
  return (folder / detail::cat("checkpoint.hook.rank", rank, ".braid")).string();
}
}  // namespace

Checkpoint Replicas::model_state(const std::string& shard_path, const Checkpoint& run) {
  Checkpoint ck;
  if (hooked_) {
    Checkpoint mine;
    ddp_->comm_hook().store(mine, "hook.");
    mine.integers["step"] = run.integers.count("step") ? run.integers.at("step") : ddp_->steps();
    mine.integers["ranks"] = group_->size();
    save_checkpoint(hook_file(std::filesystem::path(shard_path).parent_path(), group_->rank()), mine);
  }
  if (!sdp_) {
    store_state(ck, "model.", *model_);
    store_state(ck, "optim.", *optimizer_);
    if (local_) {
      local_->store(ck, "localsgd.");
      // The parameters LocalSGD averages, by name (frozen ones are not among them).
      for (size_t i = 0; i < local_->names().size(); ++i)
        ck.tensors["model." + local_->names()[i]] = local_->anchor()[i].clone();
    }
    merge_into(ck, run);
    return ck;
  }
  Checkpoint mine = sdp_->state_shard();
  merge_into(mine, run);  // Note [Resuming from a sharded run]
  save_sharded_checkpoint(shard_path, mine, group_);
  if (group_->rank() != 0) return ck;
  return ShardedDataParallel::unshard(load_sharded_checkpoint(shard_path));
}

void Replicas::restore(const Checkpoint& ckpt) {
  if (sdp_) return sdp_->load_full(ckpt);
  restore_state(ckpt, "model.", *model_);
  restore_state(ckpt, "optim.", *optimizer_);
  if (hooked_ && ckpt.integers.count("step")) {  // Note [Hook state in checkpoints]
    const int64_t step = ckpt.integers.at("step");
    ddp_->set_steps(step);
    const std::string path = hook_file(std::filesystem::path(ckpt.source).parent_path(), group_->rank());
    std::string why;
    if (!std::filesystem::exists(path)) why = detail::cat("no ", path);
    else {
      Checkpoint mine = load_checkpoint(path);
      if (mine.integer("ranks") != group_->size())
        why = detail::cat("it was written by ", mine.integer("ranks"), " ranks, this run has ", group_->size());
      else if (mine.integer("step") != step)
        why = detail::cat(path, " is of step ", mine.integer("step"), ", the checkpoint of step ", step);
      else ddp_->comm_hook().restore(mine, "hook.");
    }
    // Every rank decides alike except for a missing or stale file of its own; any rank's reason
    // makes every rank start from zero, so that the ranks' states stay consistent.
    Tensor bad = full({1}, why.empty() ? 0.0 : 1.0, kFloat64, Device::cpu());
    group_->all_reduce(bad, ReduceOp::Max);
    if (bad.item() > 0) {
      Checkpoint none;
      ddp_->comm_hook().restore(none, "hook.");
      if (group_->rank() == 0)
        std::printf("braid-train: %s's error feedback starts from zero: %s\n", ddp_->comm_hook().name().c_str(),
                    why.empty() ? "another rank's hook state is missing or of another step" : why.c_str());
    }
  }
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
