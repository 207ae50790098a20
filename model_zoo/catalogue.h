// The model zoo's catalogue: every model a user can start from, how to build it or where its
// pretrained weights come from, what input it takes and how to prepare that input. `braid-zoo list`
// prints it.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "braid/nn/nn.h"

namespace braid::zoo {

struct ZooEntry {
  std::string name;
  std::string description;    ///< one line
  std::string input;          ///< e.g. "(N, 1, 28, 28) float32"
  std::string preprocessing;  ///< what to do to raw data first
  /// A builder of the architecture with fresh weights, or empty for an entry that exists only as
  /// a pretrained ONNX file.
  std::function<nn::ModulePtr()> build;
  /// An input of the right shape and dtype for one example (batch 2), to check a built model with.
  std::function<Tensor()> example;
  /// The pretrained source: the model cache's name (scripts/setup_pretrained.sh) and the package that
  /// ships it; empty when there is none.
  std::string pretrained, pretrained_package;
};

/// Every entry, in the order braid-zoo lists them.
const std::vector<ZooEntry>& catalogue();
/// The entry of that name; ValueError listing the names otherwise.
const ZooEntry& zoo_entry(const std::string& name);
/// Where scripts/setup_pretrained.sh puts a pretrained model: $BRAID_MODEL_CACHE (default
/// ~/.cache/braid/models)/<name>/model.onnx.
std::string pretrained_path(const std::string& name);
/// The catalogue as a table: name, parameters (built, or counted in the cached file), input,
/// pretrained source, description; then each entry's preprocessing.
void print_catalogue(std::ostream& out);

}  // namespace braid::zoo
