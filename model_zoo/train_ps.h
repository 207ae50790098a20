// braid-train --ps S: parameter-server training (braid/distributed/parameter_server.h) of the zoo's
// image models: ranks 0 .. S-1 serve the variables, the others train on their shards of each global
// batch and push gradients after every step; --staleness s (0 synchronous, -1 asynchronous).
// --dynamic-batches 1: the workers claim micro-batches (batch / workers) of one order from the
// servers instead (Note [Claimed batches]), so a slow worker takes fewer; the first worker then
// evaluates alone, when its next batch starts a later epoch.
#pragma once

#include <memory>
#include <string>

#include "braid/data.h"

namespace braid::zoo {

struct PsRun {
  std::string model = "cnn", optimizer = "adam", out;
  int64_t epochs = 3, batch_size = 64, servers = 1, staleness = 0;
  double lr = 2e-3;
  uint64_t seed = 0;
  int slow_rank = -1, slow_ms = 0;  ///< --slow-rank: this rank sleeps slow_ms per step
  bool dynamic = false;             ///< --dynamic-batches
  int64_t stop_at_step = 0;         ///< --stop-at-step
  std::string resume;               ///< --resume: checkpoint.braid of a parameter-server run, or its folder
  Device device = Device::cpu();
  std::shared_ptr<data::TensorDataset> train_set, test_set;
  std::shared_ptr<const data::Transform> normalize;
};

/// Trains, evaluates on the workers after every epoch (log.csv with the seconds since the start),
/// prints the pushes' and pulls' bytes per step, and writes the checkpoint (Note [Parameter-server
/// checkpoints]: the first worker's checkpoint.braid with the model's "model." entries, and each
/// server's checkpoint.ps<rank>.step<N>.braid). Stops on a preemption signal or --stop-at-step and
/// resumes with --resume. Returns the exit code (kRequeueExitCode after a signal). Collective.
int train_ps(const PsRun& run);

}  // namespace braid::zoo
