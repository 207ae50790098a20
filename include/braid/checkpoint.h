// Checkpoints: one file holding everything a training run needs to resume bitwise (model and
// optimizer tensors, learning-rate schedule, RNG state, epoch, step, data loader position) as
// named tensors, numbers and strings, with a format version and a CRC32. Files are written to a
// temporary name, synced and renamed, so a crash mid-write leaves the previous checkpoint intact.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "braid/ops.h"
#include "braid/tensor.h"

namespace braid {

class Generator;
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
class LRScheduler;
class GradScaler;
}  // namespace optim
namespace data {
class DataLoader;
}

/// What a checkpoint file holds. Names are free-form; the helpers below use dotted prefixes
/// ("model.fc1.weight", "optim.state.0.exp_avg", "rng.seed"). integers hold 64-bit values exactly
/// (seeds, counters, positions), scalars hold doubles (learning rates).
struct Checkpoint {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
  std::map<std::string, int64_t> integers;
  std::map<std::string, std::string> strings;
  /// The file it was loaded from (empty for one built in memory); errors name it.
  std::string source;

  /// The entry of that name; throws IndexError naming the checkpoint and the name, with the known
  /// names that share its first dotted component.
  const Tensor& tensor(const std::string& name) const;
  double scalar(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  const std::string& string(const std::string& name) const;
};

/// Writes ckpt to path atomically: path + ".tmp-<pid>", fsync, rename, fsync of the directory.
/// Throws Error naming path when anything fails; the temporary file is removed then.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);
/// Reads and validates the whole file (magic, version, sizes, CRC32) before returning; every
/// problem throws Error naming path. Tensors are placed on map_location (as torch.load's); a module's
/// load_state_dict copies them onto whatever device its parameters live on.
Checkpoint load_checkpoint(const std::string& path, Device map_location = BRAID_IMPLICIT_DEVICE);

// Helpers that put an object's state under a prefix and restore it. Each restore checks the
// checkpoint against the object first and throws (naming the checkpoint's file and the first
// mismatching entry) before changing anything, so a failed restore leaves the object as it was.

/// The module's state dict: tensors prefix + name (copied, so later training does not change ckpt).
void store_state(Checkpoint& ckpt, const std::string& prefix, const nn::Module& module);
/// Loads exactly the module's parameters and buffers: a missing or unexpected name, or another
/// shape or dtype, throws ValueError naming the entry.
void restore_state(const Checkpoint& ckpt, const std::string& prefix, nn::Module& module);
/// The optimizer's state dict (Note [Optimizer state format]): tensors and scalars under prefix.
void store_state(Checkpoint& ckpt, const std::string& prefix, const optim::Optimizer& optimizer);
void restore_state(const Checkpoint& ckpt, const std::string& prefix, optim::Optimizer& optimizer);
/// The scheduler's state dict as scalars under prefix.
void store_state(Checkpoint& ckpt, const std::string& prefix, const optim::LRScheduler& scheduler);
void restore_state(const Checkpoint& ckpt, const std::string& prefix, optim::LRScheduler& scheduler);
/// The loss scaler's state dict as scalars under prefix (nothing for a disabled scaler).
void store_state(Checkpoint& ckpt, const std::string& prefix, const optim::GradScaler& scaler);
void restore_state(const Checkpoint& ckpt, const std::string& prefix, optim::GradScaler& scaler);
/// Integers prefix + "seed" and prefix + "offset" (the whole state of a Philox generator).
void store_state(Checkpoint& ckpt, const std::string& prefix, const Generator& generator);
void restore_state(const Checkpoint& ckpt, const std::string& prefix, Generator& generator);
/// Integers prefix + "epoch" and prefix + "batch"; restoring seeks the loader there.
void store_state(Checkpoint& ckpt, const std::string& prefix, const data::DataLoader& loader);
void restore_state(const Checkpoint& ckpt, const std::string& prefix, data::DataLoader& loader);

}  // namespace braid
