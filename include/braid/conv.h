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
/// conv2d followed by an activation, computed in one pass where the backend can fuse them (oneDNN's
/// post-ops on the CPU) and nothing records (no gradient needed, no export trace active); otherwise
/// conv2d and the activation's op, recorded as usual. activation: "relu"; "clip" (min a, max b,
/// infinite for no bound); "hardswish"; "hardsigmoid" (min(max(a x + b, 0), 1)). The ONNX executor
/// runs a Conv and the activation after it this way in inference. scale and shift, when given, are
/// an affine map after the activation (activation(conv) * scale + shift), fused as well. residual,
/// when given, is added before the activation (activation(conv + residual): a residual block's
/// shortcut), broadcast as by +; fused where it has the output's shape. residual_writable: the
/// caller gives residual's memory up (reads residual no more, and no other tensor shares its memory),
/// so that the result may be written there instead of into new memory.
Tensor conv2d_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
                         const std::string& activation, double a = 0, double b = 0, double scale = 1, double shift = 0,
                         const Tensor& residual = Tensor(), bool residual_writable = false);
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

/// An activation as conv2d_activation names it, with its numbers: "relu", "clip" (min a, max b),
/// "hardswish", "hardsigmoid" (min(max(a x + b, 0), 1)), or "" for none.
struct ConvActivation {
  std::string name;
  double a = 0, b = 0;
};

/// A squeeze-and-excitation block (MobileNetV3, PP-LCNet) as one op, for inference (Note
/// [Squeeze-and-excitation as one op] in src/ops/squeeze_excite.cpp): x (N, C, H, W) float32 times
/// its per-sample channel gate act2(conv1x1(act1(conv1x1(mean of x over H and W, w1, b1)), w2, b2)),
/// w1 (C_mid, C, 1, 1), w2 (C, C_mid, 1, 1), b1 (C_mid) and b2 (C) or undefined. The result keeps x's
/// layout (channels-last stays so) and equals those ops run one by one to float32 reassociation.
/// Inference only: run under NoGradGuard or on tensors that do not require a gradient.
Tensor squeeze_excite(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1, const Tensor& w2,
                      const Tensor& b2, const ConvActivation& act2);
/// The gate alone, (N, C, 1, 1): what squeeze_excite multiplies x by (for a graph that multiplies
/// it in later, with other elementwise work).
Tensor squeeze_excite_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1,
                           const Tensor& w2, const Tensor& b2, const ConvActivation& act2);

}  // namespace braid
