// Batch normalisation with the batch's own statistics (braid/ops.h: batch_norm_training) as one
// autograd node with a closed-form backward, in three passes over channels that a backend may fuse
// (channel_moments, channel_grad_sums, channel_affine) and that compose from reductions and
// broadcast arithmetic where it does not.
#include <tuple>

#include "braid/amp.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

// Note [BatchNorm as one node]
// Composed from mean, var and broadcast arithmetic, a training BatchNorm is about six passes over
// its input forward and a dozen backward, as autograd walks back through the statistics. As one
// node, with a backend's fused passes, it reads x twice for the statistics and once for
// y = x * scale + shift, and backward reads g and x once for two sums and once for dL/dx. The
// backward is the closed form of PyTorch's CPU kernel: with xhat = (x - mean) * invstd and
// a = weight * invstd per channel,
//   dL/dbias = sum(g),  dL/dweight = sum(g * (x - mean)) * invstd,
//   dL/dx = a * (g - sum(g) / n - xhat * sum(g * xhat) / n)
//         = g * a - a * sum(g) / n + (x - mean) * k,  with k = -a * invstd^2 * sum(g * (x - mean)) / n,
// over the n = N * S values of a channel. (x - mean) is formed per element rather than expanded into
// x * k - mean * k, which would cancel when the mean is large against the spread. The statistics
// themselves (mean, biased var) come out of the node without gradients: BatchNorm updates its
// running statistics from them. SyncBatchNorm, whose statistics are all-reduced across ranks, keeps
// the composite batch_norm_apply, through which autograd reaches every rank's share.
//
// A float16/bfloat16 x (autocast's half activations on a GPU, Note [Autocast]) keeps float32
// statistics, parameters and per-channel terms, as PyTorch's mixed-dtype batch norm: the backend's
// passes read the half x (and g) and write a half y (and dL/dx), each element computed in float32
// and rounded once (FusedKernels::channel_moments in backend/backend.h), and the node saves the half
// x, so a half activation costs half the memory it would in float32. The values are those of the
// float32 node on the widened x with y and dL/dx rounded once. Where the backend declines the half
// moments (the CPU, whose kernels take float32 and float64 only), the op is that float32 node on a
// float32 copy of x, y cast back: the same function, computed the long way round. A backward pass
// that a backend declines for half operands likewise runs the float32 pass on widened copies.

// The channel view of a (N, C, *) tensor that the passes read: (N, C, S), made contiguous; or, with
// nhwc, channels-last memory as (N * H * W, C, 1), made channels-last (Note [Channels-last training]
// in ops/conv.cpp), which the passes read as they read any (N, C, S).
Tensor channels(const Tensor& t, bool nhwc = false) {
  const int64_t n = t.size(0), c = t.size(1);
  if (nhwc) return as_channels_last(t).permute({0, 2, 3, 1}).view({t.numel() / c, c, 1});
  return contiguous_raw(t).view({n, c, t.numel() / (n * c)});
}

// The tensor of shape `shape` whose channel view (channels(), with the same nhwc) is v.
Tensor unchannels(const Tensor& v, const Shape& shape, bool nhwc) {
  if (nhwc) return v.view({shape[0], shape[2], shape[3], shape[1]}).permute({0, 3, 1, 2});
  return v.view(shape);
}

// A (C) vector as (1, C, 1), against a channel view.
Tensor per_channel(const Tensor& v) { return v.view({1, v.numel(), 1}); }

// The dtype of the per-channel tensors against x of dtype t: float32 for float16/bfloat16 x.
DType stat_dtype(DType t) { return is_half(t) ? kFloat32 : t; }

// mean and the biased variance (C) of x3 (N, C, S) over N and S; for a half x3 the backend's half
// pass, or two undefined tensors where it has none (the caller then takes the float32 node).
std::pair<Tensor, Tensor> moments(const Tensor& x3) {
  const DType sd = stat_dtype(x3.dtype());
  Tensor m = new_tensor({x3.size(1)}, sd, x3.device()), v = new_tensor({x3.size(1)}, sd, x3.device());
  if (backend_of(x3).fused().channel_moments(x3, m, v)) return {m, v};  // Note [Fused kernels]
  if (is_half(x3.dtype())) return {};
  return {braid::mean(x3, {0, 2}), braid::var(x3, {0, 2}, 0)};
}

