// Automatic partitioning of a sequential model into pipeline stages, as PipeDream does it: a
// profiling run on one process measures every layer's forward and backward time and its activation
// and parameter memory, and a dynamic program chooses the cuts that minimise the slowest stage,
// counting the time to send activations (and their gradients) across each cut, under an optional
// per-stage memory limit. Manual cut points override it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "braid/nn/module.h"

namespace braid::distributed {

struct LayerProfile {
  std::string name;
  double forward_seconds = 0, backward_seconds = 0;
  /// What a cut after this layer sends: its output and the skip tensors stashed before it and used
  /// after it (skip.h).
  int64_t output_bytes = 0;
  int64_t parameter_bytes = 0;
};

/// Times each child of model on sample_input (one micro-batch), median of repeats runs after one
/// warm-up. Children run in order, each on the previous one's output, as Sequential does.
std::vector<LayerProfile> profile_layers(nn::Sequential& model, const Tensor& sample_input, int repeats = 5);

struct PartitionOptions {
  /// Bytes per second between neighbouring stages; 0 ignores communication.
  double bandwidth = 5e9;
  /// Per-stage memory limit in bytes (parameters x 4 for weights, gradients and two optimizer
  /// states, plus activations x micro_batches_in_flight); 0: no limit.
  int64_t memory_limit = 0;
  int micro_batches_in_flight = 1;
  /// Manual plan: the index of the first layer of stages 1..K-1. Empty: choose automatically.
  std::vector<int> cuts;
};

struct PartitionPlan {
  std::vector<int> first_layer;  ///< first layer index of each stage (stage 0 starts at 0)
  std::vector<double> stage_seconds;  ///< predicted forward + backward + transfer time per stage
  std::vector<int64_t> stage_bytes;   ///< predicted memory per stage
  double bottleneck_seconds = 0;
  /// One line per stage: layers, predicted time and memory.
  std::string str(const std::vector<LayerProfile>& layers) const;
};

/// The cuts into stages (every stage gets at least one layer) that minimise the slowest stage.
/// Throws ValueError when the limit cannot be met, naming the smallest memory any plan needs.
PartitionPlan partition(const std::vector<LayerProfile>& layers, int stages, const PartitionOptions& options = {});

/// Layers [begin, end) of model as a Sequential that shares them, under their names in model
/// ("3.weight" stays "3.weight"), so that state dicts of a stage match the whole model's.
std::shared_ptr<nn::Sequential> slice_layers(const nn::Sequential& model, int begin, int end);

/// Stage s of plan, as slice_layers.
std::shared_ptr<nn::Sequential> stage_layers(const nn::Sequential& model, const PartitionPlan& plan, int stage);

}  // namespace braid::distributed
