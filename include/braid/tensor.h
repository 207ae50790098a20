// Tensor: a cheap value handle over shared storage with a shape, strides (in elements) and an
// offset. Copying a Tensor copies the handle, not the data. Views (reshape, permute, narrow,
// expand, ...) share storage. The tensor core knows nothing of autograd beyond holding an opaque
// pointer that the autograd layer fills.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "braid/dtype.h"
#include "braid/error.h"
#include "braid/storage.h"

namespace braid {

namespace detail {
struct AutogradMeta;  // defined by the autograd layer
struct Half {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::Int64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::Int32;
  else if constexpr (std::is_same_v<T, bool>) return DType::Bool;
  else if constexpr (std::is_same_v<T, Half>) return DType::Float16;
  else if constexpr (std::is_same_v<T, BFloat16>) return DType::BFloat16;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::Int8;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::UInt8;
  else static_assert(sizeof(T) == 0, "unsupported element type");
}
}  // namespace detail

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  std::shared_ptr<detail::AutogradMeta> autograd;
};

/// An n-dimensional array. A default-constructed Tensor is undefined (holds nothing).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t numel() const;
  /// Size along axis (negative counts from the end).
  int64_t size(int64_t axis) const;
  int64_t element_size() const { return dtype_size(dtype()); }
  bool is_contiguous() const;
  /// A 4-d tensor (N, C, H, W) whose elements lie in memory as (N, H, W, C), densely: PyTorch's
  /// channels_last memory format (Note [Channels-last activations in inference]).
  bool is_channels_last() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  /// True when both handles refer to the same tensor object.
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  /// Pointer to the first element (offset applied); TypeError for a tensor whose memory the host
  /// cannot read (not on the CPU): copy it with cpu() first.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    BRAID_CHECK_T(TypeError, detail::dtype_of<T>() == dtype(), "data<", dtype_name(detail::dtype_of<T>()),
                  ">: tensor has dtype ", dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  /// Address of the first element (offset applied) in the tensor's device memory, as an integer
  /// (PyTorch's data_ptr): what NumPy's array interface and DLPack hand to other libraries.
  uintptr_t data_ptr() const;
  /// The single element of a one-element tensor, converted to double (copied from its device).
  double item() const;
  /// All elements in row-major order, converted to T (copied from its device).
  template <typename T>
  std::vector<T> to_vector() const;
  std::string to_string() const;

  // ---- views (share storage) ----
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor view(const Shape& shape) const;     // always a view; throws if strides do not allow it
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor transpose(int64_t a, int64_t b) const;
  /// Transpose of the last two axes.
  Tensor mT() const;
  Tensor narrow(int64_t axis, int64_t start, int64_t length) const;
  Tensor slice(int64_t axis, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t axis, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t axis) const;
  Tensor unsqueeze(int64_t axis) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  /// A copy on device (this tensor itself when it is there already); gradients flow back to this
  /// tensor's device.
  Tensor to(Device device) const;
  Tensor cpu() const;
  Tensor cuda(int index = 0) const;

  // ---- reductions and common ops as methods (see ops.h) ----
  Tensor sum(const std::vector<int64_t>& dim = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dim = {}, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;

  // ---- in-place (refused on tensors that autograd tracks while grad mode is on) ----
  Tensor& fill_(double value);
  Tensor& zero_();
  /// Copies src (broadcast to this shape, cast to this dtype) into this tensor, from any device.
  Tensor& copy_(const Tensor& src);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double value);

  // ---- autograd (implemented by the autograd layer) ----
  bool requires_grad() const;
  /// Marks a floating-point leaf as needing a gradient.
  Tensor& set_requires_grad(bool value = true);
  bool is_leaf() const;
  /// The accumulated gradient, or an undefined tensor.
  Tensor grad() const;
  void set_grad(const Tensor& g);
  /// Keeps the gradient of a non-leaf tensor after backward.
  void retain_grad();
  /// Name of the op that produced this tensor ("" for leaves).
  std::string grad_fn_name() const;
  /// Back-propagates from this tensor. A non-scalar needs an explicit gradient.
  void backward(const Tensor& gradient = braid::Tensor(), bool retain_graph = false) const;
  /// Same storage, cut off from the graph.
  Tensor detach() const;

  TensorImpl& impl() const {
    BRAID_CHECK(impl_ != nullptr, "operation on an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// Row-major strides for shape.
Shape contiguous_strides(const Shape& shape);

}  // namespace braid
