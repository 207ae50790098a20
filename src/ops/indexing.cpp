// index() and index_put_() (braid/indexing.h): the item list of Python's t[...] turned into views
// (slice, select, unsqueeze), one index_select for a tensor item, and where() for a masked write.
#include "braid/indexing.h"

#include "braid/ops.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

TensorIndex TensorIndex::integer_at(int64_t i) {
  TensorIndex t;
  t.kind = Kind::Integer;
  t.integer = i;
  return t;
}
TensorIndex TensorIndex::slice(std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step) {
  TensorIndex t;
  t.kind = Kind::Slice;
  t.start = start;
  t.stop = stop;
  t.step = step;
  return t;
}
TensorIndex TensorIndex::new_axis() { return TensorIndex(); }
TensorIndex TensorIndex::ellipsis() {
  TensorIndex t;
  t.kind = Kind::Ellipsis;
  return t;
}
TensorIndex TensorIndex::tensor(const braid::Tensor& indices) {
  BRAID_CHECK_T(TypeError, indices.defined(), "index: an undefined tensor as an index");
  TensorIndex t;
  t.kind = Kind::Tensor;
  t.indices = indices;
  return t;
}

namespace {

using Kind = TensorIndex::Kind;

bool is_mask(const TensorIndex& i) { return i.kind == Kind::Tensor && i.indices.dtype() == kBool; }

/// A 0-d integer tensor is an integer, as in Python.
TensorIndex as_integer(const TensorIndex& i) {
  if (i.kind != Kind::Tensor || i.indices.dim() != 0 || i.indices.dtype() == kBool) return i;
  BRAID_CHECK_T(TypeError, i.indices.dtype() == kInt64 || i.indices.dtype() == kInt32,
                "index: only integer tensors of a single element can be converted to an index, got ",
                dtype_name(i.indices.dtype()));
  return TensorIndex::integer_at(static_cast<int64_t>(i.indices.item()));
}

/// How many axes of the indexed tensor an item uses.
int64_t consumed(const TensorIndex& i) {
  if (i.kind == Kind::NewAxis || i.kind == Kind::Ellipsis) return 0;
  return is_mask(i) ? std::max<int64_t>(i.indices.dim(), 1) : 1;
}

/// Python's slice.indices(n) for a positive step: start and stop clamped to [0, n].
Tensor apply_slice(const Tensor& t, int64_t axis, const TensorIndex& i) {
  const int64_t n = t.size(axis), step = i.step.value_or(1);
  BRAID_CHECK(step > 0, "index: slice step must be positive (braid's views have non-negative strides), got ", step);
  auto bound = [n](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t b = *v < 0 ? *v + n : *v;
    return std::clamp<int64_t>(b, 0, n);
  };
  const int64_t start = bound(i.start, 0), stop = bound(i.stop, n);
  return t.slice(axis, start, std::max(stop, start), step);
}

/// The positions where mask (covering axes axis.. of t) is true, as int64 indices into those axes flattened.
Tensor mask_positions(const Tensor& t, int64_t axis, const Tensor& mask) {
  const int64_t k = std::max<int64_t>(mask.dim(), 1);
  const Shape& ts = t.shape();
  Shape covered(ts.begin() + axis, ts.begin() + std::min<int64_t>(axis + k, t.dim()));
  Shape ms = mask.dim() == 0 ? Shape{1} : mask.shape();
  BRAID_CHECK_T(IndexError, ms == covered, "index: boolean index of shape ", shape_str(mask.shape()),
                " does not match the indexed axes ", shape_str(covered), " at axis ", axis);
  std::vector<bool> m = mask.to_vector<bool>();
  std::vector<int64_t> where;
  for (size_t p = 0; p < m.size(); ++p)
    if (m[p]) where.push_back(static_cast<int64_t>(p));
  return braid::tensor(where, {static_cast<int64_t>(where.size())}, t.device());
}

}  // namespace

