// ONNX resampling ops as braid ops: Resize and Upsample, GridSample and RoiAlign. Sampling
// positions and weights are computed on the CPU over plain vectors; the values flow through braid's
// differentiable ops (gather, index_select, matmul), so gradients reach the data input.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

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

/// Output position y's source coordinate as the cell [base, base + 1] and the ratio in it (an exact
/// integer coordinate k as base k - 1, ratio 1); false when tf_crop_and_resize puts it outside.
bool source_cell(const ResizeMode& rm, int64_t y, double scale, int64_t in, int64_t out, double roi_start,
                 double roi_end, double& base, double& ratio) {
  const double xo = source_coord(rm, static_cast<double>(y), scale, in, out, roi_start, roi_end);
  if (rm.ctm == "tf_crop_and_resize" && (xo < 0 || xo > static_cast<double>(in - 1))) return false;
  base = std::floor(xo);
  ratio = xo - base;
  if (ratio == 0) {
    ratio = 1;
    base -= 1;
  }
  return true;
}

/// The input index each of out positions takes along an axis of in elements in nearest mode;
/// extrapolated (out flags) marks positions outside the input (tf_crop_and_resize), which get 0.
std::vector<int64_t> nearest_indices(const ResizeMode& rm, int64_t in, int64_t out, double scale, double roi_start,
                                     double roi_end, std::vector<bool>& extrapolated) {
  extrapolated.assign(static_cast<size_t>(out), false);
  std::vector<int64_t> idx(static_cast<size_t>(out));
  for (int64_t y = 0; y < out; ++y) {
    double base, ratio;
    if (!source_cell(rm, y, scale, in, out, roi_start, roi_end, base, ratio)) {
      extrapolated[static_cast<size_t>(y)] = true;
      idx[static_cast<size_t>(y)] = 0;
      continue;
    }
    bool second;
    if (ratio == 1)
      second = true;
    else if (rm.nearest_mode == "round_prefer_ceil")
      second = ratio >= 0.5;
    else if (rm.nearest_mode == "floor")
      second = false;
    else if (rm.nearest_mode == "ceil")
      second = true;
    else
      second = ratio > 0.5;  // round_prefer_floor
    const auto i = static_cast<int64_t>(base) + (second ? 1 : 0);
    idx[static_cast<size_t>(y)] = std::clamp<int64_t>(i, 0, in - 1);
  }
  return idx;
}

/// Resizes axis of x to out elements.
Tensor resize_axis(const Tensor& x, int64_t axis, int64_t out, double scale, const ResizeMode& rm, double roi_start,
                   double roi_end) {
  const int64_t in = x.size(axis);
  std::vector<bool> extrapolated(static_cast<size_t>(out), false);
  bool any_extrapolated = false;
  if (rm.mode == "nearest") {
    const std::vector<int64_t> idx = nearest_indices(rm, in, out, scale, roi_start, roi_end, extrapolated);
    for (bool e : extrapolated) any_extrapolated = any_extrapolated || e;
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
    double base, ratio;
    if (!source_cell(rm, y, scale, in, out, roi_start, roi_end, base, ratio)) {
      bias[static_cast<size_t>(y)] = rm.extrapolation;
      any_extrapolated = true;
      continue;
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

// Note [Nearest upsampling by whole factors]
// A feature pyramid upsamples channels-last activations by whole factors in nearest mode (PP-OCR's
// detector: x2 three times, x2, x4 and x8 before a Concat). Where every resized axis is H or W and
// output position y takes input y / f along it, the result is x with each pixel repeated f_h x f_w
// times: one copy of a broadcast view in x's memory order (rows of C values), channels-last as x
// is. Gathering along H and then W (index_select) made two passes and an NCHW result, which the Add
// after it then met in the other layout (measured: benchmarks/README.md, "What changed what", run
// S).
Tensor nearest_by_factors(const Tensor& x, const std::vector<int64_t>& axes, const std::vector<int64_t>& outs,
                          const std::vector<double>& scales, const ResizeMode& rm, const std::vector<double>& roi_start,
                          const std::vector<double>& roi_end) {
  if (rm.mode != "nearest" || rm.ctm == "tf_crop_and_resize" || x.dim() != 4 || x.is_contiguous() ||
      !x.is_channels_last())
    return Tensor();
  int64_t factor[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i], in = x.size(a), out = outs[i];
    if (out == in && scales[i] == 1.0) continue;
    if ((a != 2 && a != 3) || in == 0 || out % in != 0) return Tensor();
    const int64_t f = out / in;
    std::vector<bool> extrapolated;
    const std::vector<int64_t> idx = nearest_indices(rm, in, out, scales[i], roi_start[static_cast<size_t>(a)],
                                                     roi_end[static_cast<size_t>(a)], extrapolated);
    for (int64_t y = 0; y < out; ++y)
      if (idx[static_cast<size_t>(y)] != y / f) return Tensor();
    factor[a] = f;
  }
  const int64_t n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3), fh = factor[2], fw = factor[3];
  const Tensor tiles = x.permute({0, 2, 3, 1}).unsqueeze(2).unsqueeze(4).expand({n, h, fh, w, fw, ch});
  return contiguous(tiles).view({n, h * fh, w * fw, ch}).permute({0, 3, 1, 2});
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
  std::vector<int64_t> outs(na);
  std::vector<double> axis_scales(na);
  for (size_t i = 0; i < na; ++i) {
    const int64_t in = x.size(axes[i]);
    if (!scales.empty()) {
      axis_scales[i] = scales[i];
      if (!(scales[i] > 0)) c.fail("scale ", scales[i], " must be positive");
      outs[i] = static_cast<int64_t>(std::floor(scales[i] * static_cast<double>(in)));
    } else {
      outs[i] = sizes[i];
      if (outs[i] < 0) c.fail("size ", outs[i], " must be non-negative");
      axis_scales[i] = in == 0 ? 1.0 : static_cast<double>(outs[i]) / static_cast<double>(in);
    }
  }
  if (Tensor y = nearest_by_factors(x, axes, outs, axis_scales, rm, roi_start, roi_end); y.defined()) return y;
  for (size_t i = 0; i < na; ++i) {
    const int64_t a = axes[i];
    const int64_t in = x.size(a);
    const double scale = axis_scales[i];
    const int64_t out = outs[i];
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

}  // namespace

void register_sampling_ops(OpRegistry& r) {
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
  r.add(op("GridSample", {"align_corners", "mode", "padding_mode"}, grid_sample, 16));
  r.add(op("RoiAlign", {"coordinate_transformation_mode", "mode", "output_height", "output_width", "sampling_ratio",
                        "spatial_scale"}, roi_align, 10));
}

}  // namespace braid::onnx::ops
