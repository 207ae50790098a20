// The fused entry points of inference (Note [Fused kernels] in backend/backend.h): ops that run
// several ops as one through a backend's fused kernel, each defined by (and falling back to) the ops
// it stands for. Internal: the ONNX passes (onnx/passes/) and the tests call them; users get them
// through those passes, never as API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "braid/tensor.h"

namespace braid::detail {

/// The last slot of the chain over x (float32, or int32 converted to float32 first as braid::cast
/// does; at least one step); bitwise what running the steps one by one as braid ops gives, with x's layout
/// (channels-last stays so). Inference only: x must not require a gradient. Steps referring to a later slot, a
/// ChannelAffine whose vectors are not x's channels (axis 1), an operand that does not broadcast to x's shape or
/// parameters out of range are refused with ValueError.
Tensor elementwise_chain(const Tensor& x, const std::vector<ChainStep>& steps);

/// elementwise_chain(int_matmul(a, b, a_zero, b_zero), steps): the exact integer product converted
/// to float32 and carried through the steps, bitwise. Its leading arithmetic steps on the running
/// value, by a constant or by a tensor of one value, one per column or one per element of the
/// product (a quantised linear layer's scale, bias and residual), run in the product's epilogue
/// where the backend has one (Note [int8 epilogues]); the rest as elementwise_chain. Inference only.
Tensor int_matmul_chain(const Tensor& a, const Tensor& b, int64_t a_zero, int64_t b_zero,
                        const std::vector<ChainStep>& steps);

/// elementwise_chain(matmul(a, b), steps) for a (..., K) and b (K, N) float32, b a weight (a matrix
/// that later products read again): its leading arithmetic steps on the running value, as
/// int_matmul_chain's (a linear layer's bias, a residual, a scale), run in the product's epilogue
/// where the backend has one (Note [float32 epilogues]); the result is the steps run as ops on the
/// product, up to the order of the product's sums. Inference only.
Tensor matmul_chain(const Tensor& a, const Tensor& b, const std::vector<ChainStep>& steps);

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
/// An activation as conv2d_activation and channel_gate name it, with its numbers: "relu", "clip" (min a, max b),
/// "hardswish", "hardsigmoid" (min(max(a x + b, 0), 1)), or "" for none.
struct ConvActivation {
  std::string name;
  double a = 0, b = 0;
};

/// A channel gate as one op, for inference (Note [Channel gates as one op] in src/ops/gate.cpp): x
/// (N, C, H, W) float32 times its per-sample channel gate act2(conv1x1(act1(conv1x1(mean of x over
/// H and W, w1, b1)), w2, b2)), what every squeeze-and-excitation or attention-gate block computes,
/// w1 (C_mid, C, 1, 1), w2 (C, C_mid, 1, 1), b1 (C_mid) and b2 (C) or undefined. The result keeps x's
/// layout (channels-last stays so) and equals those ops run one by one to float32 reassociation.
/// Inference only: run under NoGradGuard or on tensors that do not require a gradient.
Tensor channel_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1, const Tensor& w2,
                      const Tensor& b2, const ConvActivation& act2);
/// The gate alone, (N, C, 1, 1): what channel_gate multiplies x by (for a graph that multiplies
/// it in later, with other elementwise work).
Tensor channel_gate_values(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1,
                           const Tensor& w2, const Tensor& b2, const ConvActivation& act2);

/// The exact GELU in the order exporters write it, (x (1 + erf(x / sqrt 2))) 0.5, forward only
/// (Note [GELU as one op] in onnx/passes/gelu.cpp): bitwise those nodes, which overflow to inf for x
/// above half the largest float and round twice among subnormals, where braid::gelu does neither.
Tensor gelu_half_last(const Tensor& x);

}  // namespace braid::detail
