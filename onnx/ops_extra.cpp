// ONNX indexing, sorting, resampling and contraction ops (TopK, CumSum, ScatterND, Resize, Einsum, ...)
// as braid ops.
//
// Index computations that are not differentiable (which elements TopK picks, where ScatterND
// writes, which rows GatherND reads, Resize's sampling positions and weights) are done on the CPU
// over plain vectors; the values then flow through braid's differentiable ops (gather,
// index_select, scatter_add, where, matmul), so gradients reach the data inputs.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

Tensor index_vec(const std::vector<int64_t>& v, Device d) { return tensor(v, {static_cast<int64_t>(v.size())}, d); }

int64_t shape_prod(const Shape& s, size_t from = 0, size_t to = std::string::npos) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, s.size()); ++i) p *= s[i];
  return p;
}

/// Reverses x along axis.
Tensor flip(const Tensor& x, int64_t axis) {
  const int64_t n = x.size(axis);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = n - 1 - i;
  return index_select(x, axis, index_vec(idx, x.device()));
}

/// Integer values of an index tensor (any integer dtype).
std::vector<int64_t> int_values(const OpContext& c, const Tensor& t, const char* what) {
  if (t.dtype() != kInt64 && t.dtype() != kInt32) c.fail(what, " must be int32 or int64, got ", dtype_name(t.dtype()));
  return t.to_vector<int64_t>();
}

int64_t wrap(const OpContext& c, int64_t i, int64_t n, const char* what) {
  if (i < -n || i >= n) c.fail(what, " index ", i, " is out of range for a dimension of size ", n);
  return i < 0 ? i + n : i;
}

// ---- TopK ----

Tensors topk(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() == 0) c.fail("input must have at least one dimension");
  const int64_t axis = norm_axis(c, c.attr_int("axis", -1), x.dim());
  int64_t k = 0;
  if (c.opset() < 10) {
    k = c.attr_int("k", 0);
  } else {
    std::vector<int64_t> kv = c.input_ints(1);
    if (kv.size() != 1) c.fail("K must hold one value, got ", kv.size());
    k = kv[0];
  }
  const int64_t n = x.size(axis);
  if (k < 0 || k > n) c.fail("k ", k, " is out of range for axis ", axis, " of size ", n);
  const bool largest = c.attr_int("largest", 1) != 0;
  const Shape& sh = x.shape();
  const int64_t outer = shape_prod(sh, 0, static_cast<size_t>(axis)), inner = shape_prod(sh, static_cast<size_t>(axis) + 1);
  std::vector<double> v = cast(x, kFloat64).to_vector<double>();
  std::vector<int64_t> out(static_cast<size_t>(outer * k * inner));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return v[static_cast<size_t>((o * n + j) * inner + i)]; };
      std::iota(order.begin(), order.end(), 0);
      // Ties keep the lower index first; NaN counts as the largest value.
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const double va = at(a), vb = at(b);
        if (std::isnan(va) || std::isnan(vb)) return largest ? (std::isnan(va) && !std::isnan(vb)) : (!std::isnan(va) && std::isnan(vb));
        return largest ? va > vb : va < vb;
      });
      for (int64_t r = 0; r < k; ++r) out[static_cast<size_t>((o * k + r) * inner + i)] = order[static_cast<size_t>(r)];
    }
  Shape os = sh;
  os[static_cast<size_t>(axis)] = k;
  Tensor idx = tensor(out, os, c.device());
  if (k == 0) return {zeros(os, x.dtype(), x.device()), idx};
  return {gather(x, axis, idx), idx};
}

// ---- CumSum ----

/// x shifted by k along axis (zeros enter at the front).
Tensor shift(const Tensor& x, int64_t axis, int64_t k) {
  const int64_t n = x.size(axis);
  Shape zs = x.shape();
  zs[static_cast<size_t>(axis)] = std::min(k, n);
  if (k >= n) return zeros(x.shape(), x.dtype(), x.device());
  return concat({zeros(zs, x.dtype(), x.device()), narrow(x, axis, 0, n - k)}, axis);
}

Tensors cumsum(OpContext& c) {
  Tensor x = c.input(0);
  std::vector<int64_t> av = int_values(c, c.input(1), "axis");
  if (av.size() != 1) c.fail("axis must hold one value");
  if (x.dim() == 0) return {x};
  const int64_t axis = norm_axis(c, av[0], x.dim());
  const bool reverse = c.attr_int("reverse", 0) != 0, exclusive = c.attr_int("exclusive", 0) != 0;
  const int64_t n = x.size(axis);
  if (n == 0) return {x};
  if (reverse) x = flip(x, axis);
  // Hillis-Steele scan: log2(n) shifted additions.
  for (int64_t k = 1; k < n; k *= 2) x = x + shift(x, axis, k);
  if (exclusive) x = shift(x, axis, 1);
  if (reverse) x = flip(x, axis);
  return {x};
}

// ---- scatter family ----

/// data2 (rows, cols) with row rows[u] combined with row u of upd2 (nu, cols) by reduction
/// ("none": replaced, the last update wins; "add", "mul", "max", "min").
Tensor scatter_rows(const OpContext& c, const Tensor& data2, const std::vector<int64_t>& rows, const Tensor& upd2,
                    const std::string& reduction) {
  const int64_t nrows = data2.size(0), cols = data2.size(1);
  const auto nu = static_cast<int64_t>(rows.size());
  if (nu == 0) return data2;
  Tensor upd = cast(upd2, data2.dtype());
  auto row_index = [&](const std::vector<int64_t>& r) {
    return contiguous(expand(reshape(index_vec(r, c.device()), {static_cast<int64_t>(r.size()), 1}), {static_cast<int64_t>(r.size()), cols}));
  };
  if (reduction == "add") return scatter_add(data2, 0, row_index(rows), upd);
  if (reduction != "none" && reduction != "mul" && reduction != "max" && reduction != "min")
    c.fail("reduction '", reduction, "' is not one of none, add, mul, max, min");
  // Rounds in which each target row appears at most once: round r takes each row's r-th update
  // ("none" keeps only each row's last update).
  std::vector<std::vector<int64_t>> rounds;
  if (reduction == "none") {
    std::map<int64_t, int64_t> last;
    for (int64_t u = 0; u < nu; ++u) last[rows[static_cast<size_t>(u)]] = u;
    rounds.emplace_back();
    for (const auto& [row, u] : last) rounds[0].push_back(u);
  } else {
    std::map<int64_t, size_t> seen;
    for (int64_t u = 0; u < nu; ++u) {
      size_t& count = seen[rows[static_cast<size_t>(u)]];
      if (rounds.size() <= count) rounds.emplace_back();
      rounds[count++].push_back(u);
    }
  }
  Tensor out = data2;
  for (const std::vector<int64_t>& us : rounds) {
    std::vector<int64_t> rr;
    std::vector<bool> mask(static_cast<size_t>(nrows), false);
    for (int64_t u : us) {
      rr.push_back(rows[static_cast<size_t>(u)]);
      mask[static_cast<size_t>(rows[static_cast<size_t>(u)])] = true;
    }
    Tensor placed = scatter_add(zeros_like(data2), 0, row_index(rr), index_select(upd, 0, index_vec(us, c.device())));
    Tensor m = tensor_bool(mask, {nrows, 1}, c.device());
    Tensor combined = reduction == "none" ? placed
                      : reduction == "mul" ? out * placed
                      : reduction == "max" ? maximum(out, placed)
                                           : minimum(out, placed);
    out = where(m, combined, out);
  }
  return out;
}

Tensors scatter_nd(OpContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& indices = c.input(1);
  const Tensor& updates = c.input(2);
  if (indices.dim() < 1) c.fail("indices must have at least one dimension");
  const Shape& ds = data.shape();
  const int64_t k = indices.size(-1);
  if (k > data.dim()) c.fail("index tuples of ", k, " values for a rank-", data.dim(), " data");
  const int64_t nu = shape_prod(indices.shape(), 0, static_cast<size_t>(indices.dim() - 1));
  const int64_t rest = shape_prod(ds, static_cast<size_t>(k));
  Shape want(indices.shape().begin(), indices.shape().end() - 1);
  want.insert(want.end(), ds.begin() + k, ds.end());
  if (updates.shape() != want) c.fail("updates have shape ", shape_str(updates.shape()), ", expected ", shape_str(want));
  std::vector<int64_t> iv = int_values(c, indices, "indices");
  std::vector<int64_t> rows(static_cast<size_t>(nu), 0);
  for (int64_t u = 0; u < nu; ++u) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j)
      row = row * ds[static_cast<size_t>(j)] + wrap(c, iv[static_cast<size_t>(u * k + j)], ds[static_cast<size_t>(j)], "ScatterND");
    rows[static_cast<size_t>(u)] = row;
  }
  Tensor d2 = reshape(data, {shape_prod(ds, 0, static_cast<size_t>(k)), rest});
  Tensor u2 = reshape(updates, {static_cast<int64_t>(rows.size()), rest});
  return {reshape(scatter_rows(c, d2, rows, u2, c.attr_string("reduction", "none")), ds)};
}

Tensors scatter_elements(OpContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& indices = c.input(1);
  const Tensor& updates = c.input(2);
  const int64_t r = data.dim();
  const int64_t axis = norm_axis(c, c.attr_int("axis", 0), std::max<int64_t>(r, 1));
  if (indices.dim() != r || updates.shape() != indices.shape())
    c.fail("indices (", shape_str(indices.shape()), ") and updates (", shape_str(updates.shape()),
           ") must have one shape of data's rank ", r);
  const Shape& ds = data.shape();
  const Shape& is = indices.shape();
  for (int64_t d = 0; d < r; ++d)
    if (d != axis && is[static_cast<size_t>(d)] > ds[static_cast<size_t>(d)]) c.fail("indices shape ", shape_str(is), " exceeds data shape ", shape_str(ds));
  std::vector<int64_t> iv = int_values(c, indices, "indices");
  std::vector<int64_t> rows(iv.size());
  std::vector<int64_t> pos(static_cast<size_t>(r), 0);
  for (size_t p = 0; p < iv.size(); ++p) {
    int64_t flat = 0;
    for (int64_t d = 0; d < r; ++d) {
      const int64_t coord = d == axis ? wrap(c, iv[p], ds[static_cast<size_t>(d)], "ScatterElements") : pos[static_cast<size_t>(d)];
      flat = flat * ds[static_cast<size_t>(d)] + coord;
    }
    rows[p] = flat;
    for (int64_t d = r - 1; d >= 0; --d) {  // next position in indices, row-major
      if (++pos[static_cast<size_t>(d)] < is[static_cast<size_t>(d)]) break;
      pos[static_cast<size_t>(d)] = 0;
    }
  }
  Tensor d2 = reshape(data, {data.numel(), 1});
  Tensor u2 = reshape(updates, {updates.numel(), 1});
  return {reshape(scatter_rows(c, d2, rows, u2, c.attr_string("reduction", "none")), ds)};
}

