// Ops that assemble or cut tensors: concat, stack, split, chunk, pad, and the triangular masks.
#include "ops/common.h"

namespace braid {

using namespace detail;

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  BRAID_CHECK(!xs.empty(), "concat: expected at least one tensor");
  for (const Tensor& x : xs) check_compute(x, "concat");
  const Tensor& first = xs[0];
  BRAID_CHECK(first.dim() > 0, "concat: zero-dimensional tensors cannot be concatenated; unsqueeze them or use stack");
  int64_t a = normalize_axis(axis, first.dim(), "concat");
  DType t = first.dtype();
  Shape out_shape = first.shape();
  out_shape[a] = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_same_device(first, x, "concat");
    t = promote_types(t, x.dtype());
    bool same = x.dim() == first.dim();
    for (int64_t d = 0; same && d < x.dim(); ++d) same = d == a || x.shape()[d] == first.shape()[d];
    BRAID_CHECK(same, "concat: tensor ", i, " has shape ", shape_str(x.shape()), " but tensor 0 has shape ",
                shape_str(first.shape()), "; all sizes except axis ", a, " must match");
    sizes.push_back(x.shape()[a]);
    out_shape[a] += x.shape()[a];
  }
  // Channels-last inputs give a channels-last result (Note [Channels-last activations in inference]
  // in ops/conv.cpp): joined along any axis, each part is then a copy of rows of channels, not a
  // transposition (a feature pyramid's four maps before its last convolution).
  const bool channels_last = out_shape.size() == 4 && !first.is_contiguous() && first.is_channels_last();
  Tensor out = channels_last ? new_tensor({out_shape[0], out_shape[2], out_shape[3], out_shape[1]}, t, first.device())
                                   .permute({0, 3, 1, 2})
                             : new_tensor(out_shape, t, first.device());
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    Shape s = out_shape;
    s[a] = sizes[i];
    backend_of(out).copy(xs[i], as_strided(out, s, out.strides(), offset * out.strides()[a]));
    offset += sizes[i];
  }
  traced("concat", out, xs, {{a}, {}});
  if (!is_floating(t)) return out;
  return record("concat", out, xs, [sizes, a](const Tensor& g, Grads& r) {
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (r.needs(i)) r.set(i, g.narrow(a, at, sizes[i]));
      at += sizes[i];
    }
  });
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  BRAID_CHECK(!xs.empty(), "stack: expected at least one tensor");
  int64_t a = normalize_axis(axis, xs[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    BRAID_CHECK(xs[i].shape() == xs[0].shape(), "stack: tensor ", i, " has shape ", shape_str(xs[i].shape()),
                " but tensor 0 has shape ", shape_str(xs[0].shape()), "; stacked tensors must have equal shapes");
    parts.push_back(xs[i].unsqueeze(a));
  }
  return concat(parts, a);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  int64_t a = normalize_axis(axis, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    BRAID_CHECK(s >= 0, "split: negative size ", s);
    total += s;
  }
  BRAID_CHECK(total == x.shape()[a], "split: sizes add up to ", total, " but axis ", a, " of shape ",
              shape_str(x.shape()), " has size ", x.shape()[a]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(a, at, s));
    at += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t axis) {
  BRAID_CHECK(n > 0, "chunk: number of chunks must be positive, got ", n);
  int64_t a = normalize_axis(axis, x.dim(), "chunk");
  int64_t size = x.shape()[a], step = (size + n - 1) / n;
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < size; at += step) sizes.push_back(std::min(step, size - at));
  if (size == 0) sizes.assign(n, 0);  // n empty pieces, as torch.chunk
  return split(x, sizes, a);
}

