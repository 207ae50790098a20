// ONNX neural-network ops (convolution, pooling, normalisation, Gemm/MatMul, Dropout) as braid ops.
#include <array>
#include <cmath>
#include <limits>

#include "braid/autograd.h"
#include "braid/conv.h"
#include "braid/nn/layers.h"
#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

struct Window {
  std::vector<int64_t> kernel, stride, dilation, begin, end;  // per spatial axis
};

/// Kernel, strides, dilations and per-axis padding (auto_pad resolved) for an input of spatial
/// sizes `in`.
Window window(const OpContext& c, const std::vector<int64_t>& kernel, const Shape& in) {
  const size_t k = kernel.size();
  Window w;
  w.kernel = kernel;
  // Read in place (this runs on every run of every Conv and pool): an absent attribute is all ones or
  // zeros, a single int one value, and anything else attr_ints' error.
  const auto ints = [&c](const char* name, std::vector<int64_t>& out, size_t n, int64_t fill) {
    const Attribute* a = c.find_attr(name);
    if (a == nullptr)
      out.assign(n, fill);
    else if (a->kind == Attribute::Kind::Ints)
      out = a->ints;
    else if (a->kind == Attribute::Kind::Int)
      out.assign(1, a->i);
    else
      out = c.attr_ints(name);  // throws, naming the kind
  };
  ints("strides", w.stride, k, 1);
  ints("dilations", w.dilation, k, 1);
  if (w.stride.size() != k || w.dilation.size() != k) c.fail("strides/dilations need ", k, " values");
  for (size_t i = 0; i < k; ++i)
    if (w.stride[i] <= 0 || w.dilation[i] <= 0 || w.kernel[i] <= 0)
      c.fail("kernel, strides and dilations must be positive");
  const Attribute* pad_mode = c.find_attr("auto_pad");
  const std::string auto_pad = pad_mode == nullptr ? "NOTSET" : c.attr_string("auto_pad", "NOTSET");
  w.begin.assign(k, 0);
  w.end.assign(k, 0);
  if (auto_pad == "NOTSET") {
    const Attribute* given = c.find_attr("pads");
    if (given == nullptr) return w;
    const std::vector<int64_t> one =
        given->kind == Attribute::Kind::Ints ? std::vector<int64_t>() : c.attr_ints("pads");
    const std::vector<int64_t>& pads = given->kind == Attribute::Kind::Ints ? given->ints : one;
    if (pads.size() != 2 * k) c.fail("pads needs ", 2 * k, " values, got ", pads.size());
    for (size_t i = 0; i < k; ++i) {
      w.begin[i] = pads[i];
      w.end[i] = pads[i + k];
      if (w.begin[i] < 0 || w.end[i] < 0) c.fail("pads must be non-negative");
    }
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < k; ++i) {
      const int64_t out = (in[i] + w.stride[i] - 1) / w.stride[i];
      const int64_t total = std::max<int64_t>((out - 1) * w.stride[i] + (w.kernel[i] - 1) * w.dilation[i] + 1 - in[i], 0);
      const int64_t small = total / 2;
      w.begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      w.end[i] = total - w.begin[i];
    }
  } else if (auto_pad != "VALID") {
    c.fail("auto_pad '", auto_pad, "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  }
  return w;
}

Shape spatial(const Tensor& x) { return Shape(x.shape().begin() + 2, x.shape().end()); }

/// 1-d inputs run as 2-d with a height of 1.
Tensor to_2d(const Tensor& x) { return unsqueeze(x, 2); }
void window_to_2d(Window& w) {
  w.kernel.insert(w.kernel.begin(), 1);
  w.stride.insert(w.stride.begin(), 1);
  w.dilation.insert(w.dilation.begin(), 1);
  w.begin.insert(w.begin.begin(), 0);
  w.end.insert(w.end.begin(), 0);
}

void check_rank(const OpContext& c, const Tensor& x, const char* what) {
  if (x.dim() < 3 || x.dim() > 5)
    c.fail(what, " needs an (N, C, L), (N, C, H, W) or (N, C, D, H, W) input, got shape ", shape_str(x.shape()));
}


/// The window without its first (depth) axis: what the 2-d op applies to each depth slice.
Window drop_depth(const Window& w) {
  Window r;
  r.kernel.assign(w.kernel.begin() + 1, w.kernel.end());
  r.stride.assign(w.stride.begin() + 1, w.stride.end());
  r.dilation.assign(w.dilation.begin() + 1, w.dilation.end());
  r.begin.assign(w.begin.begin() + 1, w.begin.end());
  r.end.assign(w.end.begin() + 1, w.end.end());
  return r;
}

/// (N, C, D, H, W) <-> (N * D, C, H, W): depth slices as a batch of 2-d images.
Tensor depth_to_batch(const Tensor& x) {
  return reshape(permute(x, {0, 2, 1, 3, 4}), {x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
Tensor batch_to_depth(const Tensor& y, int64_t n) {
  return permute(reshape(y, {n, y.size(0) / n, y.size(1), y.size(2), y.size(3)}), {0, 2, 1, 3, 4});
}

/// 3-d convolution as a sum over the kernel's depth taps of 2-d convolutions of depth slices.
Tensor conv3d(const OpContext& c, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window& w, int64_t group) {
  const int64_t n = x.size(0);
  Tensor xp = x;
  if (w.begin[0] != 0 || w.end[0] != 0) xp = pad(x, {0, 0, 0, 0, w.begin[0], w.end[0]});
  const int64_t k = weight.size(2), s = w.stride[0], d = w.dilation[0];
  const int64_t od = (xp.size(2) - d * (k - 1) - 1) / s + 1;
  if (od <= 0) c.fail("the kernel (depth ", k, ", dilation ", d, ") is larger than the padded input depth ", xp.size(2));
  const Window w2 = drop_depth(w);
  Tensor y;
  for (int64_t t = 0; t < k; ++t) {
    std::vector<int64_t> idx(static_cast<size_t>(od));
    for (int64_t o = 0; o < od; ++o) idx[static_cast<size_t>(o)] = o * s + t * d;
    Tensor slices = depth_to_batch(index_select(xp, 2, index_vec(idx, xp.device())));
    Tensor wt = squeeze(narrow(weight, 2, t, 1), 2);
    Tensor yt = conv2d(slices, wt, Tensor(), w2.stride, {w2.begin[0], w2.end[0], w2.begin[1], w2.end[1]}, w2.dilation, group);
    y = y.defined() ? y + yt : yt;
  }
  y = batch_to_depth(y, n);
  if (bias.defined()) y = y + reshape(bias, {1, bias.numel(), 1, 1, 1});
  return y;
}

std::vector<Tensor> conv(OpContext& c) { return conv_fused(c, FusedActivation()); }

}  // namespace

Tensors conv_fused(OpContext& c, const FusedActivation& act) {
  return {conv_of(c, c.input(0), c.input(1), c.has_input(2) ? c.input(2) : Tensor(), act)};
}

Tensor conv_of(const OpContext& c, Tensor x, Tensor weight, const Tensor& bias, const FusedActivation& act) {
  check_rank(c, x, "Conv");
  if (weight.dim() != x.dim()) c.fail("weight of shape ", shape_str(weight.shape()), " does not match input of shape ", shape_str(x.shape()));
  const std::vector<int64_t> kernel(weight.shape().begin() + 2, weight.shape().end());
  // kernel_shape is optional and redundant; one that disagrees with the weight is a broken file
  // (onnxruntime refuses it too), not something to run with either of the two.
  const Attribute* given = c.find_attr("kernel_shape");
  if (given != nullptr &&
      !(given->kind == Attribute::Kind::Ints ? given->ints == kernel : c.attr_ints("kernel_shape") == kernel))
    c.fail("attribute kernel_shape ", shape_str(c.attr_ints("kernel_shape")), " disagrees with the weight's spatial ",
           "shape ", shape_str(kernel), " (weight ", shape_str(weight.shape()), ")");
  Window w = window(c, kernel, spatial(x));
  const int64_t group = c.attr_int("group", 1);
  if (x.dim() == 5) {
    Tensor y = conv3d(c, x, weight, bias, w, group);
    if (!act.name.empty()) c.fail("no fused activation for a 3-d Conv");  // the executor fuses 1-d and 2-d only
    return y;
  }
  const bool one_d = x.dim() == 3;
  if (one_d) {
    x = to_2d(x);
    weight = to_2d(weight);
    window_to_2d(w);
  }
  const std::vector<int64_t> pads{w.begin[0], w.end[0], w.begin[1], w.end[1]};
  const Tensor residual = one_d && act.residual.defined() ? to_2d(act.residual) : act.residual;
  using detail::conv2d_activation;  // an internal fused entry point (ops/fused.h)
  Tensor y = act.name.empty() ? conv2d(x, weight, bias, w.stride, pads, w.dilation, group)
                              : conv2d_activation(x, weight, bias, w.stride, pads, w.dilation, group, act.name, act.a,
                                                  act.b, act.scale, act.shift, residual, act.residual_writable);
  return one_d ? squeeze(y, 2) : y;
}

namespace {

/// conv_transpose2d with ONNX pads {top, left, bottom, right}: braid pads both sides of an axis
/// alike, so pad by the smaller amount and crop the rest at the end.
Tensor conv_transpose_2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& dilation, const std::vector<int64_t>& out_pad,
                         const std::vector<int64_t>& pads, int64_t group) {
  std::vector<int64_t> common(2), extra_b(2), extra_e(2);
  for (size_t i = 0; i < 2; ++i) {
    common[i] = std::min(pads[i], pads[i + 2]);
    extra_b[i] = pads[i] - common[i];
    extra_e[i] = pads[i + 2] - common[i];
  }
  Tensor y = conv_transpose2d(x, weight, bias, stride, common, out_pad, group, dilation);
  for (int64_t i = 0; i < 2; ++i)
    if (extra_b[static_cast<size_t>(i)] != 0 || extra_e[static_cast<size_t>(i)] != 0)
      y = slice(y, 2 + i, extra_b[static_cast<size_t>(i)], y.size(2 + i) - extra_e[static_cast<size_t>(i)]);
  return y;
}

std::vector<Tensor> conv_transpose(OpContext& c) {
  Tensor x = c.input(0), weight = c.input(1);
  Tensor bias = c.has_input(2) ? c.input(2) : Tensor();
  check_rank(c, x, "ConvTranspose");
  const size_t k = static_cast<size_t>(x.dim() - 2);
  const std::vector<int64_t> kernel = c.attr_ints("kernel_shape", std::vector<int64_t>(weight.shape().begin() + 2, weight.shape().end()));
  std::vector<int64_t> stride = c.attr_ints("strides", std::vector<int64_t>(k, 1));
  std::vector<int64_t> dilation = c.attr_ints("dilations", std::vector<int64_t>(k, 1));
  std::vector<int64_t> out_pad = c.attr_ints("output_padding", std::vector<int64_t>(k, 0));
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * k, 0));
  const int64_t group = c.attr_int("group", 1);
  const std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  const Shape in = spatial(x);
  if (c.has_attr("output_shape") || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    std::vector<int64_t> target = c.attr_ints("output_shape");
    if (target.size() > k) target.erase(target.begin(), target.end() - static_cast<int64_t>(k));
    for (size_t i = 0; i < k; ++i) {
      const int64_t out = target.empty() ? in[i] * stride[i] : target[i];
      const int64_t total = stride[i] * (in[i] - 1) + out_pad[i] + ((kernel[i] - 1) * dilation[i] + 1) - out;
      if (total < 0) {
        out_pad[i] -= total;  // the output grows by output padding
        pads[i] = pads[i + k] = 0;
        continue;
      }
      const bool upper = auto_pad != "SAME_LOWER";
      pads[i] = upper ? total / 2 : total - total / 2;
      pads[i + k] = total - pads[i];
    }
  } else if (auto_pad == "VALID") {
    std::fill(pads.begin(), pads.end(), 0);
  }
  if (k == 3) {
    // Each input depth slice, convolved (transposed) with each depth tap of the kernel, lands on
    // output depth d * stride + tap * dilation; the depth padding is cropped at the end.
    const int64_t n = x.size(0), depth = x.size(2), kd = weight.size(2);
    const int64_t full = (depth - 1) * stride[0] + dilation[0] * (kd - 1) + 1 + out_pad[0];
    if (full - pads[0] - pads[3] <= 0) c.fail("the output depth is not positive");
    Tensor slices = depth_to_batch(x);
    const std::vector<int64_t> s2(stride.begin() + 1, stride.end()), d2(dilation.begin() + 1, dilation.end());
    const std::vector<int64_t> op2(out_pad.begin() + 1, out_pad.end()), p2{pads[1], pads[2], pads[4], pads[5]};
    std::vector<Tensor> parts;
    std::vector<int64_t> pos;
    for (int64_t t = 0; t < kd; ++t) {
      Tensor wt = squeeze(narrow(weight, 2, t, 1), 2);
      Tensor yt = conv_transpose_2d(slices, wt, Tensor(), s2, d2, op2, p2, group);
      parts.push_back(reshape(yt, {n, depth, yt.size(1), yt.size(2), yt.size(3)}));  // (N, D, C_out, H, W)
      for (int64_t i = 0; i < depth; ++i) pos.push_back(i * stride[0] + t * dilation[0]);
    }
    Tensor all = concat(parts, 1);
    Tensor index = contiguous(expand(reshape(index_vec(pos, all.device()), {1, static_cast<int64_t>(pos.size()), 1, 1, 1}), all.shape()));
    Tensor z = zeros({n, full, all.size(2), all.size(3), all.size(4)}, all.dtype(), all.device());
    Tensor y = scatter_add(z, 1, index, all);
    y = permute(slice(y, 1, pads[0], full - pads[3]), {0, 2, 1, 3, 4});
    if (bias.defined()) y = y + reshape(bias, {1, bias.numel(), 1, 1, 1});
    return {y};
  }
  const bool one_d = k == 1;
  if (one_d) {
    x = to_2d(x);
    weight = to_2d(weight);
    stride.insert(stride.begin(), 1);
    dilation.insert(dilation.begin(), 1);
    out_pad.insert(out_pad.begin(), 0);
    pads = {0, pads[0], 0, pads[1]};
  }
  Tensor y = conv_transpose_2d(x, weight, bias, stride, dilation, out_pad, pads, group);
  return {one_d ? squeeze(y, 2) : y};
}

/// MaxPool or AveragePool over (N, C, H, W) with a 2-axis window.
Tensor pool2d(const OpContext& c, const Tensor& x, const Window& w, bool is_max, bool ceil_mode) {
  bool symmetric = true, small = true;
  for (size_t i = 0; i < 2; ++i) {
    symmetric = symmetric && w.begin[i] == w.end[i];
    small = small && 2 * w.begin[i] <= w.kernel[i];
  }
  Tensor y;
  if (is_max) {
    if (symmetric && small) {
      y = max_pool2d(x, w.kernel, w.stride, {w.begin[0], w.begin[1]}, w.dilation, ceil_mode);
    } else {
      Tensor p = pad(x, {w.begin[1], w.end[1], w.begin[0], w.end[0]}, "constant", -std::numeric_limits<double>::infinity());
      y = max_pool2d(p, w.kernel, w.stride, {0, 0}, w.dilation, ceil_mode);
    }
  } else {
    for (int64_t d : w.dilation)
      if (d != 1) throw NotImplementedError("AveragePool with dilations is not supported yet");
    const bool include_pad = c.attr_int("count_include_pad", 0) != 0;
    if (symmetric && small && (include_pad || (w.begin[0] == 0 && w.begin[1] == 0))) {
      y = avg_pool2d(x, w.kernel, w.stride, {w.begin[0], w.begin[1]}, ceil_mode, include_pad);
    } else {
      // Sum over the padded input divided by the count of real (or, with count_include_pad,
      // real and pad) elements in each window.
      const std::vector<int64_t> p{w.begin[1], w.end[1], w.begin[0], w.end[0]};
      Tensor sums = avg_pool2d(pad(x, p), w.kernel, w.stride, {0, 0}, ceil_mode, true);
      if (!include_pad) {
        Tensor counts;
        {
          NoGradGuard no_grad;  // the counts are constants; the division below stays differentiable
          Tensor ones_in = ones({1, 1, x.size(2), x.size(3)}, x.dtype(), x.device());
          counts = avg_pool2d(pad(ones_in, p), w.kernel, w.stride, {0, 0}, ceil_mode, true);
        }
        y = sums / counts;
      } else {
        y = sums;
      }
    }
  }
  return y;
}

/// 3-d pooling: the 2-d pool of every depth slice, then the max (or mean) over depth windows. The
/// mean's divisor factors into the (H, W) count, applied by the 2-d pool, and the depth count.
Tensor pool3d(const OpContext& c, const Tensor& x, const Window& w, bool is_max, bool ceil_mode) {
  const int64_t n = x.size(0), ch = x.size(1), depth = x.size(2);
  Tensor y2 = pool2d(c, reshape(x, {n, ch * depth, x.size(3), x.size(4)}), drop_depth(w), is_max, ceil_mode);
  y2 = reshape(y2, {n, ch, depth, y2.size(2), y2.size(3)});
  const int64_t k = w.kernel[0], s = w.stride[0], d = w.dilation[0], b = w.begin[0], e = w.end[0];
  if (!is_max && d != 1) throw NotImplementedError("AveragePool with dilations is not supported yet");
  const int64_t span = d * (k - 1) + 1, len = depth + b + e;
  if (len < span) c.fail("the kernel's depth extent ", span, " is larger than the padded input depth ", len);
  int64_t od = ceil_mode ? (len - span + s - 1) / s + 1 : (len - span) / s + 1;
  if (ceil_mode && (od - 1) * s >= depth + b) --od;  // a window must start inside the input or its left padding
  const int64_t extra = std::max<int64_t>(0, (od - 1) * s + span - len);
  const double fill = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
  Tensor yp = (b != 0 || e + extra != 0) ? pad(y2, {0, 0, 0, 0, b, e + extra}, "constant", fill) : y2;
  const bool include_pad = c.attr_int("count_include_pad", 0) != 0;
  std::vector<double> count(static_cast<size_t>(od), 0.0);
  Tensor acc;
  for (int64_t t = 0; t < k; ++t) {
    std::vector<int64_t> idx(static_cast<size_t>(od));
    for (int64_t o = 0; o < od; ++o) {
      idx[static_cast<size_t>(o)] = o * s + t * d;
      const int64_t p = o * s + t * d - b;
      if (include_pad ? (p < depth + e) : (p >= 0 && p < depth)) count[static_cast<size_t>(o)] += 1;
    }
    Tensor tap = index_select(yp, 2, index_vec(idx, yp.device()));
    acc = !acc.defined() ? tap : (is_max ? maximum(acc, tap) : acc + tap);
  }
  if (!is_max) acc = acc / reshape(cast(tensor(count, {od}, acc.device()), acc.dtype()), {1, 1, od, 1, 1});
  return acc;
}

/// MaxPool's Indices output, found on the CPU: the flat position in x of each window's first
/// maximum, row-major over (N, C, spatial...) or, with storage_order 1, column-major over the
/// spatial axes.
Tensor max_indices(const OpContext& c, const Tensor& x, const Window& win, const Tensor& y) {
  const int64_t nsp = x.dim() - 2;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, st{1, 1, 1}, dl{1, 1, 1}, bg{0, 0, 0};
  for (int64_t i = 0; i < nsp; ++i) {
    const size_t j = static_cast<size_t>(3 - nsp + i), u = static_cast<size_t>(i);
    in[j] = x.size(2 + i);
    out[j] = y.size(2 + i);
    k[j] = win.kernel[u];
    st[j] = win.stride[u];
    dl[j] = win.dilation[u];
    bg[j] = win.begin[u];
  }
  const bool col_major = c.attr_int("storage_order", 0) != 0;
  const std::vector<double> v = cast(x, kFloat64).to_vector<double>();
  const int64_t planes = x.size(0) * x.size(1), plane = in[0] * in[1] * in[2];
  std::vector<int64_t> result;
  result.reserve(static_cast<size_t>(planes * out[0] * out[1] * out[2]));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o0 = 0; o0 < out[0]; ++o0)
      for (int64_t o1 = 0; o1 < out[1]; ++o1)
        for (int64_t o2 = 0; o2 < out[2]; ++o2) {
          double best = 0;
          int64_t at = -1;
          for (int64_t t0 = 0; t0 < k[0]; ++t0) {
            const int64_t i0 = o0 * st[0] - bg[0] + t0 * dl[0];
            if (i0 < 0 || i0 >= in[0]) continue;
            for (int64_t t1 = 0; t1 < k[1]; ++t1) {
              const int64_t i1 = o1 * st[1] - bg[1] + t1 * dl[1];
              if (i1 < 0 || i1 >= in[1]) continue;
              for (int64_t t2 = 0; t2 < k[2]; ++t2) {
                const int64_t i2 = o2 * st[2] - bg[2] + t2 * dl[2];
                if (i2 < 0 || i2 >= in[2]) continue;
                const double val = v[static_cast<size_t>(p * plane + (i0 * in[1] + i1) * in[2] + i2)];
                if (at < 0 || val > best) {
                  best = val;
                  at = col_major ? (i2 * in[1] + i1) * in[0] + i0 : (i0 * in[1] + i1) * in[2] + i2;
                }
              }
            }
          }
          result.push_back(at < 0 ? -1 : p * plane + at);
        }
  return tensor(result, y.shape(), y.device());
}

