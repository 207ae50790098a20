// View ops (share storage, change only shape/strides/offset), cast, clone and the in-place
// updates. Each view's backward maps the gradient back to the input's layout.
#include <numeric>
#include <optional>

#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

// Strides that let new_shape view memory laid out as (shape, strides), if any (the same rule as
// PyTorch's view: each run of dims that is contiguous in memory may be regrouped freely).
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape) {
  if (shape_numel(shape) <= 1 || shape.empty()) return contiguous_strides(new_shape);
  Shape out(new_shape.size());
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = strides[d - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape s = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      BRAID_CHECK(infer < 0, "reshape: only one dimension can be -1, got ", shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      BRAID_CHECK(s[i] >= 0, "reshape: invalid size ", s[i], " in shape ", shape_str(requested));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    BRAID_CHECK(known != 0 && numel % known == 0, "reshape: cannot reshape a tensor of shape ", shape_str(from),
                " (", numel, " elements) into ", shape_str(requested));
    s[infer] = numel / known;
  }
  BRAID_CHECK(shape_numel(s) == numel, "reshape: cannot reshape a tensor of shape ", shape_str(from), " (", numel,
              " elements) into ", shape_str(requested), " (", shape_numel(s), " elements)");
  return s;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& requested) {
  Shape s = infer_shape(requested, x.numel(), x.shape());
  if (s == x.shape()) return x;
  Shape in_shape = x.shape();
  Tensor out;
  if (auto strides = view_strides(x.shape(), x.strides(), s)) {
    out = as_strided(x, s, *strides, x.offset());
  } else {
    Tensor c = contiguous_raw(x);
    out = as_strided(c, s, contiguous_strides(s), c.offset());
  }
  traced("reshape", out, {x}, {requested, {}});
  return record("reshape", out, {x}, [in_shape](const Tensor& g, Grads& r) { r.set(0, g.reshape(in_shape)); });
}

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  int64_t s = normalize_axis_or_scalar(start, x.dim(), "flatten"), e = normalize_axis_or_scalar(end, x.dim(), "flatten");
  if (x.dim() == 0) return x.reshape({1});
  BRAID_CHECK(s <= e, "flatten: start axis ", start, " comes after end axis ", end);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= x.shape()[i];
  shape.push_back(n);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return x.reshape(shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& order) {
  BRAID_CHECK(static_cast<int64_t>(order.size()) == x.dim(), "permute: order has ", order.size(),
              " axes but the tensor has shape ", shape_str(x.shape()));
  std::vector<int64_t> axes(order.size()), inverse(order.size());
  std::vector<bool> seen(order.size(), false);
  Shape shape(order.size()), strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    int64_t a = normalize_axis(order[i], x.dim(), "permute");
    BRAID_CHECK(!seen[a], "permute: axis ", order[i], " appears twice in the order");
    seen[a] = true;
    axes[i] = a;
    inverse[a] = static_cast<int64_t>(i);
    shape[i] = x.shape()[a];
    strides[i] = x.strides()[a];
  }
  Tensor out = as_strided(x, shape, strides, x.offset());
  traced("permute", out, {x}, {axes, {}});
  return record("permute", out, {x}, [inverse](const Tensor& g, Grads& r) { r.set(0, g.permute(inverse)); });
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  int64_t na = normalize_axis_or_scalar(a, x.dim(), "transpose"), nb = normalize_axis_or_scalar(b, x.dim(), "transpose");
  if (x.dim() == 0) return x;
  std::vector<int64_t> order(x.dim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[na], order[nb]);
  return permute(x, order);
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  int64_t a = normalize_axis(axis, x.dim(), "slice");
  BRAID_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = x.shape()[a];
  // Python slice semantics: negative bounds count from the end, out-of-range bounds clamp.
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = x.shape(), strides = x.strides();
  shape[a] = (end - start + step - 1) / step;
  strides[a] *= step;
  Tensor out = as_strided(x, shape, strides, x.offset() + start * x.strides()[a]);
  Shape in_shape = x.shape();
  DType dt = x.dtype();
  traced("slice", out, {x}, {{a, start, end, step}, {}});
  return record("slice", out, {x}, [=](const Tensor& g, Grads& r) {
    Tensor gx = zeros(in_shape, dt, g.device());
    Shape s = gx.shape(), st = gx.strides();
    s[a] = shape[a];
    st[a] *= step;
    backend_of(g).copy(g, as_strided(gx, s, st, start * gx.strides()[a]));
    r.set(0, gx);
  });
}

Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length) {
  int64_t a = normalize_axis(axis, x.dim(), "narrow");
  int64_t n = x.shape()[a];
  BRAID_CHECK_T(IndexError, start >= -n && start <= n, "narrow: start ", start, " is out of range for axis ", axis,
                " of size ", n);
  if (start < 0) start += n;
  BRAID_CHECK_T(IndexError, length >= 0 && start + length <= n, "narrow: start ", start, " + length ", length,
                " exceeds size ", n, " of axis ", axis, " (shape ", shape_str(x.shape()), ")");
  return slice(x, a, start, start + length, 1);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  BRAID_CHECK(static_cast<int64_t>(shape.size()) >= x.dim(), "expand: cannot expand shape ", shape_str(x.shape()),
              " to fewer dimensions ", shape_str(shape));
  Shape target = shape;
  size_t lead = shape.size() - x.shape().size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i >= lead && target[i] == -1) target[i] = x.shape()[i - lead];
    BRAID_CHECK(target[i] >= 0, "expand: invalid size ", shape[i], " in ", shape_str(shape));
    if (i >= lead) {
      int64_t have = x.shape()[i - lead];
      BRAID_CHECK(have == target[i] || have == 1, "expand: the size ", have, " of axis ", i - lead, " of shape ",
                  shape_str(x.shape()), " cannot expand to ", target[i], " (only size-1 axes expand)");
    }
  }
  if (target == x.shape()) return x;
  Tensor out = broadcast_view(x, target);
  out = as_strided(x, out.shape(), out.strides(), out.offset());
  traced("expand", out, {x});
  return record("expand", out, {x}, [](const Tensor& g, Grads& r) { r.set(0, g); });
}

