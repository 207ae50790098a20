// Tensor metadata, element access and printing. Methods that are ops (views, reductions, in-place
// updates) forward to the free functions of ops.h so that autograd sees them.
#include "braid/tensor.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "backend/backend.h"
#include "braid/autograd.h"
#include "braid/ops.h"
#include "core/internal.h"

namespace braid {

namespace detail {

Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor new_tensor(const Shape& shape, DType dtype, Device device) {
  int64_t n = shape_numel(shape);
  auto storage = Storage::allocate(n * dtype_size(dtype), device);
  return make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor new_channels_last(const Shape& nchw, DType dtype, Device device) {
  const int64_t c = nchw[1], w = nchw[3];
  auto storage = Storage::allocate(shape_numel(nchw) * dtype_size(dtype), device);
  return make_tensor(std::move(storage), nchw, {nchw[2] * w * c, 1, w * c, c}, 0, dtype);
}

void* device_data(const Tensor& t) {
  return static_cast<char*>(t.storage()->data()) + t.offset() * t.element_size();
}

// Note [Transfers]
// The one place that moves bytes between devices: a dense copy of t on its own device, then the
// byte copy of whichever side is the host (a device-to-device move is staged through the host,
// which is what one process with one device of each kind needs; peer copies can come later).
Tensor transfer_raw(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor src = t;
  if (!src.is_contiguous()) {
    src = new_tensor(t.shape(), t.dtype(), t.device());
    backend_for(t.device()).copy(t, src);
  }
  if (!t.device().is_cpu() && !device.is_cpu()) return transfer_raw(transfer_raw(src, Device::cpu()), device);
  Tensor out = new_tensor(t.shape(), t.dtype(), device);
  const int64_t nbytes = t.numel() * t.element_size();
  if (t.device().is_cpu())
    backend_for(device).copy_from_host(device, device_data(src), device_data(out), nbytes);
  else
    backend_for(t.device()).copy_to_host(t.device(), device_data(src), device_data(out), nbytes);
  return out;
}

Tensor as_strided(const Tensor& t, Shape shape, Shape strides, int64_t offset) {
  return make_tensor(t.storage(), std::move(shape), std::move(strides), offset, t.dtype());
}

// Note [Axes of a 0-d tensor]
// A 0-d tensor has no axis, so ops that read the size of an axis (slice, narrow, select, split,
// size) refuse it through normalize_axis. Ops for which PyTorch lets a 0-d tensor stand for one
// axis of size 1 (reductions, softmax, gather, transpose, flatten, squeeze) call
// normalize_axis_or_scalar, which accepts axis 0 and -1 for it, and must handle that case
// themselves (usually by viewing the tensor as shape [1]).
int64_t normalize_axis(int64_t axis, int64_t ndim, const char* op) {
  BRAID_CHECK_T(IndexError, ndim > 0, op, ": a 0-d tensor has no axis ", axis, "; reshape it to [1] first");
  BRAID_CHECK_T(IndexError, axis >= -ndim && axis < ndim, op, ": axis ", axis, " is out of range for a tensor of ",
                ndim, " dimension", ndim == 1 ? "" : "s", " (expected ", -ndim, " to ", ndim - 1, ")");
  return axis < 0 ? axis + ndim : axis;
}

int64_t normalize_axis_or_scalar(int64_t axis, int64_t ndim, const char* op) {
  if (ndim > 0) return normalize_axis(axis, ndim, op);
  BRAID_CHECK_T(IndexError, axis == 0 || axis == -1, op, ": axis ", axis,
                " is out of range for a 0-d tensor (expected -1 or 0)");
  return 0;
}

std::vector<int64_t> normalize_axes(const std::vector<int64_t>& axes, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  std::vector<bool> seen(std::max<int64_t>(ndim, 1), false);
  for (int64_t a : axes) {
    int64_t n = normalize_axis_or_scalar(a, ndim, op);
    BRAID_CHECK(!seen[n], op, ": axis ", a, " appears more than once");
    seen[n] = true;
  }
  for (int64_t i = 0; i < std::max<int64_t>(ndim, 1); ++i)
    if (seen[i] && i < ndim) out.push_back(i);
  return out;
}

}  // namespace detail

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : impl().shape) n *= d;
  return n;
}

int64_t Tensor::size(int64_t axis) const { return shape()[detail::normalize_axis(axis, dim(), "size")]; }

bool Tensor::is_channels_last() const {
  if (impl().shape.size() != 4 || numel() == 0) return false;
  int64_t expected = 1;
  for (size_t i : {size_t{1}, size_t{3}, size_t{2}, size_t{0}}) {  // C, W, H, N from the innermost
    if (impl().shape[i] == 1) continue;
    if (impl().strides[i] != expected) return false;
    expected *= impl().shape[i];
  }
  return true;
}