// sum(g) and sum(g * (x - mean)) (C) over N and S.
std::pair<Tensor, Tensor> grad_sums(const Tensor& g3, const Tensor& x3, const Tensor& m) {
  const DType sd = stat_dtype(x3.dtype());
  Tensor sg = new_tensor({x3.size(1)}, sd, x3.device()), sgx = new_tensor({x3.size(1)}, sd, x3.device());
  if (backend_of(x3).fused().channel_grad_sums(g3, x3, m, sg, sgx)) return {sg, sgx};
  if (is_half(x3.dtype())) return grad_sums(cast(g3, kFloat32), cast(x3, kFloat32), m);  // the float32 pass
  return {sum(g3, {0, 2}), sum(g3 * (x3 - per_channel(m)), {0, 2})};
}

// The backend's channel_affine (below), or undefined where it declines.
Tensor fused_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b, const Tensor& b_mean,
                    const Tensor& sb) {
  Tensor out = new_tensor(a.shape(), a.dtype(), a.device());
  return backend_of(a).fused().channel_affine(a, sa, shift, b, b_mean, sb, out) ? out : Tensor();
}

// (a * sa + shift) + (b - b_mean) * sb per channel, the last term only when b is defined; for a half
// a with float32 per-channel terms, in float32 and rounded once to a's dtype.
Tensor affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b, const Tensor& b_mean,
              const Tensor& sb) {
  if (Tensor out = fused_affine(a, sa, shift, b, b_mean, sb); out.defined()) return out;
  if (is_half(a.dtype()) && sa.dtype() != a.dtype())  // the float32 pass on widened copies, rounded once
    return cast(affine(cast(a, kFloat32), sa, shift, b.defined() ? cast(b, kFloat32) : b, b_mean, sb), a.dtype());
  Tensor y = a * per_channel(sa) + per_channel(shift);
  return b.defined() ? y + (b - per_channel(b_mean)) * per_channel(sb) : y;
}

// The float32 node on a float32 copy of the half x, y cast back (Note [BatchNorm as one node]).
std::vector<Tensor> batch_norm_via_float32(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  std::vector<Tensor> r = batch_norm_training(cast(x, kFloat32), weight, bias, eps);
  r[0] = cast(r[0], x.dtype());
  return r;
}

}  // namespace

std::vector<Tensor> batch_norm_training(const Tensor& x, const Tensor& weight_in, const Tensor& bias_in, double eps) {
  const char* op = "batch_norm_training";
  check_compute(x, op);
  BRAID_CHECK_T(TypeError, is_floating(x.dtype()), op, ": input must be floating-point, got ", dtype_name(x.dtype()));
  BRAID_CHECK(x.dim() >= 2, op, ": expected an (N, C, ...) input, got shape ", shape_str(x.shape()));
  const int64_t c = x.size(1);
  BRAID_CHECK(c > 0 && x.numel() / c > 1, op, ": expected more than 1 value per channel, got input shape ",
              shape_str(x.shape()));
  for (const Tensor* p : {&weight_in, &bias_in}) {
    if (!p->defined()) continue;
    check_same_device(x, *p, op);
    BRAID_CHECK(p->dim() == 1 && p->size(0) == c, op, ": weight and bias must have shape [", c, "] (the channels of ",
                "input shape ", shape_str(x.shape()), "), got ", shape_str(p->shape()));
  }
  // float32 parameters against a float64 input compute in float64, as the composite's promotion did;
  // the cast is recorded, so the parameters' gradients come back in their own dtype. A half x keeps
  // float32 parameters and statistics.
  const DType sd = stat_dtype(x.dtype());
  const auto like_x = [&](const Tensor& p) { return p.defined() && p.dtype() != sd ? p.to(sd) : p; };
  Tensor x3, m, v, invstd, y;
  const bool nhwc = is_channels_last_layout(x);  // the layout y and dL/dx keep
  {
    NoGradGuard no_grad;
    x3 = channels(x.detach(), nhwc);
    std::tie(m, v) = moments(x3);
  }
  if (!m.defined()) return batch_norm_via_float32(x, weight_in, bias_in, eps);  // no half pass here
  {
    NoGradGuard no_grad;
    const Tensor wd = like_x(weight_in.defined() ? weight_in.detach() : weight_in);
    const Tensor bd = like_x(bias_in.defined() ? bias_in.detach() : bias_in);
    invstd = rsqrt(v + eps);
    const Tensor scale = wd.defined() ? invstd * wd : invstd;
    const Tensor shift = bd.defined() ? bd - m * scale : -(m * scale);
    y = is_half(x.dtype()) ? fused_affine(x3, scale, shift, Tensor(), Tensor(), Tensor())
                           : affine(x3, scale, shift, Tensor(), Tensor(), Tensor());
  }
  if (!y.defined()) return batch_norm_via_float32(x, weight_in, bias_in, eps);  // no half pass here
  y = unchannels(y, x.shape(), nhwc);
  const Tensor weight = like_x(weight_in), bias = like_x(bias_in);
  const Tensor w = weight.defined() ? weight.detach() : Tensor();
  y = record("batch_norm", y, {x, weight, bias},
             [x3, m, invstd, w, shape = x.shape(), nhwc](const Tensor& g_in, Grads& r) {
    const Tensor g = g_in.dtype() == x3.dtype() ? g_in : cast(g_in, x3.dtype());
    const Tensor g3 = channels(g, nhwc);
    const auto [sum_g, sum_gxc] = grad_sums(g3, x3, m);
    if (r.needs(2)) r.set(2, sum_g);
    if (r.needs(1)) r.set(1, sum_gxc * invstd);
    if (r.needs(0)) {
      const double n = static_cast<double>(x3.size(0) * x3.size(2));
      const Tensor a = w.defined() ? invstd * w : invstd;
      const Tensor k = -(a * invstd * invstd * sum_gxc) / n;
      r.set(0, unchannels(affine(g3, a, -(a * sum_g) / n, x3, m, k), shape, nhwc));
    }
  });
  return {y, m, v};
}

