// Indexing ops: gather, index_select, scatter_add and one_hot. Index values are checked against
// the axis size at the front door, so the kernels never read or write out of bounds.
#include "braid/amp.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {
void check_index_shape(const Tensor& x, int64_t a, const Tensor& index, const char* op) {
  BRAID_CHECK(index.dim() == x.dim(), op, ": index has ", index.dim(), " dimensions but input has ", x.dim(),
              " (shapes ", shape_str(index.shape()), " and ", shape_str(x.shape()), ")");
  for (int64_t d = 0; d < x.dim(); ++d)
    BRAID_CHECK(d == a || index.shape()[d] <= x.shape()[d], op, ": index shape ", shape_str(index.shape()),
                " is larger than input shape ", shape_str(x.shape()), " at axis ", d);
}

Tensor gather_raw(const Tensor& x, int64_t a, const Tensor& idx) {
  Tensor out = new_tensor(idx.shape(), x.dtype(), x.device());
  backend_of(x).gather(x, a, idx, out);
  return out;
}
// A gradient that scatter_add sums into: a half one widened to float32, so that the sums round once
// (the engine rounds the result to the input's dtype).
Tensor accumulable(const Tensor& g) { return is_half(g.dtype()) ? cast(g, kFloat32) : g; }

}  // namespace