Tensors gather_nd(OpContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& indices = c.input(1);
  const int64_t b = c.attr_int("batch_dims", 0);
  if (indices.dim() < 1) c.fail("indices must have at least one dimension");
  const Shape& ds = data.shape();
  const Shape& is = indices.shape();
  const int64_t k = is.back();
  if (b < 0 || b >= indices.dim() || b + k > data.dim()) c.fail("batch_dims ", b, " and index tuples of ", k, " values do not fit data of shape ", shape_str(ds));
  for (int64_t d = 0; d < b; ++d)
    if (ds[static_cast<size_t>(d)] != is[static_cast<size_t>(d)]) c.fail("batch dimensions of data and indices differ");
  const int64_t per_batch_rows = shape_prod(ds, static_cast<size_t>(b), static_cast<size_t>(b + k));
  const int64_t rest = shape_prod(ds, static_cast<size_t>(b + k));
  const int64_t per_batch_idx = shape_prod(is, static_cast<size_t>(b), is.size() - 1);
  const int64_t nidx = shape_prod(is, 0, is.size() - 1);
  std::vector<int64_t> iv = int_values(c, indices, "indices");
  std::vector<int64_t> rows(static_cast<size_t>(nidx));
  for (int64_t u = 0; u < nidx; ++u) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t n = ds[static_cast<size_t>(b + j)];
      row = row * n + wrap(c, iv[static_cast<size_t>(u * k + j)], n, "GatherND");
    }
    const int64_t batch = per_batch_idx == 0 ? 0 : u / per_batch_idx;
    rows[static_cast<size_t>(u)] = batch * per_batch_rows + row;
  }
  Tensor d2 = reshape(data, {shape_prod(ds, 0, static_cast<size_t>(b + k)), rest});
  Shape os(is.begin(), is.end() - 1);
  os.insert(os.end(), ds.begin() + b + k, ds.end());
  return {reshape(index_select(d2, 0, index_vec(rows, c.device())), os)};
}

Tensors one_hot_op(OpContext& c) {
  const Tensor& indices = c.input(0);
  const auto depth = static_cast<int64_t>(c.input_scalar(1));
  const Tensor& values = c.input(2);
  if (values.numel() != 2) c.fail("values must hold two elements (off, on), got shape ", shape_str(values.shape()));
  if (depth <= 0) c.fail("depth must be positive, got ", depth);
  const int64_t axis = norm_axis(c, c.attr_int("axis", -1), indices.dim() + 1);
  std::vector<double> iv = cast(indices, kFloat64).to_vector<double>();
  std::vector<int64_t> idx(iv.size());
  for (size_t i = 0; i < iv.size(); ++i) {
    auto v = static_cast<int64_t>(iv[i]);
    if (v < 0) v += depth;
    idx[i] = v;  // still out of range: the row is all off
  }
  Tensor labels = unsqueeze(tensor(idx, indices.shape(), c.device()), axis);
  Shape rs(static_cast<size_t>(indices.dim() + 1), 1);
  rs[static_cast<size_t>(axis)] = depth;
  Tensor mask = eq(labels, reshape(arange(depth, kInt64, c.device()), rs));
  Tensor flat = reshape(values, {2});
  return {where(mask, reshape(narrow(flat, 0, 1, 1), {}), reshape(narrow(flat, 0, 0, 1), {}))};
}

// ---- Resize / Upsample ----

struct ResizeMode {
  std::string mode = "nearest";  // nearest, linear, cubic
  std::string ctm = "half_pixel";
  std::string nearest_mode = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
};

std::string resize_mode_name(std::string m) {
  for (char& ch : m) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (m == "bilinear" || m == "trilinear") return "linear";
  if (m == "bicubic") return "cubic";
  return m;
}

/// Source coordinate of output position y along one axis (ONNX's reference implementation).
double source_coord(const ResizeMode& rm, double y, double scale, int64_t in, int64_t out, double roi_start, double roi_end) {
  const double out_f = scale * static_cast<double>(in);
  const std::string& m = rm.ctm;
  if (m == "align_corners") return out_f == 1 ? 0.0 : y * static_cast<double>(in - 1) / (out_f - 1);
  if (m == "asymmetric") return y / scale;
  if (m == "tf_crop_and_resize") {
    double x = out_f == 1 ? (roi_end - roi_start) * static_cast<double>(in - 1) / 2
                          : y * (roi_end - roi_start) * static_cast<double>(in - 1) / (out_f - 1);
    return x + roi_start * static_cast<double>(in - 1);
  }
  if (m == "pytorch_half_pixel") return out_f == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
  if (m == "tf_half_pixel_for_nn") return (y + 0.5) / scale;
  if (m == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(out) / out_f;
    const double offset = static_cast<double>(in) / 2 * (1 - adjustment);
    return offset + (y + 0.5) / scale - 0.5;
  }
  return (y + 0.5) / scale - 0.5;  // half_pixel
}

std::vector<double> cubic_coeffs(double r, double a) {
  return {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a, ((a + 2) * r - (a + 3)) * r * r + 1,
          ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
          ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a};
}

/// Resizes axis of x to out elements.
Tensor resize_axis(const Tensor& x, int64_t axis, int64_t out, double scale, const ResizeMode& rm, double roi_start,
                   double roi_end) {
  const int64_t in = x.size(axis);
  const bool crop = rm.ctm == "tf_crop_and_resize";
  std::vector<bool> extrapolated(static_cast<size_t>(out), false);
  bool any_extrapolated = false;
  if (rm.mode == "nearest") {
    std::vector<int64_t> idx(static_cast<size_t>(out));
    for (int64_t y = 0; y < out; ++y) {
      const double xo = source_coord(rm, static_cast<double>(y), scale, in, out, roi_start, roi_end);
      if (crop && (xo < 0 || xo > static_cast<double>(in - 1))) {
        extrapolated[static_cast<size_t>(y)] = any_extrapolated = true;
        idx[static_cast<size_t>(y)] = 0;
        continue;
      }
      double base = std::floor(xo);
      double ratio = xo - base;
      if (ratio == 0) {
        ratio = 1;
        base -= 1;
      }
      bool second;
      if (ratio == 1) second = true;
      else if (rm.nearest_mode == "round_prefer_ceil") second = ratio >= 0.5;
      else if (rm.nearest_mode == "floor") second = false;
      else if (rm.nearest_mode == "ceil") second = true;
      else second = ratio > 0.5;  // round_prefer_floor
      const auto i = static_cast<int64_t>(base) + (second ? 1 : 0);
      idx[static_cast<size_t>(y)] = std::clamp<int64_t>(i, 0, in - 1);
    }
    Tensor r = index_select(x, axis, index_vec(idx, x.device()));
    if (!any_extrapolated) return r;
    Shape ms(static_cast<size_t>(x.dim()), 1);
    ms[static_cast<size_t>(axis)] = out;
    return where(tensor_bool(extrapolated, ms, x.device()), scalar_like(x, rm.extrapolation), r);
  }
  // linear and cubic: out x in weights, applied as a matrix product along the axis.
  const int64_t taps = rm.mode == "cubic" ? 4 : 2;
  std::vector<double> w(static_cast<size_t>(out * in), 0.0), bias(static_cast<size_t>(out), 0.0);
  for (int64_t y = 0; y < out; ++y) {
    const double xo = source_coord(rm, static_cast<double>(y), scale, in, out, roi_start, roi_end);
    if (crop && (xo < 0 || xo > static_cast<double>(in - 1))) {
      bias[static_cast<size_t>(y)] = rm.extrapolation;
      any_extrapolated = true;
      continue;
    }
    double base = std::floor(xo);
    double ratio = xo - base;
    if (ratio == 0) {
      ratio = 1;
      base -= 1;
    }
    std::vector<double> co = taps == 4 ? cubic_coeffs(ratio, rm.cubic_a) : std::vector<double>{1 - ratio, ratio};
    const int64_t first = static_cast<int64_t>(base) - taps / 2 + 1;
    if (rm.exclude_outside) {
      double total = 0;
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t i = first + t;
        if (i < 0 || i >= in) co[static_cast<size_t>(t)] = 0;
        total += co[static_cast<size_t>(t)];
      }
      if (total != 0)
        for (double& v : co) v /= total;
    }
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t i = std::clamp<int64_t>(first + t, 0, in - 1);
      w[static_cast<size_t>(y * in + i)] += co[static_cast<size_t>(t)];
    }
  }
  const bool floating = is_floating(x.dtype());
  Tensor xf = floating ? x : cast(x, kFloat32);
  Tensor wt = cast(tensor(w, {out, in}, x.device()), xf.dtype());
  Tensor moved = transpose(xf, axis, -1);
  Tensor r = matmul(moved, wt.mT());
  if (any_extrapolated) r = r + cast(tensor(bias, {out}, x.device()), xf.dtype());
  r = transpose(r, axis, -1);
  return floating ? r : cast(round(r), x.dtype());
}