Tensor channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift) {
  BRAID_CHECK(x.defined() && scale.defined() && shift.defined(), "channel_affine: an operand is undefined");
  BRAID_CHECK(
      x.dim() >= 2 && scale.dim() == 1 && shift.dim() == 1 && scale.numel() == x.size(1) && shift.numel() == x.size(1),
      "channel_affine: expected x (N, C, ...) with scale and shift (C), got shapes ", shape_str(x.shape()), ", ",
      shape_str(scale.shape()), " and ", shape_str(shift.shape()));
  // A half x with float32 scale and shift: the backend's half pass (float32 arithmetic, rounded
  // once, Note [Half arithmetic]) where it has one, else the float32 op on a widened copy.
  const bool half = is_half(x.dtype()) && scale.dtype() != x.dtype();
  if (!needs_grad(x) && !needs_grad(scale) && !needs_grad(shift) && active_trace() == nullptr && x.numel() > 0 &&
      scale.dtype() == stat_dtype(x.dtype()) && shift.dtype() == scale.dtype() && scale.device() == x.device() &&
      shift.device() == x.device()) {
    NoGradGuard no_grad;
    // The backend's pass on x's (N, C, S) channels; undefined where it declines a half x.
    const auto pass = [&](const Tensor& x3) {
      return half ? fused_affine(x3, contiguous(scale), contiguous(shift), Tensor(), Tensor(), Tensor())
                  : affine(x3, contiguous(scale), contiguous(shift), Tensor(), Tensor(), Tensor());
    };
    // Note [Channels-last activations in inference] (ops/conv.cpp): NHWC memory is (N*H*W, C, 1)
    // channels, and the result stays channels-last.
    const bool nhwc = is_channels_last_layout(x);
    if (const Tensor y = pass(channels(x, nhwc)); y.defined()) return unchannels(y, x.shape(), nhwc);
  }
  if (half)  // float32 arithmetic, rounded once (Note [Half arithmetic])
    return via_float32(x, [&](const Tensor& w) { return channel_affine(w, scale, shift); });
  Shape cs(static_cast<size_t>(x.dim()), 1);
  cs[1] = x.size(1);
  return x * scale.reshape(cs) + shift.reshape(cs);
}

// Note [LayerNorm as one node]
// Layer normalisation over rows of n values: m = mean, inv = 1 / sqrt(biased var + eps), y = (x - m)
// * inv (* w) (+ b). Its composite (mean, var and broadcast arithmetic) is the definition: the
// backend's fused rows (Backend::layer_norm_rows) compute it in one pass, and where x, weight and
// bias share a floating dtype and the parameters have the normalised shape, one node records it
// with the closed-form backward, with x^ = (x - m) * inv and gx^ = g (* w):
//   dx = inv * (gx^ - mean(gx^) - x^ * mean(gx^ x^)),  dw = sum over rows of g x^,  db = sum of g,
// so a training step makes two row passes' worth of launches forward instead of the composite's
// eight ops and their sixteen backward ones. The formula's ops are braid's own, so they run on any
// device, and a float64 gradient check holds it to finite differences. An active ONNX trace takes
// the composite, whose ops the exporter knows; so does anything else (other parameter shapes or
// dtypes, an empty input).

