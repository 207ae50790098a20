// ONNX shape, indexing, creation and type ops as braid ops.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_util.h"

namespace braid::onnx::ops {

DType dtype_from_onnx(const OpContext& c, int64_t code) {
  switch (code) {
    case 1: return kFloat32;
    case 2:
      return kUInt8;
    case 3:
      return kInt8;
    case 4:
    case 5:
    case 6:
      return kInt32;                                         // uint16, int16 (widened), int32
    case 7: case 12: return kInt64;                          // int64, uint32
    case 9: return kBool;
    case 10: return kFloat16;
    case 11: return kFloat64;
    case 16: return kBFloat16;
    default: break;
  }
  c.fail("element type ", code, " (", code == 8 ? "string" : code == 13 ? "uint64" : "complex or float8",
         ") is not supported");
}

int64_t onnx_type_code(DType t) {
  switch (t) {
    case DType::Float32: return 1;
    case DType::Float64: return 11;
    case DType::Int64: return 7;
    case DType::Int32: return 6;
    case DType::Bool: return 9;
    case DType::Float16: return 10;
    case DType::BFloat16: return 16;
    case DType::Int8:
      return 3;
    case DType::UInt8:
      return 2;
  }
  return 0;
}

namespace {

/// Shapes that come from a model's data (ConstantOfShape, Expand, Tile) are checked before
/// allocating: no negative sizes, no overflow, at most 16 GiB.
void check_alloc(const OpContext& c, const Shape& shape, DType t) {
  for (int64_t d : shape)
    if (d < 0) c.fail("shape ", shape_str(shape), " has a negative size");
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (int64_t{1} << 40) / d) c.fail("shape ", shape_str(shape), " is too large to allocate");
    n *= d;
  }
  if (n * dtype_size(t) > (int64_t{16} << 30))
    c.fail("shape ", shape_str(shape), " would need ", n * dtype_size(t), " bytes (over 16 GiB)");
}

std::vector<int64_t> squeeze_axes(OpContext& c) {
  if (c.opset() >= 13) return c.has_input(1) ? c.input_ints(1) : std::vector<int64_t>{};
  return c.attr_ints("axes");
}

/// Elements start, start+step, ... of one axis of size n, with ONNX Slice's clamping.
std::vector<int64_t> slice_indices(int64_t n, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += n;
  if (end < 0) end += n;
  std::vector<int64_t> idx;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, n);
    end = std::clamp<int64_t>(end, 0, n);
    for (int64_t i = start; i < end; i += step) idx.push_back(i);
  } else {
    start = std::clamp<int64_t>(start, 0, n - 1);
    end = std::clamp<int64_t>(end, -1, n - 1);
    for (int64_t i = start; i > end; i += step) idx.push_back(i);
  }
  return idx;
}

Tensor slice_axis(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  const int64_t n = x.size(axis);
  if (step > 0) {
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp<int64_t>(start, 0, n);
    end = std::clamp<int64_t>(end, start, n);
    return slice(x, axis, start, end, step);
  }
  std::vector<int64_t> idx = slice_indices(n, start, end, step);
  return index_select(x, axis, tensor(idx, {static_cast<int64_t>(idx.size())}, x.device()));
}

/// Indices with negative values wrapped and every value checked against the axis' size.
Tensor wrap_indices(const OpContext& c, const Tensor& index, int64_t n, int64_t axis) {
  if (index.dtype() != kInt64 && index.dtype() != kInt32) c.fail("indices must be int32 or int64, got ", dtype_name(index.dtype()));
  std::vector<int64_t> v = index.to_vector<int64_t>();
  for (int64_t& i : v) {
    if (i < -n || i >= n) throw IndexError(detail::cat("index ", i, " is out of range for axis ", axis, " of size ", n));
    if (i < 0) i += n;
  }
  return tensor(v, index.shape(), index.device());
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps) {
  Shape inter, expanded, out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    inter.push_back(1);
    inter.push_back(x.size(d));
    expanded.push_back(reps[static_cast<size_t>(d)]);
    expanded.push_back(x.size(d));
    out.push_back(reps[static_cast<size_t>(d)] * x.size(d));
  }
  return reshape(expand(reshape(x, inter), expanded), out);
}

