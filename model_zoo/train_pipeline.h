// braid-train's pipeline mode (--pipeline-stages K): the model is profiled on rank 0, cut into K
// stages (K x V pieces for an interleaved schedule of V chunks) by the partitioner, and trained
// over micro-batches with 1F1B or the schedule --schedule names; with more ranks than K the stages
// are also replicated data-parallel (a D x K grid).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "braid/data.h"

namespace braid::zoo {

struct PipelineRun {
  std::string model, optimizer, out;
  /// An earlier run's output folder, or one of its checkpoint.stage<s>.braid files: with the same
  /// number of stages every stage continues from its own file, with the earlier run's cuts; with
  /// another number the files are merged and cut again (Note [Resuming with another stage count]).
  std::string resume;
  int64_t epochs = 3, batch_size = 64, stages = 2, micro_batches = 4;
  /// make_schedule's name: "1f1b", "gpipe", "zb-h1" or "interleaved" (with `chunks` model chunks
  /// per stage: the model is cut into stages x chunks pieces).
  std::string schedule = "1f1b";
  int64_t chunks = 2;
  int64_t stop_after = 0;  ///< epochs to run in this invocation (0: to the end)
  int64_t stop_at_step = 0;  ///< write the stage checkpoints after this global step and exit, as on preemption
  int64_t zero_stage = 0;    ///< ShardedDataParallel (1 or 2) across the replicas instead of DDP
  double lr = 2e-3;
  uint64_t seed = 0;
  /// This rank's device, and "off", "bf16" or "fp16" for mixed precision.
  Device device = Device::cpu();
  std::string amp = "off";
  std::shared_ptr<data::TensorDataset> train_set, test_set;
  std::shared_ptr<const data::Transform> normalize;
};

/// Trains and evaluates; returns the process exit code. Collective over the world.
int train_pipeline(const PipelineRun& run);

}  // namespace braid::zoo