std::string resize_check(const Node& n, int64_t) {
  auto get_s = [&](const char* name, const std::string& fallback) {
    auto it = n.attributes.find(name);
    return it == n.attributes.end() ? fallback : it->second.s;
  };
  const std::string mode = resize_mode_name(get_s("mode", "nearest"));
  if (mode != "nearest" && mode != "linear" && mode != "cubic") return detail::cat("mode '", mode, "' is not supported");
  const std::string ctm = get_s("coordinate_transformation_mode", "half_pixel");
  static const std::set<std::string> ctms{"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                          "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"};
  if (ctms.count(ctm) == 0) return detail::cat("coordinate_transformation_mode '", ctm, "' is not supported");
  const std::string nm = get_s("nearest_mode", "round_prefer_floor");
  if (nm != "round_prefer_floor" && nm != "round_prefer_ceil" && nm != "floor" && nm != "ceil")
    return detail::cat("nearest_mode '", nm, "' is not supported");
  auto it = n.attributes.find("antialias");
  if (it != n.attributes.end() && it->second.i != 0) return "Resize with antialias=1 is not supported";
  if (get_s("keep_aspect_ratio_policy", "stretch") != "stretch")
    return detail::cat("keep_aspect_ratio_policy '", get_s("keep_aspect_ratio_policy", ""), "' is not supported");
  return "";
}

/// scales or sizes (one of them) per axis of x -> resized x.
Tensor resize(const OpContext& c, Tensor x, std::vector<double> scales, std::vector<int64_t> sizes, const ResizeMode& rm,
              std::vector<double> roi, const std::vector<int64_t>& axes_attr) {
  const int64_t r = x.dim();
  std::vector<int64_t> axes;
  if (axes_attr.empty()) {
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  } else {
    for (int64_t a : axes_attr) axes.push_back(norm_axis(c, a, r));
  }
  const size_t na = axes.size();
  if (!scales.empty() && scales.size() != na) c.fail("scales has ", scales.size(), " values for ", na, " axes");
  if (!sizes.empty() && sizes.size() != na) c.fail("sizes has ", sizes.size(), " values for ", na, " axes");
  if (scales.empty() && sizes.empty()) c.fail("one of scales and sizes is required");
  std::vector<double> roi_start(static_cast<size_t>(r), 0.0), roi_end(static_cast<size_t>(r), 1.0);
  if (rm.ctm == "tf_crop_and_resize") {
    if (roi.size() != 2 * na) c.fail("roi has ", roi.size(), " values, expected ", 2 * na);
    for (size_t i = 0; i < na; ++i) {
      roi_start[static_cast<size_t>(axes[i])] = roi[i];
      roi_end[static_cast<size_t>(axes[i])] = roi[i + na];
    }
  }
  for (size_t i = 0; i < na; ++i) {
    const int64_t a = axes[i];
    const int64_t in = x.size(a);
    double scale;
    int64_t out;
    if (!scales.empty()) {
      scale = scales[i];
      if (!(scale > 0)) c.fail("scale ", scale, " must be positive");
      out = static_cast<int64_t>(std::floor(scale * static_cast<double>(in)));
    } else {
      out = sizes[i];
      if (out < 0) c.fail("size ", out, " must be non-negative");
      scale = in == 0 ? 1.0 : static_cast<double>(out) / static_cast<double>(in);
    }
    if (out == in && scale == 1.0 && rm.ctm != "tf_crop_and_resize") continue;
    if (in == 0 || out == 0) {
      Shape s = x.shape();
      s[static_cast<size_t>(a)] = out;
      x = zeros(s, x.dtype(), x.device());
      continue;
    }
    x = resize_axis(x, a, out, scale, rm, roi_start[static_cast<size_t>(a)], roi_end[static_cast<size_t>(a)]);
  }
  return x;
}

std::vector<double> float_values(const Tensor& t) { return cast(t, kFloat64).to_vector<double>(); }

Tensors resize_op(OpContext& c) {
  const Tensor& x = c.input(0);
  ResizeMode rm;
  rm.mode = resize_mode_name(c.attr_string("mode", "nearest"));
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (c.opset() < 11) {
    rm.ctm = "asymmetric";
    rm.nearest_mode = "floor";
    scales = float_values(c.input(1));
  } else {
    rm.ctm = c.attr_string("coordinate_transformation_mode", "half_pixel");
    rm.nearest_mode = c.attr_string("nearest_mode", "round_prefer_floor");
    rm.cubic_a = c.attr_float("cubic_coeff_a", -0.75);
    rm.exclude_outside = c.attr_int("exclude_outside", 0) != 0;
    rm.extrapolation = c.attr_float("extrapolation_value", 0.0);
    if (c.has_input(1) && c.input(1).numel() > 0) roi = float_values(c.input(1));
    if (c.has_input(2) && c.input(2).numel() > 0) scales = float_values(c.input(2));
    if (c.has_input(3) && c.input(3).numel() > 0) sizes = c.input_ints(3);
    if (!scales.empty() && !sizes.empty()) c.fail("only one of scales and sizes may be given");
  }
  if (rm.mode != "nearest" && rm.mode != "linear" && rm.mode != "cubic")
    throw NotImplementedError(detail::cat(c.node().label(), ": mode '", rm.mode, "' is not supported"));
  return {resize(c, x, scales, sizes, rm, roi, c.attr_ints("axes"))};
}

Tensors upsample_op(OpContext& c) {
  ResizeMode rm;
  rm.mode = resize_mode_name(c.attr_string("mode", "nearest"));
  rm.ctm = "asymmetric";
  rm.nearest_mode = "floor";
  std::vector<double> scales = c.opset() >= 9 ? float_values(c.input(1)) : c.attr_floats("scales");
  if (rm.mode != "nearest" && rm.mode != "linear")
    throw NotImplementedError(detail::cat(c.node().label(), ": mode '", rm.mode, "' is not supported"));
  return {resize(c, c.input(0), scales, {}, rm, {}, {})};
}

// ---- Einsum ----

constexpr int kEllipsisBase = 52;

int label_id(const OpContext& c, char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return 26 + (ch - 'a');
  c.fail("equation has an invalid character '", std::string(1, ch), "'");
}

/// Labels of one term; an ellipsis becomes -1 (expanded later).
std::vector<int> parse_term(const OpContext& c, const std::string& term) {
  std::vector<int> out;
  bool ellipsis = false;
  for (size_t i = 0; i < term.size(); ++i) {
    if (term[i] == '.') {
      if (ellipsis || term.compare(i, 3, "...") != 0) c.fail("malformed ellipsis in term '", term, "'");
      ellipsis = true;
      out.push_back(-1);
      i += 2;
      continue;
    }
    out.push_back(label_id(c, term[i]));
  }
  return out;
}

struct Operand {
  Tensor t;
  std::vector<int> labels;
};

/// Takes the diagonal of the axes that share a label until every label appears once.
void take_diagonals(const OpContext& c, Operand& op) {
  for (;;) {
    size_t p = 0, q = 0;
    bool found = false;
    for (size_t i = 0; i < op.labels.size() && !found; ++i)
      for (size_t j = i + 1; j < op.labels.size() && !found; ++j)
        if (op.labels[i] == op.labels[j]) {
          p = i;
          q = j;
          found = true;
        }
    if (!found) return;
    const int64_t n = op.t.size(static_cast<int64_t>(p));
    if (op.t.size(static_cast<int64_t>(q)) != n) c.fail("repeated label covers axes of sizes ", n, " and ", op.t.size(static_cast<int64_t>(q)));
    std::vector<int64_t> order;
    std::vector<int> labels;
    for (size_t i = 0; i < op.labels.size(); ++i)
      if (i != p && i != q) {
        order.push_back(static_cast<int64_t>(i));
        labels.push_back(op.labels[i]);
      }
    order.push_back(static_cast<int64_t>(p));
    order.push_back(static_cast<int64_t>(q));
    Tensor t = permute(op.t, order);
    Shape s(t.shape().begin(), t.shape().end() - 2);
    s.push_back(n * n);
    std::vector<int64_t> diag(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) diag[static_cast<size_t>(i)] = i * (n + 1);
    op.t = index_select(reshape(t, s), -1, index_vec(diag, c.device()));
    labels.push_back(op.labels[p]);
    op.labels = labels;
  }
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

/// Sums out the labels of op that are not in keep.
void sum_out(Operand& op, const std::vector<int>& keep) {
  std::vector<int64_t> axes;
  std::vector<int> labels;
  for (size_t i = 0; i < op.labels.size(); ++i) {
    if (contains(keep, op.labels[i])) labels.push_back(op.labels[i]);
    else axes.push_back(static_cast<int64_t>(i));
  }
  if (axes.empty()) return;
  op.t = sum(op.t, axes, false);
  op.labels = labels;
}

int64_t label_size(const Operand& op, int l) {
  for (size_t i = 0; i < op.labels.size(); ++i)
    if (op.labels[i] == l) return op.t.size(static_cast<int64_t>(i));
  return 1;
}

/// Contracts two operands with matmul, keeping the labels in keep.
Operand contract(Operand a, Operand b, const std::vector<int>& keep) {
  std::vector<int> keep_a = keep, keep_b = keep;
  keep_a.insert(keep_a.end(), b.labels.begin(), b.labels.end());
  keep_b.insert(keep_b.end(), a.labels.begin(), a.labels.end());
  sum_out(a, keep_a);
  sum_out(b, keep_b);
  std::vector<int> batch, con, a_only, b_only;
  for (int l : a.labels) {
    if (contains(b.labels, l)) (contains(keep, l) ? batch : con).push_back(l);
    else a_only.push_back(l);
  }
  for (int l : b.labels)
    if (!contains(a.labels, l)) b_only.push_back(l);
  auto arrange = [](const Operand& op, const std::vector<std::vector<int>>& groups) {
    std::vector<int64_t> order;
    for (const auto& g : groups)
      for (int l : g)
        for (size_t i = 0; i < op.labels.size(); ++i)
          if (op.labels[i] == l) order.push_back(static_cast<int64_t>(i));
    return permute(op.t, order);
  };
  auto size_of = [](const Operand& op, const std::vector<int>& g) {
    int64_t p = 1;
    for (int l : g) p *= label_size(op, l);
    return p;
  };
  const int64_t nb = size_of(a, batch), m = size_of(a, a_only), k = size_of(a, con), n = size_of(b, b_only);
  Tensor ta = reshape(arrange(a, {batch, a_only, con}), {nb, m, k});
  Tensor tb = reshape(arrange(b, {batch, con, b_only}), {nb, k, n});
  Tensor prod_ab = matmul(ta, tb);
  Shape os;
  Operand r;
  for (int l : batch) os.push_back(label_size(a, l));
  for (int l : a_only) os.push_back(label_size(a, l));
  for (int l : b_only) os.push_back(label_size(b, l));
  r.labels = batch;
  r.labels.insert(r.labels.end(), a_only.begin(), a_only.end());
  r.labels.insert(r.labels.end(), b_only.begin(), b_only.end());
  r.t = reshape(prod_ab, os);
  return r;
}

Tensors einsum(OpContext& c) {
  std::string equation;
  for (char ch : c.attr_string("equation", ""))
    if (!std::isspace(static_cast<unsigned char>(ch))) equation += ch;
  const size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != c.num_inputs()) c.fail("equation '", equation, "' has ", terms.size(), " operands, the node has ", c.num_inputs(), " inputs");
  // Expand ellipses: their axes get labels kEllipsisBase.., right-aligned across operands.
  std::vector<std::vector<int>> raw;
  int64_t ell = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    raw.push_back(parse_term(c, terms[i]));
    const int64_t named = static_cast<int64_t>(raw.back().size()) - (contains(raw.back(), -1) ? 1 : 0);
    if (contains(raw.back(), -1)) ell = std::max(ell, c.input(i).dim() - named);
    else if (named != c.input(i).dim())
      c.fail("term '", terms[i], "' has ", named, " labels for an input of rank ", c.input(i).dim());
  }
  std::vector<Operand> ops;
  for (size_t i = 0; i < terms.size(); ++i) {
    Operand op;
    op.t = c.input(i);
    const int64_t named = static_cast<int64_t>(raw[i].size()) - (contains(raw[i], -1) ? 1 : 0);
    const int64_t e = op.t.dim() - named;
    if (e < 0) c.fail("term '", terms[i], "' has more labels than input ", i, " has axes");
    for (int l : raw[i]) {
      if (l != -1) {
        op.labels.push_back(l);
        continue;
      }
      for (int64_t j = 0; j < e; ++j) op.labels.push_back(kEllipsisBase + static_cast<int>(ell - e + j));
    }
    ops.push_back(op);
  }
  std::vector<int> out_labels;
  if (arrow != std::string::npos) {
    for (int l : parse_term(c, equation.substr(arrow + 2))) {
      if (l != -1) {
        out_labels.push_back(l);
        continue;
      }
      for (int64_t j = 0; j < ell; ++j) out_labels.push_back(kEllipsisBase + static_cast<int>(j));
    }
  } else {
    for (int64_t j = 0; j < ell; ++j) out_labels.push_back(kEllipsisBase + static_cast<int>(j));
    std::map<int, int> count;
    for (const auto& op : ops)
      for (int l : op.labels)
        if (l < kEllipsisBase) count[l]++;
    for (const auto& [l, n] : count)
      if (n == 1) out_labels.push_back(l);
  }
  // Label sizes (broadcasting size-1 axes), diagonals, then pairwise contraction.
  std::map<int, int64_t> sizes;
  for (auto& op : ops) {
    take_diagonals(c, op);
    for (size_t i = 0; i < op.labels.size(); ++i) {
      int64_t& s = sizes[op.labels[i]];
      const int64_t n = op.t.size(static_cast<int64_t>(i));
      if (s > 1 && n != 1 && n != s) c.fail("label sizes ", s, " and ", n, " do not broadcast");
      s = std::max(s, n);
    }
  }
  for (auto& op : ops) {
    Shape want;
    for (int l : op.labels) want.push_back(sizes[l]);
    if (want != op.t.shape()) op.t = expand(op.t, want);
  }
  for (int l : out_labels)
    if (sizes.count(l) == 0) c.fail("output label is not in any input");
  Operand acc = ops[0];
  for (size_t i = 1; i < ops.size(); ++i) {
    std::vector<int> keep = out_labels;
    for (size_t j = i + 1; j < ops.size(); ++j) keep.insert(keep.end(), ops[j].labels.begin(), ops[j].labels.end());
    acc = contract(acc, ops[i], keep);
  }
  sum_out(acc, out_labels);
  std::vector<int64_t> order;
  for (int l : out_labels)
    for (size_t i = 0; i < acc.labels.size(); ++i)
      if (acc.labels[i] == l) order.push_back(static_cast<int64_t>(i));
  if (order.size() != acc.labels.size()) c.fail("output labels must be distinct");
  return {order.empty() ? acc.t : permute(acc.t, order)};
}