bool wants_indices(const OpContext& c) { return c.node().outputs.size() > 1 && !c.node().outputs[1].empty(); }

std::vector<Tensor> pool(OpContext& c, bool is_max) {
  Tensor x = c.input(0);
  check_rank(c, x, is_max ? "MaxPool" : "AveragePool");
  if (!is_floating(x.dtype())) {
    // Integer pooling (uint8 images): exact in float64, then back.
    const DType t = x.dtype();
    OpContext sub(c.node(), c.opset(), c.training(), {cast(x, kFloat64)}, nullptr);
    std::vector<Tensor> r = pool(sub, is_max);
    r[0] = cast(r[0], t);
    return r;
  }
  const Window w = window(c, c.attr_ints("kernel_shape"), spatial(x));
  if (w.kernel.size() != static_cast<size_t>(x.dim() - 2)) c.fail("kernel_shape needs ", x.dim() - 2, " values");
  const bool ceil_mode = c.attr_int("ceil_mode", 0) != 0;
  Tensor y;
  if (x.dim() == 5) {
    y = pool3d(c, x, w, is_max, ceil_mode);
  } else if (x.dim() == 3) {
    Window w2 = w;
    window_to_2d(w2);
    y = squeeze(pool2d(c, to_2d(x), w2, is_max, ceil_mode), 2);
  } else {
    y = pool2d(c, x, w, is_max, ceil_mode);
  }
  if (is_max && wants_indices(c)) return {y, max_indices(c, x, w, y)};
  return {y};
}