namespace {
// For one padded axis of size n: the source index of each output position under reflect/replicate.
Tensor pad_index(int64_t n, int64_t before, int64_t after, bool reflect, Device device) {
  std::vector<int64_t> idx;
  for (int64_t i = -before; i < n + after; ++i) {
    int64_t j = i;
    if (reflect) {
      int64_t period = 2 * (n - 1);
      j = period == 0 ? 0 : ((j % period) + period) % period;
      if (j >= n) j = period - j;
    } else {
      j = std::clamp<int64_t>(j, 0, n - 1);
    }
    idx.push_back(j);
  }
  return tensor(idx, {static_cast<int64_t>(idx.size())}, device);
}
}  // namespace

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, const std::string& mode, double value) {
  check_compute(x, "pad");
  BRAID_CHECK(pads.size() % 2 == 0 && static_cast<int64_t>(pads.size()) <= 2 * x.dim(), "pad: expected an even number of "
              "pads, at most 2 per axis, got ", pads.size(), " for shape ", shape_str(x.shape()));
  BRAID_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate", "pad: unknown mode '", mode,
              "'; known: constant, reflect, replicate");
  const int64_t np = static_cast<int64_t>(pads.size()) / 2;
  if (mode != "constant") {
    Tensor out = x;
    for (int64_t p = 0; p < np; ++p) {
      int64_t axis = x.dim() - 1 - p, before = pads[2 * p], after = pads[2 * p + 1], n = x.shape()[axis];
      BRAID_CHECK(before >= 0 && after >= 0, "pad: ", mode, " padding must be non-negative, got ", before, ", ", after);
      BRAID_CHECK(mode == "replicate" ? n > 0 : (before < n && after < n), "pad: ", mode, " padding (", before, ", ",
                  after, ") is too large for axis ", axis, " of size ", n);
      out = index_select(out, axis, pad_index(n, before, after, mode == "reflect", x.device()));
    }
    return out;
  }
  // Constant: negative pads crop. Copy the kept part of x into the matching window of a filled output.
  Shape out_shape = x.shape();
  Tensor src = x;
  std::vector<int64_t> dst_start(x.dim(), 0);
  for (int64_t p = 0; p < np; ++p) {
    int64_t axis = x.dim() - 1 - p, before = pads[2 * p], after = pads[2 * p + 1];
    out_shape[axis] += before + after;
    BRAID_CHECK(out_shape[axis] >= 0, "pad: pads (", before, ", ", after, ") leave axis ", axis, " of shape ",
                shape_str(x.shape()), " with negative size");
    // Crops (negative pads) are clamped to the axis: cropping an empty axis leaves it empty.
    const int64_t n = x.shape()[axis];
    int64_t crop_lo = std::min(n, std::max<int64_t>(0, -before)), crop_hi = std::max<int64_t>(0, -after);
    src = src.narrow(axis, crop_lo, std::max<int64_t>(0, n - crop_lo - crop_hi));
    dst_start[axis] = std::max<int64_t>(0, before);
  }
  Tensor out = full(out_shape, value, x.dtype(), x.device());
  int64_t off = 0;
  for (int64_t d = 0; d < x.dim(); ++d) off += dst_start[d] * out.strides()[d];
  backend_of(x).copy(src, as_strided(out, src.shape(), out.strides(), off));
  traced("pad", out, {x}, {pads, {value}});
  if (!is_floating(x.dtype())) return out;
  Shape window = src.shape();
  return record("pad", out, {src}, [dst_start, window](const Tensor& g, Grads& r) {
    Tensor w = g;
    for (size_t d = 0; d < window.size(); ++d) w = w.narrow(static_cast<int64_t>(d), dst_start[d], window[d]);
    r.set(0, w);
  });
}

namespace {
Tensor triangle(const Tensor& x, int64_t diagonal, bool lower, const char* op) {
  BRAID_CHECK(x.dim() >= 2, op, ": expected at least 2 dimensions, got shape ", shape_str(x.shape()));
  Tensor rows = arange(x.size(-2), kInt64, x.device()).unsqueeze(1);
  Tensor cols = arange(x.size(-1), kInt64, x.device()).unsqueeze(0);
  Tensor diff = cols - rows;
  Tensor keep = lower ? le(diff, scalar_like(diff, static_cast<double>(diagonal)))
                      : ge(diff, scalar_like(diff, static_cast<double>(diagonal)));
  return where(keep, x, scalar_like(x, 0));
}
}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true, "tril"); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false, "triu"); }

}  // namespace braid