// ---- normalisation and sequence ops ----

Tensors reverse_sequence(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() < 2) c.fail("input must have at least 2 dimensions");
  const int64_t ta = norm_axis(c, c.attr_int("time_axis", 0), x.dim(), "time_axis");
  const int64_t ba = norm_axis(c, c.attr_int("batch_axis", 1), x.dim(), "batch_axis");
  if (ta == ba) c.fail("time_axis and batch_axis must differ");
  std::vector<int64_t> lens = int_values(c, c.input(1), "sequence_lens");
  const int64_t nb = x.size(ba), nt = x.size(ta);
  if (static_cast<int64_t>(lens.size()) != nb) c.fail("sequence_lens has ", lens.size(), " values for a batch of ", nb);
  for (int64_t l : lens)
    if (l < 0 || l > nt) c.fail("sequence length ", l, " is out of range for ", nt, " steps");
  // gather's index along time_axis, shaped like x.
  const Shape& s = x.shape();
  std::vector<int64_t> idx(static_cast<size_t>(x.numel()));
  std::vector<int64_t> pos(s.size(), 0);
  for (size_t p = 0; p < idx.size(); ++p) {
    const int64_t t = pos[static_cast<size_t>(ta)], l = lens[static_cast<size_t>(pos[static_cast<size_t>(ba)])];
    idx[p] = t < l ? l - 1 - t : t;
    for (size_t d = s.size(); d-- > 0;) {
      if (++pos[d] < s[d]) break;
      pos[d] = 0;
    }
  }
  return {gather(x, ta, tensor(idx, s, c.device()))};
}

Tensors compress(OpContext& c) {
  Tensor x = c.input(0);
  std::vector<double> cond = float_values(c.input(1));
  int64_t axis = 0;
  if (c.has_attr("axis")) axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
  else x = reshape(x, {x.numel()});
  std::vector<int64_t> keep;
  for (size_t i = 0; i < cond.size() && static_cast<int64_t>(i) < x.size(axis); ++i)
    if (cond[i] != 0) keep.push_back(static_cast<int64_t>(i));
  return {index_select(x, axis, index_vec(keep, c.device()))};
}

// ---- control flow ----

Tensors if_op(OpContext& c) {
  const bool cond = c.input_scalar(0) != 0;
  const Attribute& branch = c.attr(cond ? "then_branch" : "else_branch");
  if (!branch.g) c.fail(cond ? "then_branch" : "else_branch", " is not a graph");
  return c.run_subgraph(*branch.g, {});
}

// Stacks a loop's per-iteration outputs; float16/bfloat16 (storage types, which braid's stack does
// not take) go through float32, which holds them exactly.
Tensor stack_iterations(const std::vector<Tensor>& v, int64_t axis) {
  const DType t = v[0].dtype();
  if (is_compute_type(t)) return stack(v, axis);
  std::vector<Tensor> wide;
  for (const Tensor& x : v) wide.push_back(cast(x, kFloat32));
  return cast(stack(wide, axis), t);
}

Tensor empty_scan_output(OpContext& c, const ValueInfo& v, Device device) {
  if (!v.has_type)
    c.fail("ran no iterations, and its body leaves the type of scan output '", v.name,
           "' unspecified, so its empty result has no element type; give the body output a type");
  Shape s{0};
  for (const Dim& d : v.shape) s.push_back(std::max<int64_t>(d.size, 0));
  return zeros(s, v.dtype, device);
}

Tensors loop_op(OpContext& c) {
  const Attribute& body_attr = c.attr("body");
  if (!body_attr.g) c.fail("body is not a graph");
  const Graph& body = *body_attr.g;
  int64_t trip = std::numeric_limits<int64_t>::max();
  if (c.has_input(0)) trip = static_cast<int64_t>(c.input_scalar(0));
  bool cond = c.has_input(1) ? c.input_scalar(1) != 0 : true;
  std::vector<Tensor> carried;
  for (size_t i = 2; i < c.num_inputs(); ++i) carried.push_back(c.input(i));
  const size_t nc = carried.size();
  if (body.outputs.size() < 1 + nc) c.fail("body has ", body.outputs.size(), " outputs for ", nc, " loop-carried values");
  const size_t ns = body.outputs.size() - 1 - nc;
  std::vector<std::vector<Tensor>> scans(ns);
  for (int64_t i = 0; i < trip && cond; ++i) {
    std::vector<Tensor> ins{scalar_tensor(static_cast<double>(i), kInt64, c.device()), tensor_bool({cond}, {}, c.device())};
    ins.insert(ins.end(), carried.begin(), carried.end());
    std::vector<Tensor> outs = c.run_subgraph(body, ins);
    cond = outs[0].item() != 0;
    for (size_t j = 0; j < nc; ++j) carried[j] = outs[1 + j];
    for (size_t j = 0; j < ns; ++j) scans[j].push_back(outs[1 + nc + j]);
  }
  Tensors out = carried;
  for (size_t j = 0; j < ns; ++j)
    out.push_back(scans[j].empty() ? empty_scan_output(c, body.outputs[1 + nc + j], c.device()) : stack_iterations(scans[j], 0));
  return out;
}