Tensors max_unpool(OpContext& c) {
  const Tensor& x = c.input(0);
  Tensor idx = c.input(1);
  if (x.dim() < 3) c.fail("X needs an (N, C, ...) shape, got ", shape_str(x.shape()));
  if (idx.shape() != x.shape()) c.fail("I of shape ", shape_str(idx.shape()), " does not match X of shape ", shape_str(x.shape()));
  if (is_floating(idx.dtype()) || idx.dtype() == kBool) c.fail("I must be an integer tensor");
  const size_t k = static_cast<size_t>(x.dim() - 2);
  const std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  if (kernel.size() != k) c.fail("kernel_shape needs ", k, " values");
  const std::vector<int64_t> stride = c.attr_ints("strides", std::vector<int64_t>(k, 1));
  const std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * k, 0));
  if (stride.size() != k || pads.size() != 2 * k) c.fail("strides/pads need ", k, "/", 2 * k, " values");
  // Indices are flat over the default output shape; an explicit output_shape (at least as large)
  // pads that result at the end of each axis, as the ONNX reference does.
  Shape out{x.size(0), x.size(1)};
  for (size_t i = 0; i < k; ++i)
    out.push_back((x.size(static_cast<int64_t>(i) + 2) - 1) * stride[i] + kernel[i] - pads[i] - pads[i + k]);
  int64_t total = 1;
  for (int64_t d : out) total *= d;
  Tensor flat_idx = reshape(cast(idx, kInt64), {x.numel()});
  {
    const std::vector<int64_t> iv = flat_idx.to_vector<int64_t>();
    for (int64_t i : iv)
      if (i < 0 || i >= total) c.fail("index ", i, " is out of range for an output of ", total, " elements");
  }
  Tensor y = reshape(scatter_add(zeros({total}, x.dtype(), x.device()), 0, flat_idx, reshape(x, {x.numel()})), out);
  if (c.has_input(2)) {
    const std::vector<int64_t> want = c.input_ints(2);
    if (want.size() != out.size()) c.fail("output_shape needs ", out.size(), " values");
    std::vector<int64_t> p;
    for (size_t i = out.size(); i-- > 0;) {
      if (want[i] < out[i]) c.fail("output_shape ", shape_str(Shape(want.begin(), want.end())), " is smaller than the unpooled shape ", shape_str(out));
      p.push_back(0);
      p.push_back(want[i] - out[i]);
    }
    y = pad(y, p);
  }
  return {y};
}

