// Channel gates as one op (src/ops/fused.h): checks, the backend's pass where it has one, and the
// ops one by one where it does not.
//
// Note [Channel gates as one op]
// A channel gate is a global pool, two small products with activations, and a broadcast multiply:
// the block that squeeze-and-excitation and attention-gate networks share (MobileNetV3's, PP-OCR's
// classifier, detector and recogniser, the orientation classifier gate the channels of most blocks): the activations' mean over the image, a 1x1
// convolution down to a quarter of the channels, an activation, a 1x1 convolution back up, a gate
// activation, and the activations times the gate. Written as ops that is six to eight nodes, each a
// pass, an allocation and a trip through the executor, over tensors of C values but the first and
// the last: at batch 1 the block's arithmetic is a few thousand operations and its cost was the
// overhead of the nodes (ppocr_cls: 9 blocks, about a third of its inference). channel_gate runs
// the block at once: the backend (FusedKernels::channel_gate) sums x's channels in one pass, computes
// the two small products and activations per sample, and multiplies x by the gate in a second pass,
// keeping x's layout. The activations are the ones conv2d_activation fuses, computed as its
// epilogues compute them. The sums and products are in another order than the ops' (the mean in
// double, the products' terms summed in double), so the two agree to float32 reassociation; a
// backend without the primitive runs the ops. The ONNX executor finds the blocks in inference
// (onnx/passes/gate.cpp).
#include "braid/conv.h"
#include "ops/fused.h"

#include "braid/autograd.h"
#include "braid/ops.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

void check_channel_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  const char* op = "channel_gate";
  BRAID_CHECK(x.defined() && w1.defined() && w2.defined(), op, ": x, w1 and w2 must be defined");
  BRAID_CHECK_T(TypeError, x.dtype() == kFloat32 && w1.dtype() == kFloat32 && w2.dtype() == kFloat32, op,
                ": x, w1 and w2 must be float32, got ", dtype_name(x.dtype()), ", ", dtype_name(w1.dtype()), " and ",
                dtype_name(w2.dtype()));
  BRAID_CHECK(x.dim() == 4, op, ": x must be (N, C, H, W), got shape ", shape_str(x.shape()));
  const int64_t c = x.size(1);
  BRAID_CHECK(w1.dim() == 4 && w1.size(1) == c && w1.size(2) == 1 && w1.size(3) == 1 && w1.size(0) > 0, op,
              ": w1 must be (C_mid, ", c, ", 1, 1) for x of shape ", shape_str(x.shape()), ", got ",
              shape_str(w1.shape()));
  const int64_t mid = w1.size(0);
  BRAID_CHECK(w2.dim() == 4 && w2.size(0) == c && w2.size(1) == mid && w2.size(2) == 1 && w2.size(3) == 1, op,
              ": w2 must be (", c, ", ", mid, ", 1, 1) after w1 of shape ", shape_str(w1.shape()), ", got ",
              shape_str(w2.shape()));
  for (const auto& [b, n, what] : {std::tuple{&b1, mid, "b1"}, std::tuple{&b2, c, "b2"}})
    if (b->defined()) {
      BRAID_CHECK_T(TypeError, b->dtype() == kFloat32, op, ": ", what, " must be float32, got ",
                    dtype_name(b->dtype()));
      BRAID_CHECK(b->dim() == 1 && b->numel() == n, op, ": ", what, " must be (", n, "), got shape ",
                  shape_str(b->shape()));
    }
  for (const Tensor* t : {&w1, &b1, &w2, &b2})
    if (t->defined()) check_same_device(x, *t, op);
  for (const Tensor* t : {&x, &w1, &b1, &w2, &b2})
    BRAID_CHECK(!t->defined() || !needs_grad(*t), op, ": runs in inference only, but an operand requires a gradient");
}

// conv2d_activation, or conv2d where there is no activation: a 1x1 convolution of (N, C, 1, 1).
Tensor pointwise(const Tensor& m, const Tensor& w, const Tensor& b, const ConvActivation& act) {
  if (act.name.empty()) return conv2d(m, w, b);
  return conv2d_activation(m, w, b, {1, 1}, {0, 0}, {1, 1}, 1, act.name, act.a, act.b);
}

// The gate (N, C) of x, and x times it into `scaled` when asked for, or false when the backend has no
// such pass.
bool fused(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1, const Tensor& w2,
           const Tensor& b2, const ConvActivation& act2, Tensor& gate, Tensor* scaled) {
  const Epilogue e1 = activation_epilogue(act1.name, act1.a, act1.b, "channel_gate");
  const Epilogue e2 = activation_epilogue(act2.name, act2.a, act2.b, "channel_gate");
  if (x.numel() == 0) return false;
  const SameLayout l = same_layout(x.detach(), kFloat32);
  const bool channels_last = !l.result.is_contiguous();
  const auto flat = [](const Tensor& w) { return contiguous(w.detach().reshape({w.size(0), w.size(1)})); };
  const auto plain = [](const Tensor& b) { return b.defined() ? contiguous(b.detach()) : b; };
  gate = new_tensor({x.size(0), x.size(1)}, kFloat32, x.device());
  // The backend sees x as (N, H, W, C) memory when channels-last, (N, C, H, W) otherwise.
  if (!backend_of(x).fused().channel_gate(l.in, channels_last, flat(w1), plain(b1), e1, flat(w2), plain(b2), e2, gate,
                                    scaled ? l.out : Tensor()))
    return false;
  if (scaled) *scaled = l.result;
  return true;
}

// The composite gate: the ops one by one.
Tensor composite_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1, const Tensor& w2,
                      const Tensor& b2, const ConvActivation& act2) {
  return pointwise(pointwise(mean(x, {2, 3}, true), w1, b1, act1), w2, b2, act2);
}

}  // namespace

Tensor detail::channel_gate_values(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1,
                           const Tensor& w2, const Tensor& b2, const ConvActivation& act2) {
  check_channel_gate(x, w1, b1, w2, b2);
  NoGradGuard no_grad;
  Tensor gate;
  if (fused(x, w1, b1, act1, w2, b2, act2, gate, nullptr)) return gate.view({x.size(0), x.size(1), 1, 1});
  return composite_gate(x, w1, b1, act1, w2, b2, act2);
}

Tensor detail::channel_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const ConvActivation& act1, const Tensor& w2,
                      const Tensor& b2, const ConvActivation& act2) {
  check_channel_gate(x, w1, b1, w2, b2);
  NoGradGuard no_grad;
  Tensor gate, scaled;
  if (fused(x, w1, b1, act1, w2, b2, act2, gate, &scaled)) return scaled;
  const Tensor y = mul(x, composite_gate(x, w1, b1, act1, w2, b2, act2));
  if (x.dim() == 4 && !x.is_contiguous() && x.is_channels_last() && (y.is_contiguous() || !y.is_channels_last()))
    return contiguous(y.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});  // the layout promised
  return y;
}

}  // namespace braid