/// Scan (opset 9+) over states and scan inputs; returns final states then scan outputs.
Tensors scan_core(OpContext& c, const Graph& body, std::vector<Tensor> state, const std::vector<Tensor>& inputs,
                  std::vector<int64_t> in_axes, const std::vector<int64_t>& in_dirs, const std::vector<int64_t>& out_axes,
                  const std::vector<int64_t>& out_dirs) {
  const auto n = static_cast<int64_t>(state.size());
  const auto m = static_cast<int64_t>(inputs.size());
  const int64_t k = static_cast<int64_t>(body.outputs.size()) - n;
  if (k < 0) c.fail("body has fewer outputs than state variables");
  if (static_cast<int64_t>(in_axes.size()) != m || static_cast<int64_t>(in_dirs.size()) != m ||
      static_cast<int64_t>(out_axes.size()) != k || static_cast<int64_t>(out_dirs.size()) != k)
    c.fail("scan axes/directions attributes have the wrong number of values");
  int64_t len = -1;
  for (int64_t j = 0; j < m; ++j) {
    const Tensor& t = inputs[static_cast<size_t>(j)];
    in_axes[static_cast<size_t>(j)] = norm_axis(c, in_axes[static_cast<size_t>(j)], t.dim(), "scan_input_axes");
    const int64_t l = t.size(in_axes[static_cast<size_t>(j)]);
    if (len >= 0 && l != len) c.fail("scan inputs differ in sequence length (", len, " and ", l, ")");
    len = l;
  }
  std::vector<std::vector<Tensor>> outs(static_cast<size_t>(k));
  for (int64_t t = 0; t < len; ++t) {
    std::vector<Tensor> ins = state;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t at = in_dirs[static_cast<size_t>(j)] != 0 ? len - 1 - t : t;
      ins.push_back(inputs[static_cast<size_t>(j)].select(in_axes[static_cast<size_t>(j)], at));
    }
    std::vector<Tensor> res = c.run_subgraph(body, ins);
    for (int64_t i = 0; i < n; ++i) state[static_cast<size_t>(i)] = res[static_cast<size_t>(i)];
    for (int64_t j = 0; j < k; ++j) outs[static_cast<size_t>(j)].push_back(res[static_cast<size_t>(n + j)]);
  }
  Tensors result = state;
  for (int64_t j = 0; j < k; ++j) {
    auto& v = outs[static_cast<size_t>(j)];
    if (v.empty()) {
      result.push_back(empty_scan_output(c, body.outputs[static_cast<size_t>(n + j)], c.device()));
      continue;
    }
    if (out_dirs[static_cast<size_t>(j)] != 0) std::reverse(v.begin(), v.end());
    const int64_t axis = norm_axis(c, out_axes[static_cast<size_t>(j)], v[0].dim() + 1, "scan_output_axes");
    result.push_back(stack_iterations(v, axis));
  }
  return result;
}

Tensors scan_op(OpContext& c) {
  const Attribute& body_attr = c.attr("body");
  if (!body_attr.g) c.fail("body is not a graph");
  const Graph& body = *body_attr.g;
  const int64_t m = c.attr_int("num_scan_inputs", 0);
  const bool v8 = c.opset() < 9;  // opset 8: optional sequence_lens first, a batch axis 0 everywhere
  const size_t first = v8 ? 1 : 0;
  const auto ni = static_cast<int64_t>(c.num_inputs()) - static_cast<int64_t>(first);
  if (m <= 0 || m > ni) c.fail("num_scan_inputs ", m, " is out of range for ", ni, " inputs");
  const int64_t n = ni - m;  // state variables
  const int64_t k = static_cast<int64_t>(body.outputs.size()) - n;
  std::vector<Tensor> state, inputs;
  for (int64_t i = 0; i < n; ++i) state.push_back(c.input(first + static_cast<size_t>(i)));
  for (int64_t j = 0; j < m; ++j) inputs.push_back(c.input(first + static_cast<size_t>(n + j)));
  if (!v8)
    return scan_core(c, body, state, inputs, c.attr_ints("scan_input_axes", std::vector<int64_t>(static_cast<size_t>(m), 0)),
                     c.attr_ints("scan_input_directions", std::vector<int64_t>(static_cast<size_t>(m), 0)),
                     c.attr_ints("scan_output_axes", std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0)),
                     c.attr_ints("scan_output_directions", std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0)));
  // Opset 8: run each batch entry on its own and stack the results.
  const std::vector<int64_t> dirs = c.attr_ints("directions", std::vector<int64_t>(static_cast<size_t>(m), 0));
  if (inputs.empty() || inputs[0].dim() < 2) c.fail("scan inputs need a batch and a sequence axis");
  const int64_t batch = inputs[0].size(0), len = inputs[0].size(1);
  if (c.has_input(0))
    for (int64_t l : c.input_ints(0))
      if (l != len)
        throw NotImplementedError(detail::cat(c.node().label(), ": Scan with sequence_lens shorter than the sequence is not supported"));
  std::vector<std::vector<Tensor>> per_batch(static_cast<size_t>(n + std::max<int64_t>(k, 0)));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> sb, ib;
    for (const Tensor& t : state) sb.push_back(t.select(0, b));
    for (const Tensor& t : inputs) ib.push_back(t.select(0, b));
    Tensors r = scan_core(c, body, sb, ib, std::vector<int64_t>(static_cast<size_t>(m), 0), dirs,
                          std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0),
                          std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0));
    for (size_t i = 0; i < r.size(); ++i) per_batch[i].push_back(r[i]);
  }
  Tensors result;
  for (auto& v : per_batch) result.push_back(stack(v, 0));
  return result;
}

// ---- losses ----

/// NegativeLogLikelihoodLoss over log-probabilities x (N, C, d...) and integer targets (N, d...).
Tensor nll_loss(OpContext& c, const Tensor& x, const Tensor& target, const Tensor& weight) {
  if (x.dim() < 2) c.fail("input must be (N, C, ...), got shape ", shape_str(x.shape()));
  const int64_t classes = x.size(1);
  std::vector<int64_t> tv = int_values(c, target, "target");
  const bool has_ignore = c.has_attr("ignore_index");
  const int64_t ignore = c.attr_int("ignore_index", 0);
  std::vector<bool> keep(tv.size(), true);
  for (size_t i = 0; i < tv.size(); ++i) {
    if (has_ignore && tv[i] == ignore) {
      keep[i] = false;
      tv[i] = 0;
      continue;
    }
    if (tv[i] < 0 || tv[i] >= classes) c.fail("target ", tv[i], " is out of range for ", classes, " classes");
  }
  Tensor t = tensor(tv, target.shape(), c.device());
  Tensor picked = squeeze(gather(x, 1, unsqueeze(t, 1)), 1);
  Tensor w = cast(tensor_bool(keep, target.shape(), c.device()), x.dtype());
  if (weight.defined()) w = w * reshape(index_select(weight, 0, reshape(t, {t.numel()})), target.shape());
  Tensor loss = -picked * w;
  const std::string reduction = c.attr_string("reduction", "mean");
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  if (reduction == "mean") return sum(loss) / sum(w);
  c.fail("reduction '", reduction, "' is not one of none, sum, mean");
}

// ---- windows ----

Tensors window(OpContext& c, int kind) {
  const auto size = static_cast<int64_t>(c.input_scalar(0));
  if (size < 0) c.fail("size must be non-negative");
  const bool periodic = c.attr_int("periodic", 1) != 0;
  const double n1 = static_cast<double>(periodic ? size : size - 1);
  const double pi = 3.14159265358979323846;
  std::vector<double> v(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const double a = 2 * pi * static_cast<double>(i) / n1;
    double w;
    if (kind == 0) w = 0.5 - 0.5 * std::cos(a);                                    // Hann
    else if (kind == 1) w = 25.0 / 46.0 - (1 - 25.0 / 46.0) * std::cos(a);          // Hamming
    else w = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a);                     // Blackman
    v[static_cast<size_t>(i)] = w;
  }
  return {cast(tensor(v, {size}, c.device()), dtype_from_onnx(c, c.attr_int("output_datatype", 1)))};
}

// ---- Unique and NonMaxSuppression (index outputs computed on the CPU) ----

Tensors unique(OpContext& c) {
  Tensor x = c.input(0);
  const bool has_axis = c.has_attr("axis");
  int64_t axis = 0;
  if (has_axis) axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
  else x = reshape(x, {x.numel()});
  const int64_t n = x.size(axis);
  // Each slice along axis as a vector of values, compared lexicographically.
  Tensor moved = contiguous(transpose(x, 0, axis));
  std::vector<double> flat = cast(moved, kFloat64).to_vector<double>();
  const int64_t width = n == 0 ? 0 : static_cast<int64_t>(flat.size()) / n;
  auto slice_of = [&](int64_t i) {
    return std::vector<double>(flat.begin() + i * width, flat.begin() + (i + 1) * width);
  };
  std::map<std::vector<double>, int64_t> first;  // slice -> first index
  std::vector<int64_t> order;                    // first indices in order of appearance
  std::vector<std::vector<double>> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    keys[static_cast<size_t>(i)] = slice_of(i);
    if (first.emplace(keys[static_cast<size_t>(i)], i).second) order.push_back(i);
  }
  if (c.attr_int("sorted", 1) != 0) {
    order.clear();
    for (const auto& [key, i] : first) order.push_back(i);
  }
  std::map<std::vector<double>, int64_t> position;
  for (size_t p = 0; p < order.size(); ++p) position[keys[static_cast<size_t>(order[p])]] = static_cast<int64_t>(p);
  std::vector<int64_t> inverse(static_cast<size_t>(n)), counts(order.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = position[keys[static_cast<size_t>(i)]];
    inverse[static_cast<size_t>(i)] = p;
    counts[static_cast<size_t>(p)]++;
  }
  return {index_select(x, axis, index_vec(order, c.device())), index_vec(order, c.device()), index_vec(inverse, c.device()), index_vec(counts, c.device())};
}