Tensor constant_from_attr(OpContext& c) {
  if (c.has_attr("value")) return c.attr("value").t.clone();
  if (c.has_attr("value_float")) return scalar_tensor(c.attr_float("value_float", 0), kFloat32, c.device());
  if (c.has_attr("value_int")) return scalar_tensor(static_cast<double>(c.attr_int("value_int", 0)), kInt64, c.device());
  if (c.has_attr("value_floats")) {
    std::vector<double> v = c.attr_floats("value_floats");
    std::vector<float> f(v.begin(), v.end());
    return tensor(f, {static_cast<int64_t>(f.size())}, c.device());
  }
  if (c.has_attr("value_ints")) {
    std::vector<int64_t> v = c.attr_ints("value_ints");
    return tensor(v, {static_cast<int64_t>(v.size())}, c.device());
  }
  c.fail("Constant needs one of value, value_float(s), value_int(s)");
}

Tensor depth_to_space(const Tensor& x, int64_t b, bool crd) {
  const int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t c = ch / (b * b);
  Tensor t = crd ? reshape(x, {n, c, b, b, h, w}) : reshape(x, {n, b, b, c, h, w});
  t = crd ? permute(t, {0, 1, 4, 2, 5, 3}) : permute(t, {0, 3, 4, 1, 5, 2});
  return reshape(t, {n, c, h * b, w * b});
}

}  // namespace