namespace {

// The rows' statistics and y of x (rows of n) with the backend's fused rows where it has them, else
// the composite, not recorded; m and inv in stat_shape.
std::vector<Tensor> layer_norm_values(const Tensor& x, int64_t n, const std::vector<int64_t>& axes,
                                      const Shape& stat_shape, const Tensor& weight, const Tensor& bias, double eps) {
  NoGradGuard no_grad;
  Tensor y = new_tensor(x.shape(), x.dtype(), x.device());
  Tensor m = new_tensor(stat_shape, x.dtype(), x.device()), inv = new_tensor(stat_shape, x.dtype(), x.device());
  auto flat = [](const Tensor& t) { return t.defined() ? contiguous(t.detach()) : t; };
  if (backend_of(x).fused().layer_norm_rows(contiguous(x.detach()), n, flat(weight), flat(bias), eps, y, m, inv))
    return {y, m, inv};
  m = mean(x.detach(), axes, true);
  inv = rsqrt(var(x.detach(), axes, 0, true) + eps);
  y = (x.detach() - m) * inv;
  if (weight.defined()) y = y * weight.detach();
  if (bias.defined()) y = y + bias.detach();
  return {y, m, inv};
}

}  // namespace

std::vector<Tensor> layer_norm_with_stats(const Tensor& x, int64_t k, const Tensor& weight, const Tensor& bias,
                                          double eps) {
  BRAID_CHECK(x.defined(), "layer_norm: the input is undefined");
  if (is_half(x.dtype())) {
    // On autocast's float32 list (Note [Autocast]); outside a scope float32 inside, y rounded once.
    std::vector<Tensor> r = layer_norm_with_stats(cast(x, kFloat32), k, weight, bias, eps);
    if (!autocast_enabled()) r[0] = cast(r[0], x.dtype());
    return r;
  }
  BRAID_CHECK(k >= 1 && k <= x.dim(), "layer_norm: normalized_dims ", k, " is out of range for input shape ",
              shape_str(x.shape()));
  BRAID_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  const Shape trailing(x.shape().end() - k, x.shape().end());
  int64_t n = 1;
  for (int64_t d : trailing) n *= d;
  std::vector<int64_t> axes;
  Shape stat_shape = x.shape();
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) {
    axes.push_back(d);
    stat_shape[static_cast<size_t>(d)] = 1;
  }
  auto exact = [&](const Tensor& t) {
    return !t.defined() || (t.shape() == trailing && t.device() == x.device() && t.dtype() == x.dtype());
  };
  if (active_trace() == nullptr && x.numel() > 0 && is_floating(x.dtype()) && exact(weight) && exact(bias)) {
    std::vector<Tensor> r = layer_norm_values(x, n, axes, stat_shape, weight, bias, eps);
    if (!needs_grad(x) && !needs_grad(weight) && !needs_grad(bias)) return r;
    const Tensor w = weight.defined() ? weight.detach() : Tensor(), xd = x.detach(), m = r[1], inv = r[2];
    r[0] = record("layer_norm", r[0], {x, weight, bias}, [xd, m, inv, w, axes, n](const Tensor& g, Grads& grads) {
      const Tensor xhat = (xd - m) * inv;
      std::vector<int64_t> rows;  // the axes before the normalised ones
      for (int64_t d = 0; d < xd.dim() - static_cast<int64_t>(axes.size()); ++d) rows.push_back(d);
      if (grads.needs(1)) grads.set(1, rows.empty() ? g * xhat : sum(g * xhat, rows));
      if (grads.needs(2)) grads.set(2, rows.empty() ? g : sum(g, rows));
      if (grads.needs(0)) {
        const Tensor gx = w.defined() ? g * w : g;
        const double k = 1.0 / static_cast<double>(n);
        grads.set(0, inv * (gx - sum(gx, axes, true) * k - xhat * (sum(gx * xhat, axes, true) * k)));
      }
    });
    return r;
  }
  Tensor m = mean(x, axes, true);
  Tensor inv = rsqrt(var(x, axes, 0, true) + eps);
  Tensor y = (x - m) * inv;
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return {y, m, inv};
}

Tensor layer_norm(const Tensor& x, int64_t k, const Tensor& weight, const Tensor& bias, double eps) {
  return layer_norm_with_stats(x, k, weight, bias, eps)[0];
}

}  // namespace braid
