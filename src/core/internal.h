// Internal helpers of the tensor core shared by ops and backends: building tensors from parts and
// normalising axes. Not installed.
#pragma once

#include <string>
#include <vector>

#include "braid/tensor.h"

namespace braid::detail {

/// A tensor over storage with the given layout.
Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);
/// A new contiguous tensor; contents uninitialised.
Tensor new_tensor(const Shape& shape, DType dtype, Device device);
/// A new 4-d tensor of shape (N, C, H, W) laid out channels-last (strides H W C, 1, W C, C): what
/// new_tensor({N, H, W, C}).permute({0, 3, 1, 2}) gives, without the op; contents uninitialised.
Tensor new_channels_last(const Shape& nchw, DType dtype, Device device);
/// The address of t's first element in its device's memory, for backends (Tensor::raw_data refuses
/// memory the host cannot read).
void* device_data(const Tensor& t);
/// t on device (t itself when it is there already), contiguous when copied; not recorded.
Tensor transfer_raw(const Tensor& t, Device device);
/// A view of t with another layout over the same storage (no autograd).
Tensor as_strided(const Tensor& t, Shape shape, Shape strides, int64_t offset);
/// axis in [-ndim, ndim) -> [0, ndim); IndexError naming op otherwise, and always for a 0-d tensor.
int64_t normalize_axis(int64_t axis, int64_t ndim, const char* op);
/// As normalize_axis, but a 0-d tensor accepts axis 0 or -1 (returning 0) as one axis of size 1;
/// the caller handles that case (Note [Axes of a 0-d tensor]).
int64_t normalize_axis_or_scalar(int64_t axis, int64_t ndim, const char* op);
/// Normalised, sorted, unique axes (a 0-d tensor accepts 0 and -1 and has none); empty means all axes.
std::vector<int64_t> normalize_axes(const std::vector<int64_t>& axes, int64_t ndim, const char* op);

}  // namespace braid::detail
