// braid-train's --compress: how DistributedDataParallel's gradient buckets travel (comm_hooks.h).
#pragma once

#include <string>

#include "braid/distributed.h"

namespace braid::zoo {

struct Compression {
  distributed::WireDType wire = distributed::WireDType::Native;
  distributed::CommHookPtr hook;  ///< null: the all-reduce
  /// DGC keeps the momentum in the hook: the optimizer must then be SGD without momentum.
  bool momentum_in_hook = false;
  std::string description = "none (the all-reduce)";
};

/// "none", "fp16", "bf16" (the all-reduce with that dtype on the wire), "topk:RATIO" (top-K with
/// error feedback), "dgc:RATIO" (top-K with DGC's momentum correction 0.9, local clipping at norm
/// 5 and warm-up over warmup_steps) or "powersgd:RANK" (PowerSGD from step warmup_steps on).
/// A spec it cannot read is a ValueError listing the forms.
Compression parse_compression(const std::string& spec, int64_t warmup_steps);

}  // namespace braid::zoo