void register_tensor_ops(OpRegistry& r) {
  r.add(op("Identity", {}, [](OpContext& c) { return Tensors{c.input(0)}; }));
  {
    OpSchema s = op("Constant", {"value", "value_float", "value_floats", "value_int", "value_ints"},
                    [](OpContext& c) { return Tensors{constant_from_attr(c)}; });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  {
    OpSchema s = op("ConstantOfShape", {"value"}, [](OpContext& c) {
      Shape shape = c.input_ints(0);
      check_alloc(c, shape, c.has_attr("value") ? c.attr("value").t.dtype() : kFloat32);
      if (!c.has_attr("value")) return Tensors{zeros(shape, kFloat32, c.device())};
      const Tensor& v = c.attr("value").t;
      if (v.numel() != 1) c.fail("value must hold one element, got shape ", shape_str(v.shape()));
      if (v.dtype() == kFloat16 || v.dtype() == kBFloat16) return Tensors{cast(full(shape, cast(v, kFloat32).item(), kFloat32, c.device()), v.dtype())};
      return Tensors{full(shape, v.item(), v.dtype(), c.device())};
    });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  {
    OpSchema s = op("Shape", {"start", "end"}, [](OpContext& c) {
      const Shape& sh = c.input(0).shape();
      const int64_t rank = static_cast<int64_t>(sh.size());
      int64_t start = c.attr_int("start", 0), end = c.attr_int("end", rank);
      if (start < 0) start += rank;
      if (end < 0) end += rank;
      start = std::clamp<int64_t>(start, 0, rank);
      end = std::clamp<int64_t>(end, start, rank);
      std::vector<int64_t> v(sh.begin() + start, sh.begin() + end);
      return Tensors{tensor(v, {static_cast<int64_t>(v.size())}, c.device())};
    });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  {
    OpSchema s = op("Size", {}, [](OpContext& c) { return Tensors{scalar_tensor(static_cast<double>(c.input(0).numel()), kInt64, c.device())}; });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  {
    OpSchema s = op("Cast", {"to", "saturate"}, [](OpContext& c) {
      return Tensors{cast(c.input(0), dtype_from_onnx(c, c.attr_int("to", 1)))};
    });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  {
    OpSchema s = op("CastLike", {"saturate"}, [](OpContext& c) { return Tensors{cast(c.input(0), c.input(1).dtype())}; });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  r.add(op("Reshape", {"allowzero"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    std::vector<int64_t> shape = c.opset() >= 5 ? c.input_ints(1) : c.attr_ints("shape");
    const bool allowzero = c.attr_int("allowzero", 0) != 0;
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] == 0 && !allowzero) {
        if (static_cast<int64_t>(i) >= x.dim()) c.fail("shape ", shape_str(shape), " copies axis ", i, " of a rank-", x.dim(), " input");
        shape[i] = x.size(static_cast<int64_t>(i));
      }
    return Tensors{reshape(x, shape)};
  }));
  r.add(op("Flatten", {"axis"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = c.attr_int("axis", 1);
    const int64_t a = axis < 0 ? axis + x.dim() : axis;
    if (a < 0 || a > x.dim()) c.fail("axis ", axis, " is out of range for rank ", x.dim());
    int64_t outer = 1;
    for (int64_t d = 0; d < a; ++d) outer *= x.size(d);
    return Tensors{reshape(x, {outer, outer == 0 ? 0 : x.numel() / outer})};
  }));
  r.add(op("Transpose", {"perm"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    std::vector<int64_t> perm = c.attr_ints("perm");
    if (perm.empty())
      for (int64_t d = x.dim() - 1; d >= 0; --d) perm.push_back(d);
    return Tensors{permute(x, perm)};
  }));
  r.add(op("Squeeze", {"axes"}, [](OpContext& c) {
    Tensor x = c.input(0);
    std::vector<int64_t> axes = squeeze_axes(c);
    if (axes.empty()) return Tensors{squeeze(x)};
    for (int64_t& a : axes) a = norm_axis(c, a, x.dim());
    std::sort(axes.rbegin(), axes.rend());
    for (int64_t a : axes) {
      if (x.size(a) != 1) c.fail("cannot squeeze axis ", a, " of size ", x.size(a), " (shape ", shape_str(x.shape()), ")");
      x = squeeze(x, a);
    }
    return Tensors{x};
  }));
  r.add(op("Unsqueeze", {"axes"}, [](OpContext& c) {
    Tensor x = c.input(0);
    std::vector<int64_t> axes = squeeze_axes(c);
    const int64_t out_rank = x.dim() + static_cast<int64_t>(axes.size());
    for (int64_t& a : axes) a = norm_axis(c, a, out_rank);
    std::sort(axes.begin(), axes.end());
    for (int64_t a : axes) x = unsqueeze(x, a);
    return Tensors{x};
  }));
  r.add(op("Concat", {"axis"}, [](OpContext& c) {
    std::vector<Tensor> xs;
    for (size_t i = 0; i < c.num_inputs(); ++i) xs.push_back(c.input(i));
    const int64_t axis = norm_axis(c, c.attr_int("axis", 0), xs[0].dim());
    return Tensors{concat(xs, axis)};
  }));
  r.add(op("Split", {"axis", "split", "num_outputs"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
    std::vector<int64_t> sizes = c.opset() >= 13 ? (c.has_input(1) ? c.input_ints(1) : std::vector<int64_t>{})
                                                 : c.attr_ints("split");
    const int64_t n = x.size(axis);
    if (sizes.empty()) {
      const int64_t k = c.has_attr("num_outputs") ? c.attr_int("num_outputs", 1)
                                                  : static_cast<int64_t>(c.node().outputs.size());
      if (k <= 0) c.fail("num_outputs must be positive, got ", k);
      const int64_t piece = (n + k - 1) / k;
      if (!c.has_attr("num_outputs") && n % k != 0) c.fail("axis ", axis, " of size ", n, " does not split into ", k, " equal parts");
      for (int64_t i = 0, left = n; i < k; ++i) {
        sizes.push_back(std::min(piece, left));
        left -= sizes.back();
      }
    }
    return split(x, sizes, axis);
  }));
  r.add(op("Slice", {"starts", "ends", "axes"}, [](OpContext& c) {
    Tensor x = c.input(0);
    std::vector<int64_t> starts, ends, axes, steps;
    if (c.opset() < 10) {
      starts = c.attr_ints("starts");
      ends = c.attr_ints("ends");
      axes = c.attr_ints("axes");
    } else {
      starts = c.input_ints(1);
      ends = c.input_ints(2);
      if (c.has_input(3)) axes = c.input_ints(3);
      if (c.has_input(4)) steps = c.input_ints(4);
    }
    if (ends.size() != starts.size()) c.fail("starts and ends differ in length (", starts.size(), " and ", ends.size(), ")");
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (axes.size() != starts.size() || steps.size() != starts.size()) c.fail("starts, ends, axes and steps differ in length");
    for (size_t i = 0; i < starts.size(); ++i) {
      if (steps[i] == 0) c.fail("step 0 on axis ", axes[i]);
      x = slice_axis(x, norm_axis(c, axes[i], x.dim()), starts[i], ends[i], steps[i]);
    }
    return Tensors{x};
  }));
  {
    // Rows of a table in any element type as they are (an int8 or float16 embedding table is not
    // widened whole for the few rows a batch picks).
    OpSchema s = op("Gather", {"axis"}, [](OpContext& c) {
      const Tensor& x = c.input(0);
      const int64_t axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
      Tensor idx = wrap_indices(c, c.input(1), x.size(axis), axis);
      Tensor picked = index_select(x, axis, reshape(idx, {idx.numel()}));
      Shape out(x.shape().begin(), x.shape().begin() + axis);
      out.insert(out.end(), idx.shape().begin(), idx.shape().end());
      out.insert(out.end(), x.shape().begin() + axis + 1, x.shape().end());
      return Tensors{reshape(picked, out)};
    });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
  r.add(op("GatherElements", {"axis"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
    return Tensors{gather(x, axis, wrap_indices(c, c.input(1), x.size(axis), axis))};
  }));
  r.add(op("Expand", {}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    Shape target = broadcast_shapes(x.shape(), c.input_ints(1), "Expand");
    check_alloc(c, target, x.dtype());
    return Tensors{expand(x, target)};
  }));
  r.add(op("Tile", {}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    std::vector<int64_t> reps = c.input_ints(1);
    if (static_cast<int64_t>(reps.size()) != x.dim()) c.fail("repeats has ", reps.size(), " values for a rank-", x.dim(), " input");
    Shape out = x.shape();
    for (size_t d = 0; d < out.size(); ++d) {
      if (reps[d] < 0) c.fail("repeats must be non-negative, got ", reps[d]);
      out[d] = reps[d] == 0 ? 0 : (out[d] > (int64_t{1} << 40) / reps[d] ? (int64_t{1} << 40) : out[d] * reps[d]);
    }
    check_alloc(c, out, x.dtype());
    return Tensors{tile(x, reps)};
  }));
  r.add(op("Where", {}, [](OpContext& c) { return Tensors{where(c.input(0), c.input(1), c.input(2))}; }));
  r.add(op("Range", {}, [](OpContext& c) {
    const Tensor& s = c.input(0);
    const double start = s.item(), limit = c.input_scalar(1), delta = c.input_scalar(2);
    if (delta == 0) c.fail("delta is 0");
    const double count = std::max(std::ceil((limit - start) / delta), 0.0);
    if (count > 1e9) c.fail("Range of ", count, " elements is too large");
    const auto n = static_cast<int64_t>(count);
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i) * delta;
    return Tensors{cast(tensor(v, {n}, c.device()), s.dtype())};
  }));
  r.add(op("Pad", {"mode", "pads", "value"}, [](OpContext& c) {
    Tensor x = c.input(0);
    const int64_t rank = x.dim();
    std::vector<int64_t> pads;
    double value = 0;
    std::vector<int64_t> axes;
    if (c.opset() < 11) {
      pads = c.attr_ints("pads");
      value = c.attr_float("value", 0.0);
    } else {
      pads = c.input_ints(1);
      if (c.has_input(2) && c.input(2).numel() > 0) value = c.input(2).item();
      if (c.has_input(3)) axes = c.input_ints(3);
    }
    if (axes.empty())
      for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
    if (pads.size() != 2 * axes.size()) c.fail("pads has ", pads.size(), " values for ", axes.size(), " axes");
    std::vector<int64_t> before(static_cast<size_t>(rank), 0), after(static_cast<size_t>(rank), 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = norm_axis(c, axes[i], rank);
      before[static_cast<size_t>(a)] = pads[i];
      after[static_cast<size_t>(a)] = pads[i + axes.size()];
    }
    // Negative pads crop.
    for (int64_t d = 0; d < rank; ++d) {
      int64_t& b = before[static_cast<size_t>(d)];
      int64_t& e = after[static_cast<size_t>(d)];
      if (b < 0 || e < 0) {
        const int64_t s = b < 0 ? -b : 0, stop = x.size(d) - (e < 0 ? -e : 0);
        if (stop < s) c.fail("negative pads remove more than axis ", d, " of size ", x.size(d), " holds");
        x = slice(x, d, s, stop);
        b = std::max<int64_t>(b, 0);
        e = std::max<int64_t>(e, 0);
      }
    }
    std::string mode = c.attr_string("mode", "constant");
    if (mode == "edge") mode = "replicate";
    if (mode == "wrap") {
      // Circular padding (opset 19): position i of the padded axis reads (i - before) mod size.
      for (int64_t d = 0; d < rank; ++d) {
        const int64_t b = before[static_cast<size_t>(d)], e = after[static_cast<size_t>(d)], n = x.size(d);
        if (b == 0 && e == 0) continue;
        if (n == 0) c.fail("mode 'wrap' cannot pad axis ", d, " of size 0");
        std::vector<int64_t> idx(static_cast<size_t>(n + b + e));
        for (int64_t i = 0; i < n + b + e; ++i) idx[static_cast<size_t>(i)] = ((i - b) % n + n) % n;
        x = index_select(x, d, tensor(idx, {n + b + e}, x.device()));
      }
      return Tensors{x};
    }
    if (mode != "constant" && mode != "reflect" && mode != "replicate") c.fail("mode '", mode, "' is not supported");
    // braid's pad takes (before, after) pairs for the trailing axes, innermost first.
    int64_t first = 0;
    while (first < rank && before[static_cast<size_t>(first)] == 0 && after[static_cast<size_t>(first)] == 0) ++first;
    if (first == rank) return Tensors{x};
    std::vector<int64_t> p;
    for (int64_t d = rank - 1; d >= first; --d) {
      p.push_back(before[static_cast<size_t>(d)]);
      p.push_back(after[static_cast<size_t>(d)]);
    }
    return Tensors{pad(x, p, mode, value)};
  }));
  r.add(op("EyeLike", {"dtype", "k"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    if (x.dim() != 2) c.fail("input must be 2-d, got shape ", shape_str(x.shape()));
    const DType t = c.has_attr("dtype") ? dtype_from_onnx(c, c.attr_int("dtype", 1)) : x.dtype();
    const int64_t k = c.attr_int("k", 0), rows = x.size(0), cols = x.size(1);
    Tensor i = reshape(arange(rows, kInt64, x.device()), {rows, 1});
    Tensor j = reshape(arange(cols, kInt64, x.device()), {1, cols});
    return Tensors{cast(eq(sub(j, i), scalar_tensor(static_cast<double>(k), kInt64, x.device())), t)};
  }));
  r.add(op("Trilu", {"upper"}, [](OpContext& c) {
    const int64_t k = c.has_input(1) ? static_cast<int64_t>(c.input_scalar(1)) : 0;
    return Tensors{c.attr_int("upper", 1) != 0 ? triu(c.input(0), k) : tril(c.input(0), k)};
  }));
  r.add(op("DepthToSpace", {"blocksize", "mode"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    if (x.dim() != 4) c.fail("input must be 4-d, got shape ", shape_str(x.shape()));
    const int64_t b = c.attr_int("blocksize", 1);
    if (b <= 0 || x.size(1) % (b * b) != 0) c.fail("blocksize ", b, " does not divide ", x.size(1), " channels");
    return Tensors{depth_to_space(x, b, c.attr_string("mode", "DCR") == "CRD")};
  }));
  r.add(op("SpaceToDepth", {"blocksize"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    if (x.dim() != 4) c.fail("input must be 4-d, got shape ", shape_str(x.shape()));
    const int64_t b = c.attr_int("blocksize", 1), n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
    if (b <= 0 || h % b != 0 || w % b != 0) c.fail("blocksize ", b, " does not divide ", h, "x", w);
    Tensor t = reshape(x, {n, ch, h / b, b, w / b, b});
    t = permute(t, {0, 3, 5, 1, 2, 4});
    return Tensors{reshape(t, {n, ch * b * b, h / b, w / b})};
  }));
  {
    OpSchema s = op("NonZero", {}, [](OpContext& c) {
      const Tensor& x = c.input(0);
      std::vector<double> v = cast(x, kFloat64).to_vector<double>();
      const Shape& sh = x.shape();
      std::vector<std::vector<int64_t>> coords(sh.size());
      int64_t count = 0;
      for (size_t flat = 0; flat < v.size(); ++flat) {
        if (v[flat] == 0) continue;
        ++count;
        size_t rem = flat;
        for (size_t d = sh.size(); d-- > 0;) {
          coords[d].push_back(static_cast<int64_t>(rem % static_cast<size_t>(sh[d])));
          rem /= static_cast<size_t>(sh[d]);
        }
      }
      std::vector<int64_t> out;
      for (auto& row : coords) out.insert(out.end(), row.begin(), row.end());
      if (sh.empty()) {
        out.assign(static_cast<size_t>(count), 0);
        return Tensors{tensor(out, {1, count}, c.device())};
      }
      return Tensors{tensor(out, {static_cast<int64_t>(sh.size()), count}, c.device())};
    });
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx::ops
