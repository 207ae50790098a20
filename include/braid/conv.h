// Convolution and pooling ops over NC(L) and NC(H,W) tensors, as torch.nn.functional defines
// them. They are differentiable tensor ops (the layers in braid/nn wrap them); each backend
// implements the im2col/col2im and pooling primitives underneath. Every op also takes an unbatched
// input (no N axis), as PyTorch does. Size arguments given as one value apply to both axes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/tensor.h"

namespace braid {

/// x (N, C_in, L), weight (C_out, C_in / groups, K), bias (C_out) or undefined -> (N, C_out, L_out).
/// padding_mode "zeros". For 'same' padding see conv_padding_same().
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1, int64_t padding = 0,
              int64_t dilation = 1, int64_t groups = 1);
/// x (N, C_in, H, W), weight (C_out, C_in / groups, kH, kW), bias (C_out) or undefined
/// -> (N, C_out, H_out, W_out). stride, dilation: {h, w}; padding: {h, w} on both sides of each
/// axis, or {top, bottom, left, right} (what conv_padding_same returns).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const std::vector<int64_t>& stride = {1, 1},
              const std::vector<int64_t>& padding = {0, 0}, const std::vector<int64_t>& dilation = {1, 1},
              int64_t groups = 1);
/// Note [Channels-last activations in inference] (src/ops/conv.cpp): a convolution that needs no
/// gradient gives a channels-last output (Tensor::is_channels_last) when its input is one, and,
/// while a ChannelsLastGuard is alive on the thread, also when the backend's kernel prefers that
/// layout. Outside the guard, an NCHW input gives a contiguous NCHW output, as in PyTorch. The ONNX
/// executor runs inference inside one and hands its callers contiguous outputs.
class ChannelsLastGuard {
 public:
  ChannelsLastGuard();
  ~ChannelsLastGuard();
  ChannelsLastGuard(const ChannelsLastGuard&) = delete;
  ChannelsLastGuard& operator=(const ChannelsLastGuard&) = delete;
  /// Whether a guard is alive on this thread.
  static bool active();

 private:
  bool prev_;
};
/// Whether convolutions may run channels-last at all (default: BRAID_CHANNELS_LAST, on): in
/// inference as above, and in training where the backend's kernels prefer it (Note [Channels-last
/// training] in src/ops/conv.cpp: CUDA's half convolutions under autocast). Off, every convolution
/// keeps NCHW, for a comparison; the values are the same up to rounding either way.
void set_channels_last(bool on);
bool channels_last();
/// PyTorch's padding='same' for stride 1, per axis as {before, after} (the extra element of an odd
/// total goes after): {top, bottom, left, right} for conv2d; conv1d takes the padding itself when
/// before == after, else pad() the input first.
std::vector<int64_t> conv_padding_same(const std::vector<int64_t>& kernel, const std::vector<int64_t>& dilation);
/// x (N, C_in, H, W), weight (C_in, C_out / groups, kH, kW), bias (C_out) or undefined
/// -> (N, C_out, H_out, W_out) with H_out = (H - 1) stride - 2 padding + dilation (kH - 1) +
/// output_padding + 1: the gradient of conv2d with respect to its input.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const std::vector<int64_t>& stride = {1, 1}, const std::vector<int64_t>& padding = {0, 0},
                        const std::vector<int64_t>& output_padding = {0, 0}, int64_t groups = 1,
                        const std::vector<int64_t>& dilation = {1, 1});
/// x (N, C, H, W); stride {} means stride = kernel; padding (at most half the kernel) never wins;
/// ceil_mode as PyTorch (a window must start inside the input or its left padding).
Tensor max_pool2d(const Tensor& x, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride = {},
                  const std::vector<int64_t>& padding = {0, 0}, const std::vector<int64_t>& dilation = {1, 1},
                  bool ceil_mode = false);
/// x (N, C, H, W); zero padding; count_include_pad counts the padding in each window's divisor.
Tensor avg_pool2d(const Tensor& x, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride = {},
                  const std::vector<int64_t>& padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
/// x (N, C, H, W) -> (N, C, out_h, out_w); window i along an axis of size n covers
/// [floor(i n / out), ceil((i + 1) n / out)), as PyTorch.
Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size);

}  // namespace braid