Tensor gather(const Tensor& x, int64_t axis, const Tensor& index) {
  BRAID_CHECK(x.defined(), "gather: got an undefined tensor");  // any dtype: the backend moves bits
  check_same_device(x, index, "gather");
  int64_t a = normalize_axis_or_scalar(axis, x.dim(), "gather");
  // A 0-d input or index stands for one of size 1 when the other is at most 1-d (Note [Axes of a
  // 0-d tensor]); PyTorch reads them so.
  if (x.dim() <= 1 && index.dim() <= 1 && (x.dim() == 0 || index.dim() == 0))
    return gather(x.reshape({-1}), 0, index.reshape({-1})).reshape(index.shape());
  check_index_shape(x, a, index, "gather");
  Tensor idx = checked_index(index, x.shape()[a], "gather", axis);
  Tensor out = gather_raw(x, a, idx);
  traced("gather", out, {x, index}, {{a}, {}});
  if (!is_floating(x.dtype())) return out;
  Shape in_shape = x.shape();
  return record("gather", out, {x}, [idx, a, in_shape](const Tensor& g_in, Grads& r) {
    const Tensor g = accumulable(g_in);
    r.set(0, scatter_add(zeros(in_shape, g.dtype(), g.device()), a, idx, g));
  });
}

Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index) {
  BRAID_CHECK(x.defined(), "index_select: got an undefined tensor");  // any dtype: the backend moves bits
  check_same_device(x, index, "index_select");
  int64_t a = normalize_axis_or_scalar(axis, x.dim(), "index_select");
  BRAID_CHECK(index.dim() <= 1, "index_select: index must be 1-d, got shape ", shape_str(index.shape()));
  if (x.dim() == 0) {  // as one axis of size 1; the result stays 0-d, as in PyTorch
    BRAID_CHECK(index.numel() == 1, "index_select: the index of a 0-d input must hold one value, got ",
                index.numel());
    return index_select(x.reshape({1}), 0, index.reshape({1})).reshape({});
  }
  Tensor idx = checked_index(index.reshape({-1}), x.shape()[a], "index_select", axis);
  // As a gather whose index is broadcast (stride 0) along every other axis.
  Shape out_shape = x.shape(), view_shape(x.dim(), 1);
  out_shape[a] = idx.numel();
  view_shape[a] = idx.numel();
  Tensor wide = broadcast_view(idx.reshape(view_shape), out_shape);
  Tensor out = gather_raw(x, a, wide);
  traced("index_select", out, {x, index}, {{a}, {}});
  if (!is_floating(x.dtype())) return out;
  Shape in_shape = x.shape();
  return record("index_select", out, {x}, [wide, a, in_shape](const Tensor& g_in, Grads& r) {
    const Tensor g = accumulable(g_in);
    r.set(0, scatter_add(zeros(in_shape, g.dtype(), g.device()), a, wide, g));
  });
}

Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  check_compute(x, "scatter_add");
  check_compute(src, "scatter_add");
  if (autocast_enabled() && x.dtype() != src.dtype() && is_floating(x.dtype()) && is_floating(src.dtype())) {
    const DType t = promote_types(x.dtype(), src.dtype());  // on autocast's promote list (Note [Autocast])
    return scatter_add(cast(x, t), axis, index, cast(src, t));
  }
  if (is_half(x.dtype()) && src.dtype() == x.dtype())  // float32 sums, rounded once (Note [Half arithmetic])
    return cast(scatter_add(cast(x, kFloat32), axis, index, cast(src, kFloat32)), x.dtype());
  check_same_device(x, index, "scatter_add");
  check_same_device(x, src, "scatter_add");
  BRAID_CHECK_T(TypeError, src.dtype() == x.dtype(), "scatter_add: src is ", dtype_name(src.dtype()), " but the input is ",
                dtype_name(x.dtype()), "; cast src first (the sum would otherwise be rounded silently)");
  int64_t a = normalize_axis_or_scalar(axis, x.dim(), "scatter_add");
  if (x.dim() <= 1 && index.dim() <= 1 && src.dim() <= 1 && (x.dim() == 0 || index.dim() == 0))
    return scatter_add(x.reshape({-1}), 0, index.reshape({-1}), src.reshape({-1})).reshape(x.shape());
  BRAID_CHECK(index.shape() == src.shape() || index.dim() == src.dim(), "scatter_add: index shape ",
              shape_str(index.shape()), " and src shape ", shape_str(src.shape()), " differ");
  for (int64_t d = 0; d < index.dim(); ++d)
    BRAID_CHECK(index.shape()[d] <= src.shape()[d], "scatter_add: index shape ", shape_str(index.shape()),
                " is larger than src shape ", shape_str(src.shape()), " at axis ", d);
  check_index_shape(x, a, index, "scatter_add");
  Tensor idx = checked_index(index, x.shape()[a], "scatter_add", axis);
  Tensor s = src.shape() == idx.shape() ? src : src.detach();
  if (src.shape() != idx.shape()) {  // use the leading window of src, as torch does
    for (int64_t d = 0; d < idx.dim(); ++d) s = s.narrow(d, 0, idx.shape()[d]);
  }
  Tensor out = new_tensor(x.shape(), x.dtype(), x.device());
  backend_of(x).copy(x, out);
  backend_of(x).scatter_add(out, a, idx, cast_raw(s, x.dtype()));
  traced("scatter_add", out, {x, index, s}, {{a}, {}});
  if (!is_floating(x.dtype())) return out;
  return record("scatter_add", out, {x, src}, [idx, a, src_shape = src.shape()](const Tensor& g, Grads& r) {
    r.set(0, g);
    if (r.needs(1)) {
      Tensor gs = gather(g, a, idx);
      std::vector<int64_t> pads;  // zero gradient outside the window of src that was used
      for (size_t d = src_shape.size(); d-- > 0;) pads.insert(pads.end(), {0, src_shape[d] - gs.shape()[d]});
      r.set(1, gs.shape() == src_shape ? gs : pad(gs, pads));
    }
  });
}

Tensor one_hot(const Tensor& labels, int64_t num_classes, DType dtype) {
  check_compute(labels, "one_hot");
  BRAID_CHECK_T(TypeError, labels.dtype() == kInt64 || labels.dtype() == kInt32,
                "one_hot: labels must be int64 or int32, got ", dtype_name(labels.dtype()));
  if (num_classes < 0) {
    BRAID_CHECK(labels.numel() > 0, "one_hot: cannot infer num_classes from empty labels; pass it explicitly");
    num_classes = static_cast<int64_t>(amax(labels).item()) + 1;
  }
  if (labels.numel() > 0) {
    int64_t lo = static_cast<int64_t>(amin(labels).item()), hi = static_cast<int64_t>(amax(labels).item());
    BRAID_CHECK_T(IndexError, lo >= 0 && hi < num_classes, "one_hot: label ", lo < 0 ? lo : hi,
                  " is out of range for ", num_classes, " classes");
  }
  return cast(eq(labels.unsqueeze(-1), arange(num_classes, labels.dtype(), labels.device())), dtype);
}

}  // namespace braid
