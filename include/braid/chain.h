// A chain of elementwise steps run as one pass over memory in inference (Note [Elementwise chains]
// in src/ops/chain.cpp): the fake quantisations, per-channel affine maps and arithmetic by constants
// that a quantised model writes between its convolutions, each step the op it stands for.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/tensor.h"

namespace braid {

/// One step of an elementwise chain. Slot 0 holds the chain's input; step i writes slot i + 1.
struct ChainStep {
  enum class Kind : uint8_t { FakeQuantize, ChannelAffine, Gelu, Add, Sub, Mul, Div, GeluHalfLast };
  Kind kind = Kind::Add;
  /// The slots read: `a` by every step; `b` by the arithmetic, whose operands are slot a and slot b,
  /// either of them kConstant for k or kTensor for `operand` (not both kConstant).
  static constexpr int kConstant = -1, kTensor = -2;
  int a = 0, b = kConstant;
  float k = 0;
  /// An arithmetic step's tensor operand: float32, on x's device, broadcasting to x's shape (a bias,
  /// a residual, a mask, a per-sample channel scale).
  Tensor operand;
  /// FakeQuantize: braid::fake_quantize(slot a, scale, zero, qtype).
  double scale = 1;
  int64_t zero = 0;
  DType qtype = kUInt8;
  /// Gelu: braid::gelu(slot a), the exact (erf) GELU; GeluHalfLast: detail::gelu_half_last(slot a).
  /// ChannelAffine: braid::channel_affine(slot a, channel_scale, channel_shift), each (C) float32.
  Tensor channel_scale, channel_shift;
};

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

namespace detail {
/// The exact GELU in the order exporters write it, (x (1 + erf(x / sqrt 2))) 0.5, forward only
/// (Note [GELU as one op] in onnx/passes/gelu.cpp): bitwise those nodes, which overflow to inf for x
/// above half the largest float and round twice among subnormals, where braid::gelu does neither.
Tensor gelu_half_last(const Tensor& x);
}  // namespace detail

}  // namespace braid