bool nms_suppress(const std::vector<double>& b, int64_t i, int64_t j, bool center, double iou_threshold) {
  auto box = [&](int64_t k, double& x0, double& x1, double& y0, double& y1) {
    const double* p = &b[static_cast<size_t>(k * 4)];
    if (!center) {
      y0 = std::min(p[0], p[2]);
      y1 = std::max(p[0], p[2]);
      x0 = std::min(p[1], p[3]);
      x1 = std::max(p[1], p[3]);
    } else {
      x0 = p[0] - p[2] / 2;
      x1 = p[0] + p[2] / 2;
      y0 = p[1] - p[3] / 2;
      y1 = p[1] + p[3] / 2;
    }
  };
  double ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;
  box(i, ax0, ax1, ay0, ay1);
  box(j, bx0, bx1, by0, by1);
  const double ix0 = std::max(ax0, bx0), ix1 = std::min(ax1, bx1), iy0 = std::max(ay0, by0), iy1 = std::min(ay1, by1);
  if (ix1 <= ix0 || iy1 <= iy0) return false;
  const double inter = (ix1 - ix0) * (iy1 - iy0);
  const double a1 = (ax1 - ax0) * (ay1 - ay0), a2 = (bx1 - bx0) * (by1 - by0), uni = a1 + a2 - inter;
  if (inter <= 0 || a1 <= 0 || a2 <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

Tensors non_max_suppression(OpContext& c) {
  const Tensor& boxes = c.input(0);
  const Tensor& scores = c.input(1);
  if (boxes.dim() != 3 || boxes.size(2) != 4 || scores.dim() != 3 || scores.size(0) != boxes.size(0) || scores.size(2) != boxes.size(1))
    c.fail("boxes (", shape_str(boxes.shape()), ") and scores (", shape_str(scores.shape()), ") do not match");
  int64_t max_out = 0;
  double iou = 0;
  std::optional<double> score_threshold;
  if (c.has_input(2) && c.input(2).numel() > 0) max_out = std::max<int64_t>(static_cast<int64_t>(c.input(2).to_vector<int64_t>()[0]), 0);
  if (c.has_input(3) && c.input(3).numel() > 0) iou = float_values(c.input(3))[0];
  if (c.has_input(4) && c.input(4).numel() > 0) score_threshold = float_values(c.input(4))[0];
  const bool center = c.attr_int("center_point_box", 0) != 0;
  const int64_t nb = boxes.size(0), nbox = boxes.size(1), ncls = scores.size(1);
  std::vector<double> bv = float_values(boxes), sv = float_values(scores);
  std::vector<int64_t> out;
  for (int64_t b = 0; b < nb; ++b) {
    std::vector<double> bb(bv.begin() + b * nbox * 4, bv.begin() + (b + 1) * nbox * 4);
    for (int64_t k = 0; k < ncls; ++k) {
      const double* sc = &sv[static_cast<size_t>((b * ncls + k) * nbox)];
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < nbox; ++i)
        if (!score_threshold || sc[i] > *score_threshold) cand.push_back(i);
      // Highest score first; equal scores: lower index first.
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return sc[i] > sc[j]; });
      std::vector<int64_t> sel;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(sel.size()) >= max_out) break;
        bool keep = true;
        for (int64_t j : sel)
          if (nms_suppress(bb, i, j, center, iou)) {
            keep = false;
            break;
          }
        if (keep) {
          sel.push_back(i);
          out.insert(out.end(), {b, k, i});
        }
      }
    }
  }
  return {tensor(out, {static_cast<int64_t>(out.size() / 3), 3}, c.device())};
}

OpSchema control(const char* type, std::vector<std::string> attrs, std::function<Tensors(OpContext&)> fn, int64_t since) {
  OpSchema s = op(type, std::move(attrs), std::move(fn), since);
  s.half_via_float = false;
  return s;
}

// ---- GridSample and RoiAlign: sampling taps found on the CPU, values gathered differentiably ----

/// One output point's taps: (flat source index, weight).
using Taps = std::vector<std::pair<int64_t, double>>;

/// x (N, C, S...) sampled at points: out (n, C, p) where point q of group b is the weighted sum
/// (or, with take_max, the max of the weighted values) of its taps, whose indices are flat over
/// x's (N, S...). Taps are padded to the widest point (weight 0 for a sum, a repeat for a max).
Tensor sample_taps(const Tensor& x, const std::vector<Taps>& points, int64_t n, int64_t p, bool take_max = false) {
  const int64_t ch = x.size(1);
  size_t width = 1;
  for (const Taps& t : points) width = std::max(width, t.size());
  const auto tw = static_cast<int64_t>(width);
  std::vector<int64_t> idx(static_cast<size_t>(n * p) * width, 0);
  std::vector<double> wt(idx.size(), 0.0);
  for (size_t q = 0; q < points.size(); ++q)
    for (size_t t = 0; t < width; ++t) {
      const Taps& pt = points[q];
      if (t < pt.size()) {
        idx[t * points.size() + q] = pt[t].first;
        wt[t * points.size() + q] = pt[t].second;
      } else if (take_max && !pt.empty()) {
        idx[t * points.size() + q] = pt[0].first;
        wt[t * points.size() + q] = pt[0].second;
      }
    }
  // (N, C, S) -> (1, C, N * S): every sample's plane side by side, so one gather serves all.
  const int64_t nx = x.size(0);
  Tensor src = reshape(permute(reshape(x, {nx, ch, x.numel() / std::max<int64_t>(nx * ch, 1)}), {1, 0, 2}), {1, ch, -1});
  const int64_t m = tw * n * p;
  Tensor index = contiguous(expand(reshape(tensor(idx, {m}, x.device()), {1, 1, m}), {1, ch, m}));
  Tensor vals = reshape(gather(src, 2, index), {ch, tw, n * p});
  Tensor w = reshape(cast(tensor(wt, {tw, n * p}, x.device()), x.dtype()), {1, tw, n * p});
  Tensor y = take_max ? amax(vals * w, {1}) : sum(vals * w, {1});  // (C, N * P)
  return permute(reshape(y, {ch, n, p}), {1, 0, 2});
}

double gs_reflect(double x, double lo, double hi) {
  const double rng = hi - lo;
  if (x < lo) {
    const double dx = lo - x;
    const auto k = static_cast<int64_t>(dx / rng);
    const double r = dx - static_cast<double>(k) * rng;
    return k % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const auto k = static_cast<int64_t>(dx / rng);
    const double r = dx - static_cast<double>(k) * rng;
    return k % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void cubic_coeffs_gs(double x, double* c) {
  const double a = -0.75;
  x = std::abs(x);
  c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

std::string grid_sample_mode(std::string m) {
  if (m == "bilinear") return "linear";
  if (m == "bicubic") return "cubic";
  return m;
}

Tensors grid_sample(OpContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& grid = c.input(1);
  const int64_t nd = x.dim() - 2;
  if (nd < 1 || grid.dim() != x.dim() || grid.size(-1) != nd || grid.size(0) != x.size(0))
    c.fail("X of shape ", shape_str(x.shape()), " and Grid of shape ", shape_str(grid.shape()), " do not match");
  const std::string mode = grid_sample_mode(c.attr_string("mode", c.opset() >= 20 ? "linear" : "bilinear"));
  const std::string padding = c.attr_string("padding_mode", "zeros");
  const bool align = c.attr_int("align_corners", 0) != 0;
  if (mode != "linear" && mode != "nearest" && mode != "cubic") c.fail("mode '", mode, "' is not supported");
  if (padding != "zeros" && padding != "border" && padding != "reflection") c.fail("padding_mode '", padding, "' is not supported");
  const int64_t n = x.size(0);
  std::vector<int64_t> dims, strides(static_cast<size_t>(nd), 1);
  for (int64_t i = 0; i < nd; ++i) dims.push_back(x.size(2 + i));
  for (int64_t i = nd - 2; i >= 0; --i) strides[static_cast<size_t>(i)] = strides[static_cast<size_t>(i + 1)] * dims[static_cast<size_t>(i + 1)];
  const int64_t plane = nd > 0 ? strides[0] * dims[0] : 1;
  Shape out{n, x.size(1)};
  int64_t p = 1;
  for (int64_t i = 1; i < grid.dim() - 1; ++i) {
    out.push_back(grid.size(i));
    p *= grid.size(i);
  }
  const std::vector<float> g = cast(grid, kFloat32).to_vector<float>();
  // The source index a tap reads, or -1 for a zero (padding_mode zeros outside the input).
  auto pixel = [&](int64_t i, size_t d, double lo, double hi) -> int64_t {
    const int64_t size = dims[d];
    if (padding == "zeros") return (i >= 0 && i < size) ? i : -1;
    if (padding == "border") return std::clamp<int64_t>(i, 0, size - 1);
    return static_cast<int64_t>(gs_reflect(static_cast<double>(i), lo, hi));
  };
  std::vector<Taps> points(static_cast<size_t>(n * p));
  std::vector<std::vector<std::pair<int64_t, double>>> per_dim(static_cast<size_t>(nd));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t q = 0; q < p; ++q) {
      for (int64_t i = 0; i < nd; ++i) {
        const auto d = static_cast<size_t>(i);
        const float v = g[static_cast<size_t>(((b * p + q) * nd) + (nd - 1 - i))];  // the grid lists x (W) first
        const auto len = static_cast<float>(dims[d]);
        double xi = align ? static_cast<float>((v + 1) / 2.0f * (len - 1)) : static_cast<float>(((v + 1) * len - 1) / 2.0f);
        const double lo = align ? 0.0 : -0.5, hi = align ? static_cast<double>(dims[d]) - 1 : static_cast<double>(dims[d]) - 0.5;
        if (mode == "nearest") xi = std::nearbyint(xi);
        if (xi < lo || xi > hi) {
          if (padding == "border") xi = std::clamp(xi, 0.0, static_cast<double>(dims[d] - 1));
          else if (padding == "reflection") xi = gs_reflect(xi, lo, hi);
        }
        auto& taps = per_dim[d];
        taps.clear();
        if (mode == "nearest") {
          taps.push_back({pixel(static_cast<int64_t>(static_cast<int32_t>(xi)), d, lo, hi), 1.0});
        } else {
          const double f = std::floor(xi), t = xi - f;
          const auto x0 = static_cast<int64_t>(f);
          if (mode == "linear") {
            taps.push_back({pixel(x0, d, lo, hi), 1 - t});
            taps.push_back({pixel(x0 + 1, d, lo, hi), t});
          } else {
            double cc[4];
            cubic_coeffs_gs(t, cc);
            for (int64_t k = 0; k < 4; ++k) taps.push_back({pixel(x0 - 1 + k, d, lo, hi), cc[k]});
          }
        }
      }
      // The product of the per-axis taps.
      Taps& pt = points[static_cast<size_t>(b * p + q)];
      std::vector<size_t> at(static_cast<size_t>(nd), 0);
      while (true) {
        int64_t index = b * plane;
        double w = 1;
        bool zero = false;
        for (size_t d = 0; d < static_cast<size_t>(nd); ++d) {
          const auto& tp = per_dim[d][at[d]];
          if (tp.first < 0) zero = true;
          index += tp.first * strides[d];
          w *= tp.second;
        }
        if (!zero && w != 0) pt.push_back({index, w});
        size_t d = static_cast<size_t>(nd);
        while (d > 0 && ++at[d - 1] == per_dim[d - 1].size()) at[--d] = 0;
        if (d == 0) break;
      }
    }
  return {reshape(sample_taps(x, points, n, p), out)};
}

Tensors roi_align(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() != 4) c.fail("X must be (N, C, H, W), got shape ", shape_str(x.shape()));
  const Tensor& rois_t = c.input(1);
  if (rois_t.dim() != 2 || rois_t.size(1) != 4) c.fail("rois must be (num_rois, 4), got shape ", shape_str(rois_t.shape()));
  const std::vector<double> rois = cast(rois_t, kFloat64).to_vector<double>();
  const std::vector<int64_t> batch = cast(c.input(2), kInt64).to_vector<int64_t>();
  const int64_t r = rois_t.size(0);
  if (static_cast<int64_t>(batch.size()) != r) c.fail("batch_indices needs ", r, " values");
  const int64_t ph = c.attr_int("output_height", 1), pw = c.attr_int("output_width", 1);
  const int64_t ratio = c.attr_int("sampling_ratio", 0);
  const double scale = c.attr_float("spatial_scale", 1.0);
  const std::string mode = c.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") c.fail("mode '", mode, "' is not one of avg, max");
  const bool half_pixel = c.opset() >= 16 && c.attr_string("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  const int64_t height = x.size(2), width = x.size(3), plane = height * width;
  std::vector<Taps> points(static_cast<size_t>(r * ph * pw));
  for (int64_t k = 0; k < r; ++k) {
    const int64_t b = batch[static_cast<size_t>(k)];
    if (b < 0 || b >= x.size(0)) c.fail("batch index ", b, " is out of range for ", x.size(0), " images");
    const double off = half_pixel ? 0.5 : 0.0;
    const double* roi = &rois[static_cast<size_t>(k * 4)];
    const double sw = roi[0] * scale - off, sh = roi[1] * scale - off;
    double rw = roi[2] * scale - off - sw, rh = roi[3] * scale - off - sh;
    if (!half_pixel) {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    const double bh = rh / static_cast<double>(ph), bw = rw / static_cast<double>(pw);
    const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / static_cast<double>(ph)));
    const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / static_cast<double>(pw)));
    const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
    for (int64_t i = 0; i < ph; ++i)
      for (int64_t j = 0; j < pw; ++j) {
        std::map<int64_t, double> merged;
        Taps& pt = points[static_cast<size_t>((k * ph + i) * pw + j)];
        for (int64_t iy = 0; iy < gh; ++iy)
          for (int64_t ix = 0; ix < gw; ++ix) {
            double y = sh + static_cast<double>(i) * bh + (static_cast<double>(iy) + 0.5) * bh / static_cast<double>(gh);
            double xx = sw + static_cast<double>(j) * bw + (static_cast<double>(ix) + 0.5) * bw / static_cast<double>(gw);
            std::array<std::pair<int64_t, double>, 4> t{};
            if (!(y < -1.0 || y > static_cast<double>(height) || xx < -1.0 || xx > static_cast<double>(width))) {
              y = std::max(y, 0.0);
              xx = std::max(xx, 0.0);
              int64_t yl = static_cast<int64_t>(y), xl = static_cast<int64_t>(xx), yh, xh;
              if (yl >= height - 1) {
                yh = yl = height - 1;
                y = static_cast<double>(yl);
              } else {
                yh = yl + 1;
              }
              if (xl >= width - 1) {
                xh = xl = width - 1;
                xx = static_cast<double>(xl);
              } else {
                xh = xl + 1;
              }
              const double ly = y - static_cast<double>(yl), lx = xx - static_cast<double>(xl), hy = 1 - ly, hx = 1 - lx;
              t = {{{yl * width + xl, hy * hx}, {yl * width + xh, hy * lx}, {yh * width + xl, ly * hx}, {yh * width + xh, ly * lx}}};
            }
            for (auto& [idx, w] : t) {
              if (mode == "avg") merged[b * plane + idx] += w / count;
              else pt.push_back({b * plane + idx, w});
            }
          }
        if (mode == "avg")
          for (const auto& [idx, w] : merged) pt.push_back({idx, w});
      }
  }
  // Taps are flat over (N, H, W): gather from all images at once and lay the rois out as one batch.
  Tensor y = sample_taps(x, points, 1, r * ph * pw, mode == "max");  // (1, C, R * ph * pw)
  return {permute(reshape(y, {x.size(1), r, ph, pw}), {1, 0, 2, 3})};
}

