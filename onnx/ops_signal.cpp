// ONNX signal processing ops: the Hann, Hamming and Blackman windows, DFT, STFT and MelWeightMatrix,
// as braid ops (the DFT as a matmul with its cos/sin matrix).
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

void register_signal_ops(OpRegistry& r) {
  r.add(op("HannWindow", {"output_datatype", "periodic"}, [](OpContext& c) { return window(c, 0); }, 17));
  r.add(op("HammingWindow", {"output_datatype", "periodic"}, [](OpContext& c) { return window(c, 1); }, 17));
  r.add(op("BlackmanWindow", {"output_datatype", "periodic"}, [](OpContext& c) { return window(c, 2); }, 17));
  r.add(op("DFT", {"axis", "inverse", "onesided"}, dft_op, 17));
  r.add(op("STFT", {"onesided"}, stft_op, 17));
  {
    OpSchema s = op("MelWeightMatrix", {"output_datatype"}, mel_weight_matrix, 17);
    s.storage_via_compute = false;
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx::ops