Tensor index(const Tensor& x, const std::vector<TensorIndex>& indices_in) {
  BRAID_CHECK(x.defined(), "index: the tensor is undefined");
  std::vector<TensorIndex> items;
  int64_t used = 0, ellipses = 0;
  for (const TensorIndex& i : indices_in) {
    items.push_back(as_integer(i));
    used += consumed(items.back());
    ellipses += items.back().kind == Kind::Ellipsis;
  }
  BRAID_CHECK_T(IndexError, ellipses <= 1, "index: an index can only have a single ellipsis ('...')");
  BRAID_CHECK_T(IndexError, used <= x.dim(), "index: too many indices for a tensor of dimension ", x.dim(), ": ",
                items.size(), " given");
  Tensor t = x;
  int64_t axis = 0, advanced_axis = -1;
  Tensor advanced;
  for (const TensorIndex& i : items) {
    switch (i.kind) {
      case Kind::NewAxis: t = t.unsqueeze(axis++); break;
      case Kind::Ellipsis: axis += x.dim() - used; break;
      case Kind::Slice: t = apply_slice(t, axis++, i); break;
      case Kind::Integer: {
        const int64_t n = t.size(axis);
        BRAID_CHECK_T(IndexError, -n <= i.integer && i.integer < n, "index: index ", i.integer,
                      " is out of bounds for axis ", axis, " with size ", n);
        t = t.select(axis, i.integer < 0 ? i.integer + n : i.integer);
        break;
      }
      case Kind::Tensor: {
        BRAID_CHECK_T(NotImplementedError, !advanced.defined(), "index: indexing with more than one integer or bool "
                      "tensor at once (shape ", shape_str(x.shape()), "); index one axis at a time");
        Tensor it = i.indices;
        if (it.dtype() == kBool) {
          const int64_t k = std::max<int64_t>(it.dim(), 1);
          Tensor positions = mask_positions(t, axis, it);
          if (k > 1) t = flatten(t, axis, axis + k - 1);
          it = positions;
        } else {
          BRAID_CHECK_T(IndexError, it.dtype() == kInt64 || it.dtype() == kInt32,
                        "index: tensors used as indices must be integer or bool, got ", dtype_name(it.dtype()));
        }
        advanced = it;
        advanced_axis = axis++;
        break;
      }
    }
  }
  if (!advanced.defined()) return t;
  Tensor y = index_select(t, advanced_axis, advanced.dim() == 1 ? advanced : advanced.reshape({-1}));
  if (advanced.dim() == 1) return y;
  Shape s(y.shape().begin(), y.shape().begin() + advanced_axis);
  s.insert(s.end(), advanced.shape().begin(), advanced.shape().end());
  s.insert(s.end(), y.shape().begin() + advanced_axis + 1, y.shape().end());
  return y.reshape(s);
}

void index_put_(Tensor& x, const std::vector<TensorIndex>& indices, const Tensor& value) {
  BRAID_CHECK(x.defined() && value.defined(), "index_put_: the tensor or the value is undefined");
  if (indices.size() == 1 && is_mask(indices[0])) {
    Tensor mask = indices[0].indices;
    const Shape lead(x.shape().begin(), x.shape().begin() + std::min<int64_t>(mask.dim(), x.dim()));
    BRAID_CHECK_T(IndexError, mask.dim() <= x.dim() && mask.shape() == lead, "index_put_: boolean index of shape ",
                  shape_str(mask.shape()), " does not match the leading axes of shape ", shape_str(x.shape()));
    Shape ms = mask.shape();
    ms.resize(static_cast<size_t>(x.dim()), 1);
    x.copy_(where(mask.to(x.device()).reshape(ms), cast(value, x.dtype()), x));
    return;
  }
  for (const TensorIndex& i : indices)
    BRAID_CHECK_T(NotImplementedError, i.kind != Kind::Tensor || i.indices.dim() == 0,
                  "index_put_: assignment through an integer tensor index, or a bool index combined with other "
                  "indices (shape ", shape_str(x.shape()), "); use scatter_add or where");
  index(x, indices).copy_(value);
}

}  // namespace braid