std::vector<int64_t> spatial_axes(const Tensor& x) {
  std::vector<int64_t> axes;
  for (int64_t d = 2; d < x.dim(); ++d) axes.push_back(d);
  return axes;
}

Shape channel_shape(const Tensor& x) {
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[1] = x.size(1);
  return s;
}

std::vector<Tensor> batch_norm(OpContext& c) {
  const Tensor& x = c.input(0);
  const Tensor &scale = c.input(1), &bias = c.input(2);
  Tensor mean_in = c.input(3), var_in = c.input(4);
  const double eps = c.attr_float("epsilon", 1e-5), momentum = c.attr_float("momentum", 0.9);
  if (x.dim() < 2) c.fail("input must have a channel axis, got shape ", shape_str(x.shape()));
  const Shape cs = channel_shape(x);
  const bool onnx_training = c.opset() >= 14 && c.attr_int("training_mode", 0) != 0;
  std::vector<int64_t> axes{0};
  for (int64_t d = 2; d < x.dim(); ++d) axes.push_back(d);
  if (!onnx_training && !c.training())  // Note [BatchNorm as scale and shift] in layers/normalization.cpp
    return {nn::batch_norm_apply(x, reshape(mean_in, cs), reshape(var_in, cs), scale, bias, eps)};
  Tensor m = mean(x, axes, true);
  Tensor v = var(x, axes, 0, true);
  Tensor y = (x - m) * rsqrt(v + eps) * reshape(scale, cs) + reshape(bias, cs);
  Tensor run_mean, run_var;
  {
    NoGradGuard no_grad;
    const int64_t n = x.numel() / x.size(1);
    // Fine-tuning in braid (module in training mode) updates the model's running statistics as
    // PyTorch does (unbiased variance); the ONNX training_mode outputs use the biased one.
    Tensor vr = reshape(v, {x.size(1)});
    if (!onnx_training && n > 1) vr = vr * (static_cast<double>(n) / static_cast<double>(n - 1));
    run_mean = mean_in * momentum + reshape(m, {x.size(1)}).detach() * (1.0 - momentum);
    run_var = var_in * momentum + vr.detach() * (1.0 - momentum);
    if (!onnx_training) {
      Tensor(mean_in).copy_(cast(run_mean, mean_in.dtype()));
      Tensor(var_in).copy_(cast(run_var, var_in.dtype()));
    }
  }
  return {y, run_mean, run_var};
}