bool Tensor::is_contiguous() const {
  // An empty tensor has no element out of place (and a fresh one with a zero-size inner axis has
  // outer strides that the loop below would not expect).
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t i = impl().shape.size(); i-- > 0;) {
    if (impl().shape[i] == 1) continue;
    if (impl().strides[i] != expected) return false;
    expected *= impl().shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  BRAID_CHECK_T(TypeError, device().is_cpu(), "raw_data: the tensor is on ", device().str(),
                ", whose memory the host cannot read; copy it first with .cpu()");
  return detail::device_data(*this);
}

uintptr_t Tensor::data_ptr() const { return reinterpret_cast<uintptr_t>(detail::device_data(*this)); }

double Tensor::item() const {
  BRAID_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape_str(shape()));
  if (device().is_cpu()) {  // read in place: the executor reads scales and zero points every run
    const void* p = raw_data();
    switch (dtype()) {
      case DType::Float32:
        return *static_cast<const float*>(p);
      case DType::Float64:
        return *static_cast<const double*>(p);
      case DType::Int64:
        return static_cast<double>(*static_cast<const int64_t*>(p));
      case DType::Int32:
        return *static_cast<const int32_t*>(p);
      case DType::Bool:
        return *static_cast<const uint8_t*>(p) != 0 ? 1.0 : 0.0;
      case DType::Int8:
        return *static_cast<const int8_t*>(p);
      case DType::UInt8:
        return *static_cast<const uint8_t*>(p);
      default:  // the half types convert below
        break;
    }
  }
  return to_vector<double>()[0];
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  constexpr DType target = detail::dtype_of<T>();
  if (device().is_cpu() && dtype() == target && is_contiguous()) {  // read in place (shapes, indices)
    const T* p = static_cast<const T*>(raw_data());
    return std::vector<T>(p, p + numel());
  }
  Tensor c = detail::new_tensor(shape(), target, device());
  {
    NoGradGuard guard;
    detail::backend_for(device()).copy(*this, c);
  }
  c = detail::transfer_raw(c, Device::cpu());
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<int32_t> v = to_vector<int32_t>();
  return std::vector<bool>(v.begin(), v.end());
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu()) os << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad=true";
  os << ", values=[";
  std::vector<double> v = to_vector<double>();
  const size_t shown = std::min<size_t>(v.size(), 20);
  os << std::setprecision(6);
  for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > shown) os << ", ... (" << v.size() << " values)";
  os << "])";
  return os.str();
}

// ---- methods that forward to ops ----
Tensor Tensor::reshape(const Shape& s) const { return braid::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const {
  Tensor r = braid::reshape(*this, s);
  BRAID_CHECK(r.storage() == storage(), "view: shape ", shape_str(s), " is not compatible with the strides ",
              shape_str(strides()), " of a tensor of shape ", shape_str(shape()), "; use reshape (which copies)");
  return r;
}
Tensor Tensor::flatten(int64_t start, int64_t end) const { return braid::flatten(*this, start, end); }
Tensor Tensor::permute(const std::vector<int64_t>& order) const { return braid::permute(*this, order); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return braid::transpose(*this, a, b); }
Tensor Tensor::mT() const {
  BRAID_CHECK(dim() >= 2, "mT: expected at least 2 dimensions, got shape ", shape_str(shape()));
  return braid::transpose(*this, -2, -1);
}
Tensor Tensor::narrow(int64_t axis, int64_t start, int64_t length) const {
  return braid::narrow(*this, axis, start, length);
}
Tensor Tensor::slice(int64_t axis, int64_t start, int64_t end, int64_t step) const {
  return braid::slice(*this, axis, start, end, step);
}
Tensor Tensor::select(int64_t axis, int64_t index) const {
  int64_t a = detail::normalize_axis(axis, dim(), "select");
  int64_t n = shape()[a];
  BRAID_CHECK_T(IndexError, index >= -n && index < n, "select: index ", index, " is out of range for axis ", axis,
                " of size ", n);
  if (index < 0) index += n;
  return braid::squeeze(braid::narrow(*this, a, index, 1), a);
}
Tensor Tensor::expand(const Shape& s) const { return braid::expand(*this, s); }
Tensor Tensor::squeeze() const { return braid::squeeze(*this); }
Tensor Tensor::squeeze(int64_t axis) const { return braid::squeeze(*this, axis); }
Tensor Tensor::unsqueeze(int64_t axis) const { return braid::unsqueeze(*this, axis); }
Tensor Tensor::contiguous() const { return braid::contiguous(*this); }
Tensor Tensor::to(DType t) const { return braid::cast(*this, t); }
Tensor Tensor::to(Device d) const { return braid::to_device(*this, d); }
Tensor Tensor::cpu() const { return braid::to_device(*this, Device::cpu()); }
Tensor Tensor::cuda(int index) const { return braid::to_device(*this, Device::cuda(index)); }
Tensor Tensor::sum(const std::vector<int64_t>& axes, bool keepdim) const { return braid::sum(*this, axes, keepdim); }
Tensor Tensor::mean(const std::vector<int64_t>& axes, bool keepdim) const { return braid::mean(*this, axes, keepdim); }
Tensor Tensor::matmul(const Tensor& other) const { return braid::matmul(*this, other); }

}  // namespace braid
