// Datasets: indexed collections of (input, target) examples that a DataLoader batches. A dataset
// that holds whole tensors (TensorDataset) gathers a batch with one index_select per tensor; any
// other dataset gets batching for free by stacking its examples.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/tensor.h"

namespace braid::data {

/// One example, or a batch of examples stacked along a new leading axis.
struct Example {
  Tensor input;
  Tensor target;
};

/// The interface a DataLoader reads. get() and get_batch() are const and may be called from the
/// loader's background thread (one call at a time per loader), so they must not touch state that
/// the training thread changes.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// Example index, 0 <= index < size().
  virtual Example get(int64_t index) const = 0;
  /// The examples at indices stacked along a new axis 0, in the order given. The default calls
  /// get() once per index; an empty list gives tensors with a leading axis of 0 (shaped like
  /// example 0).
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
};

/// Examples are the rows of two tensors that share their first axis: inputs (N, ...) and targets
/// (N, ...). get() returns views; get_batch() copies with one index_select per tensor.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

}  // namespace braid::data