/// Normalises over `axes` of x (mean 0, variance 1, biased), returning (y, mean, inverse std).
std::vector<Tensor> normalize(const Tensor& x, const std::vector<int64_t>& axes, double eps) {
  Tensor m = mean(x, axes, true);
  Tensor inv = rsqrt(var(x, axes, 0, true) + eps);
  return {(x - m) * inv, m, inv};
}

std::vector<Tensor> dropout(OpContext& c) {
  const Tensor& x = c.input(0);
  double ratio = 0.5;
  bool training = c.training();
  if (c.opset() < 12) {
    ratio = c.attr_float("ratio", 0.5);
    if (c.attr_int("is_test", 0) != 0) training = false;
  } else {
    if (c.has_input(1)) ratio = c.input_scalar(1);
    training = c.has_input(2) ? c.input_scalar(2) != 0 : training;
  }
  if (!training || ratio == 0) return {x, ones(x.shape(), kBool, x.device())};
  if (ratio < 0 || ratio >= 1) c.fail("ratio must be in [0, 1), got ", ratio);
  Tensor keep = bernoulli(x.shape(), 1.0 - ratio, kBool, nullptr, x.device());
  return {x * cast(keep, x.dtype()) * (1.0 / (1.0 - ratio)), keep};
}

}  // namespace

