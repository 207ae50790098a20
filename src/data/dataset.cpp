// Dataset's default batching (stack the examples) and TensorDataset, whose batches are one
// index_select per tensor.
#include "braid/data/dataset.h"

#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid::data {

Example Dataset::get_batch(const std::vector<int64_t>& indices) const {
  if (indices.empty()) {
    BRAID_CHECK_T(IndexError, size() > 0, "Dataset::get_batch: the dataset is empty");
    Example first = get(0);
    return {first.input.unsqueeze(0).narrow(0, 0, 0).contiguous(),
            first.target.unsqueeze(0).narrow(0, 0, 0).contiguous()};
  }
  std::vector<Tensor> inputs, targets;
  inputs.reserve(indices.size());
  targets.reserve(indices.size());
  for (int64_t i : indices) {
    Example e = get(i);
    inputs.push_back(e.input);
    targets.push_back(e.target);
  }
  return {stack(inputs, 0), stack(targets, 0)};
}

TensorDataset::TensorDataset(Tensor inputs, Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  BRAID_CHECK(inputs_.defined() && targets_.defined(), "TensorDataset: inputs and targets must be defined");
  BRAID_CHECK(inputs_.dim() >= 1 && targets_.dim() >= 1 && inputs_.size(0) == targets_.size(0),
              "TensorDataset: inputs ", shape_str(inputs_.shape()), " and targets ", shape_str(targets_.shape()),
              " must have the same first axis");
}

Example TensorDataset::get(int64_t index) const {
  BRAID_CHECK_T(IndexError, index >= 0 && index < size(), "TensorDataset::get: index ", index,
                " out of range for ", size(), " examples");
  return {inputs_.select(0, index), targets_.select(0, index)};
}

Example TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  NoGradGuard no_grad;  // a batch is data, even when the dataset's tensors require grad
  Tensor idx = tensor(indices, {static_cast<int64_t>(indices.size())}, inputs_.device());
  return {index_select(inputs_, 0, idx), index_select(targets_, 0, idx.to(targets_.device()))};
}

}  // namespace braid::data
