// Indexing by a list of items, as Python's t[...] and libtorch's Tensor::index: integers, slices,
// None (a new axis), an ellipsis, and at most one tensor of integer indices or bool mask. Basic
// items make a view; a tensor item gathers (index_select) into a new tensor. Python's __getitem__
// and __setitem__ turn their key into this list and call these functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "braid/tensor.h"

namespace braid {

/// One item of an index. Build it with the static functions (TensorIndex::slice(1, {}, 2) is 1::2).
struct TensorIndex {
  enum class Kind { Integer, Slice, NewAxis, Ellipsis, Tensor };
  Kind kind = Kind::NewAxis;
  int64_t integer = 0;
  std::optional<int64_t> start, stop, step;  // a slice's bounds, Python's defaults when empty
  braid::Tensor indices;                     // integer indices or a bool mask

  static TensorIndex integer_at(int64_t i);
  static TensorIndex slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
                           std::optional<int64_t> step = std::nullopt);
  static TensorIndex new_axis();
  static TensorIndex ellipsis();
  static TensorIndex tensor(const braid::Tensor& indices);
};

/// x[indices]. Throws IndexError for an integer out of range, too many indices, two ellipses or a
/// mask whose shape differs from the axes it covers; ValueError for a step that is not positive
/// (views have non-negative strides); NotImplementedError for more than one tensor item.
Tensor index(const Tensor& x, const std::vector<TensorIndex>& indices);

/// x[indices] = value, in place: value broadcasts to the indexed part. A single bool mask over x's
/// leading axes writes where it is true; other tensor items are NotImplementedError (use
/// scatter_add or where).
void index_put_(Tensor& x, const std::vector<TensorIndex>& indices, const Tensor& value);

}  // namespace braid
