// Pooling (braid/conv.h): max and average pooling through the backend's pooling primitives (and its
// channels-last max pooling in inference), adaptive average pooling composed of means. Each op
// checks its arguments at the front door and records one autograd node. float16 and bfloat16
// planes go to the same primitives, which every backend takes in those dtypes (a maximum exact, an
// average summed in float32 and rounded once, Note [Half arithmetic] in backend/backend.h).
#include <vector>

#include "braid/conv.h"
#include "ops/window.h"

namespace braid {

using namespace detail;

namespace {

// PyTorch's pooling output size: floor (or ceil) of the window count, where with ceil_mode the
// last window must start inside the input or its left padding.
int64_t pool_out(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation, bool ceil_mode) {
  int64_t out = floor_div(in + 2 * pad - dilation * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// x (N, C, h, w) checked; the window of a pooling op with PyTorch's rules.
Window2d pool_window(const char* op, const Tensor& x, const std::vector<int64_t>& kernel_in,
                     const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                     const std::vector<int64_t>& dilation_in, bool ceil_mode) {
  const std::vector<int64_t> kernel = per_axis(kernel_in, 2, op, "kernel_size");
  const std::vector<int64_t> stride = stride_in.empty() ? kernel : per_axis(stride_in, 2, op, "stride");
  const std::vector<int64_t> pad = per_axis(padding_in, 2, op, "padding");
  const std::vector<int64_t> dilation = per_axis(dilation_in, 2, op, "dilation");
  check_positive(kernel, op, "kernel_size");
  check_positive(stride, op, "stride");
  check_positive(dilation, op, "dilation");
  check_non_negative(pad, op, "padding");
  Axis axes[2];
  for (int a = 0; a < 2; ++a) {
    BRAID_CHECK(pad[a] <= kernel[a] / 2, op, ": padding ", shape_str(pad), " must be at most half the kernel size ",
                shape_str(kernel));
    const int64_t in = x.shape()[2 + a];
    axes[a] = {in,        pool_out(in, kernel[a], stride[a], pad[a], dilation[a], ceil_mode),
               kernel[a], stride[a],
               pad[a],    dilation[a]};
    BRAID_CHECK(axes[a].out > 0, op, ": input shape ", shape_str(x.shape()), " is too small for kernel ",
                shape_str(kernel), " with padding ", shape_str(pad), " and dilation ", shape_str(dilation));
    // A dilated window can skip the whole input; it would have no maximum.
    for (int64_t o = 0; o < axes[a].out; ++o) {
      auto [lo, hi] = window_taps(o * stride[a] - pad[a], dilation[a], kernel[a], in);
      BRAID_CHECK(lo < hi, op, ": window ", o, " along axis ", a + 2, " covers only padding (input shape ",
                  shape_str(x.shape()), ", kernel ", shape_str(kernel), ", dilation ", shape_str(dilation), ")");
    }
  }
  return make_window(axes[0], axes[1]);
}

void check_pool_input(const Tensor& x, const char* op) {
  check_float(x, op, "input");
  BRAID_CHECK(x.dim() == 4, op, ": expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape ",
              shape_str(x.shape()));
}

// (out, in) matrix whose row i averages PyTorch's adaptive window [floor(i in / out), ceil((i+1) in / out)).
// The mean of each window [floor(i n / out), ceil((i + 1) n / out)) of one axis, side by side. The
// windows are separable, so two of these pool a plane; each window is its own mean, so an infinity
// reaches only the outputs whose window holds it.
Tensor adaptive_mean(const Tensor& x, int64_t axis, int64_t out) {
  const int64_t n = x.size(axis);
  if (out == 0) return x.narrow(axis, 0, 0);
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < out; ++i) {
    const int64_t begin = i * n / out, end = ((i + 1) * n + out - 1) / out;
    parts.push_back(mean(x.narrow(axis, begin, end - begin), {axis}, true));
  }
  return concat(parts, axis);
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                  const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool ceil_mode) {
  if (x.defined() && x.dim() == 3)
    return max_pool2d(x.unsqueeze(0), kernel, stride, padding, dilation, ceil_mode).squeeze(0);
  check_pool_input(x, "max_pool2d");
  const Window2d win = pool_window("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode);
  const int64_t n = x.shape()[0], c = x.shape()[1];
  const Shape out_shape{n, c, win.oh, win.ow};
  const bool grad = needs_grad(x);  // the positions only backward reads: not written in inference
  // A channels-last input gives a channels-last output, as in PyTorch: Note [Channels-last
  // activations in inference] and Note [Channels-last training] (ops/conv.cpp). The backend's pass
  // in that layout where it has one, else the planes' kernel on a contiguous copy, its output then
  // laid out as x (the positions are per plane either way).
  const bool x_cl = !x.is_contiguous() && x.is_channels_last();
  Tensor out, indices;
  if (x_cl) {
    out = new_channels_last(out_shape, x.dtype(), x.device());
    indices = grad ? new_channels_last(out_shape, kInt64, x.device()) : Tensor();
    if (!backend_of(x).fused().max_pool2d_channels_last(x.detach(), win, out, indices)) out = Tensor();
  }
  if (!out.defined()) {
    out = new_like(x, out_shape, x.dtype());
    indices = grad ? new_like(x, out_shape, kInt64) : Tensor();
    backend_of(x).max_pool2d(contiguous(x.detach()), win, out, indices);
    if (x_cl) out = as_channels_last(out);
  }
  traced("max_pool2d", out, {x}, {{win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw, ceil_mode}, {}});
  return record("max_pool2d", out, {x}, [indices, x_shape = x.shape(), x_cl](const Tensor& g, Grads& r) {
    // Each output's gradient goes to the element it took, through the flattened planes (views of
    // either layout). Overlapping windows may send several to one element: a half gradient sums in
    // float32, and the engine rounds the sum once to x's dtype.
    const Shape flat{x_shape[0], x_shape[1], -1};
    const Tensor gs = is_half(g.dtype()) ? cast(g, kFloat32) : g;
    Tensor gx = x_cl ? new_channels_last(x_shape, gs.dtype(), g.device()) : new_tensor(x_shape, gs.dtype(), g.device());
    backend_of(gx).fill(gx, 0.0);
    backend_of(g).scatter_add(gx.view(flat), 2, indices.view(flat), gs.reshape(flat));
    r.set(0, gx);
  });
}

Tensor avg_pool2d(const Tensor& x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                  const std::vector<int64_t>& padding, bool ceil_mode, bool count_include_pad) {
  if (x.defined() && x.dim() == 3)
    return avg_pool2d(x.unsqueeze(0), kernel, stride, padding, ceil_mode, count_include_pad).squeeze(0);
  check_pool_input(x, "avg_pool2d");
  const Window2d win = pool_window("avg_pool2d", x, kernel, stride, padding, {1, 1}, ceil_mode);
  Tensor out = new_like(x, {x.shape()[0], x.shape()[1], win.oh, win.ow}, x.dtype());
  backend_of(x).avg_pool2d(contiguous(x.detach()), win, count_include_pad, out);
  traced("avg_pool2d", out, {x}, {{win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, ceil_mode, count_include_pad}, {}});
  return record("avg_pool2d", out, {x}, [win, count_include_pad, x_shape = x.shape()](const Tensor& g, Grads& r) {
    Tensor gx = zeros(x_shape, g.dtype(), g.device());
    backend_of(g).avg_pool2d_backward(contiguous(g), win, count_include_pad, gx);
    r.set(0, gx);
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_float(x, op, "input");
  BRAID_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape ",
              shape_str(x.shape()));
  const std::vector<int64_t> size = per_axis(output_size, 2, op, "output_size");
  BRAID_CHECK(size[0] >= 0 && size[1] >= 0, op, ": output_size must be non-negative, got ", shape_str(size));
  const int64_t h = x.size(-2), w = x.size(-1);
  BRAID_CHECK(h > 0 && w > 0, op, ": input shape ", shape_str(x.shape()), " has an empty plane");
  // Equal windows are plain average pooling; otherwise the windows overlap or vary in size.
  if (size[0] > 0 && size[1] > 0 && h % size[0] == 0 && w % size[1] == 0)
    return avg_pool2d(x, {h / size[0], w / size[1]});
  return adaptive_mean(adaptive_mean(x, -2, size[0]), -1, size[1]);
}

}  // namespace braid