Tensor squeeze(const Tensor& x, std::optional<int64_t> axis) {
  Shape s;
  if (axis) {
    int64_t a = normalize_axis_or_scalar(*axis, x.dim(), "squeeze");
    for (int64_t i = 0; i < x.dim(); ++i)
      if (i != a || x.shape()[i] != 1) s.push_back(x.shape()[i]);
  } else {
    for (int64_t d : x.shape())
      if (d != 1) s.push_back(d);
  }
  return x.reshape(s);
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  int64_t a = normalize_axis(axis, x.dim() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + a, 1);
  return x.reshape(s);
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return record("contiguous", traced("contiguous", contiguous_raw(x), {x}), {x}, [](const Tensor& g, Grads& r) { r.set(0, g); });
}

Tensor Tensor::clone() const {
  Tensor out = new_tensor(shape(), dtype(), device());
  backend_of(*this).copy(*this, out);
  traced("clone", out, {*this});
  return record("clone", out, {*this}, [](const Tensor& g, Grads& r) { r.set(0, g); });
}

Tensor cast(const Tensor& x, DType dtype) {
  BRAID_CHECK(x.defined(), "cast: got an undefined tensor");
  if (x.dtype() == dtype) return x;
  Tensor out = cast_raw(x, dtype);
  traced("cast", out, {x});
  if (!is_floating(x.dtype()) || !is_floating(dtype)) return out;
  return record("cast", out, {x}, [](const Tensor& g, Grads& r) { r.set(0, g); });
}

Tensor to_device(const Tensor& x, Device device) {
  BRAID_CHECK(x.defined(), "to: got an undefined tensor");
  if (x.device() == device) return x;
  backend_for(device);  // NotImplementedError naming the device when it is absent
  Tensor out = transfer_raw(x, device);
  const Device from = x.device();
  traced("to", out, {x});
  return record("to", out, {x}, [from](const Tensor& g, Grads& r) { r.set(0, to_device(g, from)); });
}