// ---- Det: Gaussian elimination with partial pivoting (pivots chosen on the CPU) ----

Tensors det_op(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() < 2 || x.size(-1) != x.size(-2)) c.fail("input must be (..., M, M), got shape ", shape_str(x.shape()));
  const int64_t m = x.size(-1);
  const Shape batch_shape(x.shape().begin(), x.shape().end() - 2);
  int64_t nb = 1;
  for (int64_t d : batch_shape) nb *= d;
  Tensor a = reshape(x, {nb, m, m});
  Tensor det = ones({nb}, x.dtype(), x.device());
  std::vector<double> sign(static_cast<size_t>(nb), 1.0);
  for (int64_t k = m; k > 0; --k) {  // a is (nb, k, k)
    const std::vector<double> col = cast(narrow(a, 2, 0, 1), kFloat64).to_vector<double>();
    std::vector<int64_t> perm(static_cast<size_t>(nb * k));
    bool swapped = false;
    for (int64_t b = 0; b < nb; ++b) {
      int64_t piv = 0;
      for (int64_t i = 1; i < k; ++i)
        if (std::abs(col[static_cast<size_t>(b * k + i)]) > std::abs(col[static_cast<size_t>(b * k + piv)])) piv = i;
      for (int64_t i = 0; i < k; ++i) perm[static_cast<size_t>(b * k + i)] = i;
      if (piv != 0) {
        std::swap(perm[static_cast<size_t>(b * k)], perm[static_cast<size_t>(b * k + piv)]);
        sign[static_cast<size_t>(b)] = -sign[static_cast<size_t>(b)];
        swapped = true;
      }
    }
    if (swapped) a = gather(a, 1, contiguous(expand(reshape(tensor(perm, {nb * k}, c.device()), {nb, k, 1}), {nb, k, k})));
    Tensor pivot = reshape(narrow(narrow(a, 1, 0, 1), 2, 0, 1), {nb});
    det = det * pivot;
    if (k > 1) {
      Tensor zero = scalar_like(pivot, 0);
      Tensor safe = where(eq(pivot, zero), scalar_like(pivot, 1), pivot);  // a zero pivot already made det 0
      Tensor rest = narrow(narrow(a, 1, 1, k - 1), 2, 1, k - 1);
      Tensor lower = narrow(narrow(a, 1, 1, k - 1), 2, 0, 1);
      Tensor upper = narrow(narrow(a, 1, 0, 1), 2, 1, k - 1);
      a = rest - lower * upper / reshape(safe, {nb, 1, 1});
    }
  }
  det = det * cast(tensor(sign, {nb}, c.device()), det.dtype());
  return {reshape(det, batch_shape)};
}

// ---- BitShift (unsigned integers, widened to int32/int64 by the loader) ----

Tensors bit_shift(OpContext& c) {
  const Tensor &a = c.input(0), &b = c.input(1);
  if (is_floating(a.dtype()) || is_floating(b.dtype()) || a.dtype() == kBool) c.fail("BitShift needs integer inputs");
  const std::string dir = c.attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") c.fail("direction must be LEFT or RIGHT, got '", dir, "'");
  const Shape s = broadcast_shapes(a.shape(), b.shape(), "BitShift");
  const std::vector<int64_t> av = contiguous(expand(cast(a, kInt64), s)).to_vector<int64_t>();
  const std::vector<int64_t> bv = contiguous(expand(cast(b, kInt64), s)).to_vector<int64_t>();
  std::vector<int64_t> out(av.size());
  for (size_t i = 0; i < av.size(); ++i) {
    const auto v = static_cast<uint64_t>(av[i]);
    const auto k = static_cast<uint64_t>(bv[i]);
    const uint64_t r = k >= 64 ? 0 : (dir == "LEFT" ? v << k : v >> k);
    out[i] = static_cast<int64_t>(r);
  }
  return {cast(tensor(out, s, c.device()), promote_types(a.dtype(), b.dtype()))};
}

// ---- DFT, STFT, MelWeightMatrix ----

/// The DFT of a (..., L, 1 or 2) signal along `axis` (an axis of the leading part), as (..., n, 2),
/// by a matmul with the cos/sin matrix: zero-padded or truncated to n, onesided keeping n / 2 + 1
/// bins, inverse scaled by 1 / n.
Tensor dft(const OpContext& c, const Tensor& x, int64_t axis, int64_t n, bool inverse, bool onesided) {
  if (x.dim() < 2 || (x.size(-1) != 1 && x.size(-1) != 2))
    c.fail("the signal's last axis must hold 1 (real) or 2 (complex) values, got shape ", shape_str(x.shape()));
  const int64_t rank = x.dim();
  if (axis < 0 || axis >= rank - 1) c.fail("axis ", axis, " is not a signal axis for shape ", shape_str(x.shape()));
  if (n <= 0) c.fail("dft_length must be positive");
  // Move the transformed axis next to the complex axis: (..., L, comp).
  std::vector<int64_t> order;
  for (int64_t d = 0; d < rank - 1; ++d)
    if (d != axis) order.push_back(d);
  order.push_back(axis);
  order.push_back(rank - 1);
  Tensor t = permute(x, order);
  const int64_t len = t.size(-2);
  if (len > n) t = narrow(t, t.dim() - 2, 0, n);
  else if (len < n) t = pad(t, {0, 0, 0, n - len});
  const int64_t bins = onesided ? n / 2 + 1 : n;
  std::vector<double> cs(static_cast<size_t>(n * bins)), sn(cs.size());
  const double pi = 3.14159265358979323846;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < bins; ++k) {
      const double ang = 2 * pi * static_cast<double>((j * k) % n) / static_cast<double>(n);
      cs[static_cast<size_t>(j * bins + k)] = std::cos(ang);
      sn[static_cast<size_t>(j * bins + k)] = (inverse ? 1.0 : -1.0) * std::sin(ang);
    }
  Tensor cm = cast(tensor(cs, {n, bins}, c.device()), t.dtype()), sm = cast(tensor(sn, {n, bins}, c.device()), t.dtype());
  Tensor re = squeeze(narrow(t, t.dim() - 1, 0, 1), t.dim() - 1);
  Tensor out_re = matmul(re, cm), out_im = matmul(re, sm);
  if (t.size(-1) == 2) {
    Tensor im = squeeze(narrow(t, t.dim() - 1, 1, 1), t.dim() - 1);
    out_re = out_re - matmul(im, sm);
    out_im = out_im + matmul(im, cm);
  }
  if (inverse) {
    out_re = out_re / static_cast<double>(n);
    out_im = out_im / static_cast<double>(n);
  }
  Tensor y = stack({out_re, out_im}, -1);  // (..., bins, 2) with the axis second to last
  std::vector<int64_t> back(static_cast<size_t>(rank));
  for (size_t i = 0; i < order.size(); ++i) back[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return permute(y, back);
}