void register_nn_ops(OpRegistry& r) {
  r.add(op("Conv", {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}, conv));
  r.add(op("ConvTranspose", {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"},
           conv_transpose));
  r.add(op("MaxPool", {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"},
           [](OpContext& c) { return pool(c, true); }));
  r.add(op("MaxUnpool", {"kernel_shape", "pads", "strides"}, max_unpool, 9));
  r.add(op("AveragePool", {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"},
           [](OpContext& c) { return pool(c, false); }));
  r.add(op("GlobalAveragePool", {}, [](OpContext& c) { return Tensors{mean(c.input(0), spatial_axes(c.input(0)), true)}; }));
  r.add(op("GlobalMaxPool", {}, [](OpContext& c) { return Tensors{amax(c.input(0), spatial_axes(c.input(0)), true)}; }));
  r.add(op("MatMul", {}, [](OpContext& c) { return Tensors{matmul(c.input(0), c.input(1))}; }));
  r.add(op("Gemm", {"alpha", "beta", "broadcast", "transA", "transB"}, [](OpContext& c) {
    Tensor a = c.input(0), b = c.input(1);
    if (a.dim() != 2 || b.dim() != 2) c.fail("A and B must be 2-d, got ", shape_str(a.shape()), " and ", shape_str(b.shape()));
    if (c.attr_int("transA", 0) != 0) a = a.mT();
    if (c.attr_int("transB", 0) != 0) b = b.mT();
    const double alpha = c.attr_float("alpha", 1.0), beta = c.attr_float("beta", 1.0);
    Tensor y = matmul(a, b);
    if (alpha != 1.0) y = y * alpha;
    if (c.has_input(2) && beta != 0.0) y = beta == 1.0 ? y + c.input(2) : y + c.input(2) * beta;
    return Tensors{y};
  }));
  {
    OpSchema s = op("BatchNormalization", {"epsilon", "momentum", "training_mode", "spatial", "is_test", "consumed_inputs"}, batch_norm);
    s.check = [](const Node& n, int64_t) -> std::string {
      auto it = n.attributes.find("spatial");
      if (it != n.attributes.end() && it->second.i == 0) return "BatchNormalization with spatial=0 is not supported";
      return "";
    };
    r.add(std::move(s));
  }
  r.add(op("InstanceNormalization", {"epsilon"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const Shape cs = channel_shape(x);
    Tensor y = normalize(x, spatial_axes(x), c.attr_float("epsilon", 1e-5))[0];
    return Tensors{y * reshape(c.input(1), cs) + reshape(c.input(2), cs)};
  }));
  r.add(op("LayerNormalization", {"axis", "epsilon", "stash_type"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = norm_axis(c, c.attr_int("axis", -1), x.dim());
    const Tensor bias = c.has_input(2) ? c.input(2) : Tensor();
    return Tensors{layer_norm_with_stats(x, x.dim() - axis, c.input(1), bias, c.attr_float("epsilon", 1e-5))};
  }));
  r.add(op("GroupNormalization", {"epsilon", "num_groups", "stash_type"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t g = c.attr_int("num_groups", 1), ch = x.size(1);
    if (g <= 0 || ch % g != 0) c.fail("num_groups ", g, " does not divide ", ch, " channels");
    Shape grouped{x.size(0), g, -1};
    Tensor y = reshape(normalize(reshape(x, grouped), {2}, c.attr_float("epsilon", 1e-5))[0], x.shape());
    Tensor scale = c.input(1), bias = c.input(2);
    if (scale.numel() == g && g != ch) {  // opset 18: one scale per group
      scale = reshape(expand(reshape(scale, {g, 1}), {g, ch / g}), {ch});
      bias = reshape(expand(reshape(bias, {g, 1}), {g, ch / g}), {ch});
    }
    const Shape cs = channel_shape(x);
    return Tensors{y * reshape(scale, cs) + reshape(bias, cs)};
  }));
  r.add(op("LRN", {"alpha", "beta", "bias", "size"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const int64_t size = c.attr_int("size", 1);
    if (size <= 0) c.fail("size must be positive");
    const double alpha = c.attr_float("alpha", 1e-4), beta = c.attr_float("beta", 0.75), bias = c.attr_float("bias", 1.0);
    const int64_t n = x.size(0), ch = x.size(1);
    Tensor sq = reshape(square(x), {n, 1, ch, x.numel() / std::max<int64_t>(n * ch, 1)});
    const int64_t before = (size - 1) / 2, after = size - 1 - before;
    Tensor sums = avg_pool2d(pad(sq, {0, 0, before, after}), {size, 1}, {1, 1}, {0, 0}, false, true) * static_cast<double>(size);
    Tensor denom = pow(reshape(sums, x.shape()) * (alpha / static_cast<double>(size)) + bias, beta);
    return Tensors{x / denom};
  }));
  r.add(op("Dropout", {"ratio", "seed", "is_test", "consumed_inputs"}, dropout));
}

}  // namespace braid::onnx::ops