// ---- in-place updates: for optimizers and initialisers, outside the graph ----

namespace {
// A source that shares memory with the destination of an in-place update is read through a copy,
// since the kernels write elements the source may still have to read (x.copy_(x.mT())).
Tensor unaliased(const Tensor& src, const Tensor& dst) {
  if (src.storage() != dst.storage()) return src;
  Tensor copy = new_tensor(src.shape(), src.dtype(), src.device());
  backend_of(src).copy(src, copy);
  return copy;
}
// An in-place update keeps the dtype, so a result of a higher kind (float into an integer tensor,
// an integer into bool: x.mul_(0.5) on int64) is refused rather than truncated, as PyTorch does.
int kind(DType t) { return t == kBool ? 0 : is_floating(t) ? 2 : 1; }
void check_result_kind(const Tensor& t, DType result, const char* op) {
  BRAID_CHECK_T(TypeError, kind(result) <= kind(t.dtype()), op, ": the result is ", dtype_name(result),
                ", which cannot be written back to a ", dtype_name(t.dtype()), " tensor in place");
}

// Writing into a view whose elements share memory (an expanded axis has stride 0) would update one
// element several times, so it is refused, as PyTorch refuses it (fill_ writes one value, so it may).
void check_no_overlap(const Tensor& t, const char* op) {
  if (t.numel() == 0) return;
  for (int64_t d = 0; d < t.dim(); ++d)
    BRAID_CHECK(t.shape()[d] <= 1 || t.strides()[d] != 0, op, ": axis ", d, " of the written tensor (shape ",
                shape_str(t.shape()), ", strides ", shape_str(t.strides()), ") repeats one element (an expanded "
                "view); write into a copy (contiguous()) instead");
}
}  // namespace

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  check_scalar_fits(value, dtype(), "fill_");
  backend_of(*this).fill(*this, value);
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  check_no_overlap(*this, "copy_");
  BRAID_CHECK(src.defined(), "copy_: the source is undefined");
  BRAID_CHECK(broadcast_shapes(src.shape(), shape(), "copy_") == shape(), "copy_: source shape ",
              shape_str(src.shape()), " does not broadcast to destination shape ", shape_str(shape()));
  // The one in-place op that crosses devices, as PyTorch's copy_ does: load_state_dict and
  // checkpoints copy host values into parameters wherever they live.
  const Tensor here = transfer_raw(src, device());
  backend_of(*this).copy(broadcast_view(unaliased(here, *this), shape()), *this);
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_");
  check_compute(*this, "add_");
  check_compute(other, "add_");
  check_no_overlap(*this, "add_");
  Tensor o = other;
  if (alpha != 1.0) {
    Tensor s = scalar_operand(other, alpha);
    DType t = promote_types(other.dtype(), s.dtype());
    o = binary_raw(BinaryOp::Mul, other, s, t, t, "add_");
  }
  check_result_kind(*this, promote_types(dtype(), o.dtype()), "add_");
  BRAID_CHECK(broadcast_shapes(o.shape(), shape(), "add_") == shape(), "add_: shape ", shape_str(o.shape()),
              " does not broadcast to ", shape_str(shape()));
  // A half o adds into a float32 tensor as it is (Note [Half arithmetic]): gradient accumulation.
  const Tensor src = unaliased(o, *this);
  const Tensor addend = dtype() == kFloat32 && is_half(src.dtype()) ? src : cast_raw(src, dtype());
  backend_of(*this).binary(BinaryOp::Add, *this, broadcast_view(addend, shape()), *this);
  return *this;
}

Tensor& Tensor::mul_(double value) {
  check_inplace(*this, "mul_");
  check_compute(*this, "mul_");
  check_no_overlap(*this, "mul_");
  check_result_kind(*this, scalar_result_type(dtype(), value), "mul_");
  backend_of(*this).binary(BinaryOp::Mul, *this, broadcast_view(scalar_like(*this, value), shape()), *this);
  return *this;
}

}  // namespace braid