Tensors dft_op(OpContext& c) {
  const Tensor& x = c.input(0);
  int64_t axis = c.opset() >= 20 ? (c.has_input(2) ? static_cast<int64_t>(c.input_scalar(2)) : -2) : c.attr_int("axis", 1);
  axis = norm_axis(c, axis, x.dim());
  const bool inverse = c.attr_int("inverse", 0) != 0, onesided = c.attr_int("onesided", 0) != 0;
  if (inverse && onesided) throw NotImplementedError("DFT: an inverse onesided (real output) DFT is not supported yet");
  const int64_t n = c.has_input(1) ? static_cast<int64_t>(c.input_scalar(1)) : x.size(axis);
  return {dft(c, x, axis, n, inverse, onesided)};
}

Tensors stft_op(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dim() != 3) c.fail("signal must be (batch, length, 1 or 2), got shape ", shape_str(x.shape()));
  const auto step = static_cast<int64_t>(c.input_scalar(1));
  Tensor win = c.has_input(2) ? c.input(2) : Tensor();
  int64_t frame = c.has_input(3) ? static_cast<int64_t>(c.input_scalar(3)) : (win.defined() ? win.size(0) : x.size(1));
  if (step <= 0 || frame <= 0 || frame > x.size(1)) c.fail("frame_step ", step, " / frame_length ", frame, " do not fit a signal of ", x.size(1));
  if (win.defined() && (win.dim() != 1 || win.size(0) != frame)) c.fail("window must have frame_length ", frame, " values");
  const int64_t frames = 1 + (x.size(1) - frame) / step;
  std::vector<int64_t> idx;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t j = 0; j < frame; ++j) idx.push_back(f * step + j);
  Tensor t = reshape(index_select(x, 1, tensor(idx, {frames * frame}, c.device())), {x.size(0), frames, frame, x.size(2)});
  if (win.defined()) t = t * reshape(cast(win, t.dtype()), {1, 1, frame, 1});
  return {dft(c, t, 2, frame, false, c.attr_int("onesided", 1) != 0)};
}

Tensors mel_weight_matrix(OpContext& c) {
  const auto bins = static_cast<int64_t>(c.input_scalar(0));
  const auto dft_length = static_cast<int64_t>(c.input_scalar(1));
  const auto rate = static_cast<int64_t>(c.input_scalar(2));
  const double lo = c.input_scalar(3), hi = c.input_scalar(4);
  if (bins <= 0 || dft_length <= 0 || rate <= 0) c.fail("num_mel_bins, dft_length and sample_rate must be positive");
  const int64_t spec = dft_length / 2 + 1;
  const double lo_mel = 2595 * std::log10(1 + lo / 700), hi_mel = 2595 * std::log10(1 + hi / 700);
  const double step = (hi_mel - lo_mel) / static_cast<double>(bins + 2);  // as the ONNX reference
  std::vector<int64_t> f(static_cast<size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    const double hz = 700 * (std::pow(10.0, (static_cast<double>(i) * step + lo_mel) / 2595) - 1);
    f[static_cast<size_t>(i)] = static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(rate)));
  }
  std::vector<double> out(static_cast<size_t>(spec * bins), 0.0);
  auto set = [&](int64_t j, int64_t i, double v) {
    if (j < 0 || j >= spec) c.fail("mel bin edge ", j, " is outside the ", spec, " spectrogram bins");
    out[static_cast<size_t>(j * bins + i)] = v;
  };
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t l = f[static_cast<size_t>(i)], m = f[static_cast<size_t>(i + 1)], h = f[static_cast<size_t>(i + 2)];
    if (m == l) set(m, i, 1);
    else
      for (int64_t j = l; j <= m; ++j) set(j, i, static_cast<double>(j - l) / static_cast<double>(m - l));
    if (h > m)
      for (int64_t j = m; j < h; ++j) set(j, i, static_cast<double>(h - j) / static_cast<double>(h - m));
  }
  return {cast(tensor(out, {spec, bins}, c.device()), dtype_from_onnx(c, c.attr_int("output_datatype", 1)))};
}

}  // namespace

void register_extra_ops(OpRegistry& r) {
  r.add(op("TopK", {"axis", "k", "largest", "sorted"}, topk));
  r.add(op("CumSum", {"exclusive", "reverse"}, cumsum, 11));
  r.add(op("ScatterND", {"reduction"}, scatter_nd, 11));
  r.add(op("ScatterElements", {"axis", "reduction"}, scatter_elements, 11));
  r.add(op("Scatter", {"axis"}, scatter_elements, 9));
  r.add(op("GatherND", {"batch_dims"}, gather_nd, 11));
  r.add(op("OneHot", {"axis"}, one_hot_op, 9));
  {
    OpSchema s = op("Resize", {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
                               "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy"},
                    resize_op, 10);
    s.check = resize_check;
    r.add(std::move(s));
  }
  {
    OpSchema s = op("Upsample", {"mode", "scales"}, upsample_op, 7);
    s.check = [](const Node& n, int64_t) -> std::string {
      auto it = n.attributes.find("mode");
      const std::string m = it == n.attributes.end() ? "nearest" : resize_mode_name(it->second.s);
      if (m != "nearest" && m != "linear") return detail::cat("mode '", m, "' is not supported");
      return "";
    };
    r.add(std::move(s));
  }
  r.add(op("Einsum", {"equation"}, einsum, 12));
  r.add(op("MeanVarianceNormalization", {"axes"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    std::vector<int64_t> axes = c.attr_ints("axes", {0, 2, 3});
    for (int64_t& a : axes) a = norm_axis(c, a, x.dim());
    Tensor m = mean(x, axes, true);
    return Tensors{(x - m) / (sqrt(var(x, axes, 0, true)) + 1e-9)};
  }, 9));
  r.add(op("LpNormalization", {"axis", "p"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = norm_axis(c, c.attr_int("axis", -1), x.dim());
    const int64_t p = c.attr_int("p", 2);
    // A zero vector stays zero (the reference's x / norm with norm 0 replaced by 1), not NaN.
    auto safe = [](const Tensor& norm) { return where(eq(norm, zeros_like(norm)), ones_like(norm), norm); };
    if (p == 1) return Tensors{x / safe(sum(abs(x), {axis}, true))};
    if (p == 2) return Tensors{x / safe(sqrt(sum(square(x), {axis}, true)))};
    c.fail("p must be 1 or 2, got ", p);
  }));
  r.add(op("ReverseSequence", {"batch_axis", "time_axis"}, reverse_sequence, 10));
  r.add(op("Compress", {"axis"}, compress, 9));
  r.add(control("If", {"then_branch", "else_branch"}, if_op, 1));
  r.add(control("Loop", {"body"}, loop_op, 1));
  r.add(control("Scan", {"body", "num_scan_inputs", "scan_input_axes", "scan_input_directions", "scan_output_axes",
                         "scan_output_directions", "directions"},
                scan_op, 8));
  r.add(op("NegativeLogLikelihoodLoss", {"ignore_index", "reduction"}, [](OpContext& c) {
    return Tensors{nll_loss(c, c.input(0), c.input(1), c.has_input(2) ? c.input(2) : Tensor())};
  }, 12));
  r.add(op("SoftmaxCrossEntropyLoss", {"ignore_index", "reduction"}, [](OpContext& c) {
    Tensor log_prob = log_softmax(c.input(0), 1);
    return Tensors{nll_loss(c, log_prob, c.input(1), c.has_input(2) ? c.input(2) : Tensor()), log_prob};
  }, 12));
  r.add(op("HannWindow", {"output_datatype", "periodic"}, [](OpContext& c) { return window(c, 0); }, 17));
  r.add(op("HammingWindow", {"output_datatype", "periodic"}, [](OpContext& c) { return window(c, 1); }, 17));
  r.add(op("BlackmanWindow", {"output_datatype", "periodic"}, [](OpContext& c) { return window(c, 2); }, 17));
  r.add(op("Unique", {"axis", "sorted"}, unique, 11));
  r.add(op("NonMaxSuppression", {"center_point_box"}, non_max_suppression, 10));
  r.add(op("GridSample", {"align_corners", "mode", "padding_mode"}, grid_sample, 16));
  r.add(op("RoiAlign", {"coordinate_transformation_mode", "mode", "output_height", "output_width", "sampling_ratio",
                        "spatial_scale"}, roi_align, 10));
  r.add(op("Det", {}, det_op, 11));
  {
    OpSchema s = op("BitShift", {"direction"}, bit_shift, 11);
    s.half_via_float = false;
    s.until_opset = 27;  // opset 28 defines shifts of signed types and by the type's width or more
    r.add(std::move(s));
  }
  r.add(op("DFT", {"axis", "inverse", "onesided"}, dft_op, 17));
  r.add(op("STFT", {"onesided"}, stft_op, 17));
  {
    OpSchema s = op("MelWeightMatrix", {"output_datatype"}, mel_weight_matrix, 17);
    s.half_via_float = false;
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx::ops
