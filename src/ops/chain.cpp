// Elementwise chains (src/ops/fused.h): checks, the backend's one pass where it has one, and
// the steps run one by one as braid ops where it does not.
//
// Note [Elementwise chains]
// A quantised model written as QDQ puts a QuantizeLinear/DequantizeLinear pair after nearly every
// op, so that between two convolutions the activations go through a pair, a BatchNormalization, a
// pair, an Add of 3, a pair, a Mul, a pair, a Div by 6 and a pair (a HardSwish written out and
// quantised): nine passes over memory, nine tensors allocated and nine trips through the executor,
// for arithmetic that is elementwise throughout. A transformer has shorter runs of the same kind:
// the scores' division and mask, a bias and a residual before a LayerNormalization. elementwise_chain runs such a run
// of steps in one pass: the backend (Backend::elementwise_chain) takes the memory in blocks that stay in cache and
// applies every step to a block before the next, each step the same float32 operations as the op
// it stands for (braid::fake_quantize, braid::channel_affine, the binary ops by a float32 constant,
// by a tensor that broadcasts to the input's shape or by an earlier step's value), so the result is
// bitwise the steps'. A backend without the
// primitive gets exactly those ops. The ONNX executor finds the chains in inference (make_plan's
// find_chains, onnx/chains.cpp).
#include "ops/fused.h"

#include <cmath>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

void check_chain(const Tensor& x, const std::vector<ChainStep>& steps) {
  const char* op = "elementwise_chain";
  BRAID_CHECK(x.defined(), op, ": the input is undefined");
  BRAID_CHECK_T(TypeError, x.dtype() == kFloat32 || x.dtype() == kInt32, op,
                ": the input must be float32 or int32, got ", dtype_name(x.dtype()));
  BRAID_CHECK(!needs_grad(x), op, ": runs in inference only, but the input requires a gradient");
  BRAID_CHECK(!steps.empty(), op, ": no steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    const ChainStep& s = steps[i];
    const int written = static_cast<int>(i);  // slots 0 .. i hold values when step i runs
    const auto slot = [&](int v, bool constant_ok) { return (v >= 0 && v <= written) || (constant_ok && v == -1); };
    switch (s.kind) {
      case ChainStep::Kind::FakeQuantize:
        BRAID_CHECK(slot(s.a, false), op, ": step ", i, " reads slot ", s.a, ", which is not written before it");
        BRAID_CHECK(std::isfinite(s.scale) && s.scale > 0, op, ": step ", i,
                    ": scale must be positive and finite, got ", s.scale);
        BRAID_CHECK_T(TypeError, s.qtype == kInt8 || s.qtype == kUInt8, op, ": step ", i,
                      ": the quantised type must be int8 or uint8, got ", dtype_name(s.qtype));
        BRAID_CHECK(scalar_fits(static_cast<double>(s.zero), s.qtype), op, ": step ", i, ": zero point ", s.zero,
                    " is outside ", dtype_name(s.qtype), "'s range");
        break;
      case ChainStep::Kind::Gelu:
      case ChainStep::Kind::GeluHalfLast:
        BRAID_CHECK(slot(s.a, false), op, ": step ", i, " reads slot ", s.a, ", which is not written before it");
        break;
      case ChainStep::Kind::ChannelAffine:
        BRAID_CHECK(slot(s.a, false), op, ": step ", i, " reads slot ", s.a, ", which is not written before it");
        BRAID_CHECK(x.dim() >= 2 && s.channel_scale.defined() && s.channel_shift.defined() &&
                        s.channel_scale.dim() == 1 && s.channel_shift.dim() == 1 &&
                        s.channel_scale.numel() == x.size(1) && s.channel_shift.numel() == x.size(1) &&
                        s.channel_scale.dtype() == kFloat32 && s.channel_shift.dtype() == kFloat32,
                    op, ": step ", i, ": a per-channel affine map needs float32 scale and shift of the input's ",
                    "channels (axis 1 of ", shape_str(x.shape()), ")");
        check_same_device(x, s.channel_scale, op);
        check_same_device(x, s.channel_shift, op);
        break;
      default: {
        const auto operand_ok = [&](int v) { return slot(v, true) || v == ChainStep::kTensor; };
        BRAID_CHECK(operand_ok(s.a) && operand_ok(s.b) && (s.a != ChainStep::kConstant || s.b != ChainStep::kConstant),
                    op, ": step ", i, " reads slots ", s.a, " and ", s.b,
                    ": each must be written before it, -1 (the constant) or -2 (the tensor operand), not both -1");
        if (s.a == ChainStep::kTensor || s.b == ChainStep::kTensor) {
          BRAID_CHECK(s.operand.defined(), op, ": step ", i, " reads its tensor operand, which is undefined");
          BRAID_CHECK_T(TypeError, s.operand.dtype() == kFloat32, op, ": step ", i,
                        ": the tensor operand must be float32, got ", dtype_name(s.operand.dtype()));
          check_same_device(x, s.operand, op);
          BRAID_CHECK(broadcast_shapes(s.operand.shape(), x.shape(), op) == x.shape(), op, ": step ", i,
                      ": an operand of shape ", shape_str(s.operand.shape()), " does not broadcast to the input's ",
                      shape_str(x.shape()));
        }
      }
    }
  }
}

}  // namespace

Tensor detail::elementwise_chain(const Tensor& x, const std::vector<ChainStep>& steps) {
  check_chain(x, steps);
  NoGradGuard no_grad;
  const Tensor xd = x.detach();
  const bool channels_last = x.dim() == 4 && !x.is_contiguous() && x.is_channels_last();
  const int64_t channels = x.dim() >= 2 ? x.size(1) : 1;
  const int64_t inner = channels_last || x.dim() < 2 || x.numel() == 0 ? 1 : x.numel() / (x.size(0) * channels);
  if (x.numel() > 0) {
    const SameLayout l = same_layout(xd, kFloat32);
    // Tensor operands as views of x's shape in the memory order of l.in (stride 0 where they
    // broadcast), so that the backend indexes them as it walks x's memory.
    std::vector<ChainStep> in_order = steps;
    for (ChainStep& s : in_order)
      if (s.operand.defined()) {
        s.operand = broadcast_view(s.operand.detach(), x.shape());
        if (channels_last) s.operand = s.operand.permute({0, 2, 3, 1});
      }
    if (backend_of(x).fused().elementwise_chain(l.in, in_order, channels, channels_last ? 1 : inner, l.out)) return l.result;
  }
  // The composite: each step as its op.
  std::vector<Tensor> v{cast(xd, kFloat32)};
  for (const ChainStep& s : steps) {
    const auto operand = [&](int i) {
      return i >= 0                    ? v[static_cast<size_t>(i)]
             : i == ChainStep::kTensor ? s.operand.detach()
                                       : scalar_operand(v[0], s.k);
    };
    switch (s.kind) {
      case ChainStep::Kind::FakeQuantize:
        v.push_back(fake_quantize(v[static_cast<size_t>(s.a)], s.scale, s.zero, s.qtype));
        break;
      case ChainStep::Kind::Gelu:
        v.push_back(gelu(v[static_cast<size_t>(s.a)]));
        break;
      case ChainStep::Kind::GeluHalfLast:
        v.push_back(detail::gelu_half_last(v[static_cast<size_t>(s.a)]));
        break;
      case ChainStep::Kind::ChannelAffine:
        v.push_back(channel_affine(v[static_cast<size_t>(s.a)], s.channel_scale, s.channel_shift));
        break;
      case ChainStep::Kind::Add:
        v.push_back(operand(s.a) + operand(s.b));
        break;
      case ChainStep::Kind::Sub:
        v.push_back(operand(s.a) - operand(s.b));
        break;
      case ChainStep::Kind::Mul:
        v.push_back(operand(s.a) * operand(s.b));
        break;
      case ChainStep::Kind::Div:
        v.push_back(operand(s.a) / operand(s.b));
        break;
    }
  }
  const Tensor& y = v.back();
  if (channels_last && (y.is_contiguous() || !y.is_channels_last()))  // the layout promised, whatever the ops gave
    return contiguous(y.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
  return y;
}

namespace {

// Step s as an epilogue step on the running value (slot `at`), or false: arithmetic with the
// running value first (either side for Add and Mul) and a constant, or a tensor of one value, one per
// column (n along the last axis) or one per element of the product.
bool epilogue_step(const ChainStep& s, int at, const Shape& product, Device device, FusedKernels::EpilogueStep& e) {
  using K = ChainStep::Kind;
  if (s.kind != K::Add && s.kind != K::Sub && s.kind != K::Mul && s.kind != K::Div) return false;
  const bool commutes = s.kind == K::Add || s.kind == K::Mul;
  const int other = s.a == at ? s.b : commutes && s.b == at ? s.a : at;
  if (other != ChainStep::kConstant && other != ChainStep::kTensor) return false;
  if (other == ChainStep::kConstant) {
    e = {s.kind, Tensor(), s.k};
    return true;
  }
  const Tensor& t = s.operand;
  if (!t.defined() || t.dtype() != kFloat32 || t.device() != device || t.dim() > static_cast<int64_t>(product.size()))
    return false;
  const int64_t n = product.back();
  const bool one = t.numel() == 1, column = t.numel() == n && t.size(-1) == n, whole = t.shape() == product;
  if (!one && !column && !whole) return false;
  e = {s.kind, contiguous(t.detach()).reshape({t.numel()}), 0};
  return true;
}

// The leading steps of `steps` that run as the product's epilogue: arithmetic on the running value
// (epilogue_step), cut back until the steps after them read only its last value and their own.
std::vector<FusedKernels::EpilogueStep> leading_epilogue(const std::vector<ChainStep>& steps, const Shape& product,
                                                    Device device) {
  std::vector<FusedKernels::EpilogueStep> epilogue;
  for (size_t j = 0; j < steps.size(); ++j) {
    FusedKernels::EpilogueStep e;
    if (!epilogue_step(steps[j], static_cast<int>(j), product, device, e)) break;
    epilogue.push_back(std::move(e));
  }
  const auto rest_reads_later = [&](size_t from) {
    for (size_t j = from; j < steps.size(); ++j)
      for (int v : {steps[j].a, steps[j].b})
        if (v >= 0 && v < static_cast<int>(from)) return false;
    return true;
  };
  while (!epilogue.empty() && !rest_reads_later(epilogue.size())) epilogue.pop_back();
  return epilogue;
}

// out (the product with the first `done` steps applied, of shape `product`) through the other steps.
Tensor rest_of_chain(Tensor out, const Shape& product, const std::vector<ChainStep>& steps, size_t done) {
  out = out.reshape(product);
  if (done == steps.size()) return out;
  std::vector<ChainStep> rest(steps.begin() + static_cast<std::ptrdiff_t>(done), steps.end());
  for (ChainStep& s : rest)
    for (int* v : {&s.a, &s.b})
      if (*v >= 0) *v -= static_cast<int>(done);
  return elementwise_chain(out, rest);
}

}  // namespace

Tensor detail::int_matmul_chain(const Tensor& a, const Tensor& b, int64_t a_zero, int64_t b_zero,
                        const std::vector<ChainStep>& steps) {
  BRAID_CHECK(!steps.empty(), "int_matmul_chain: no steps");
  NoGradGuard no_grad;
  if (a.defined() && b.defined() && a.dim() >= 2 && b.dim() == 2 && a.size(-1) == b.size(0) &&
      (a.dtype() == kInt8 || a.dtype() == kUInt8) && (b.dtype() == kInt8 || b.dtype() == kUInt8) &&
      a.device() == b.device()) {
    const int64_t k = a.size(-1), n = b.size(1), m = a.numel() / std::max<int64_t>(k, 1);
    Shape product(a.shape().begin(), a.shape().end() - 1);
    product.push_back(n);
    const std::vector<FusedKernels::EpilogueStep> epilogue = leading_epilogue(steps, product, a.device());
    if (!epilogue.empty() && scalar_fits(static_cast<double>(a_zero), a.dtype()) &&
        scalar_fits(static_cast<double>(b_zero), b.dtype())) {
      Tensor out = new_tensor({m, n}, kFloat32, a.device());
      if (backend_of(a).fused().matmul_int8_epilogue(contiguous(a).reshape({m, k}), a_zero, contiguous(b), b_zero, epilogue,
                                             out))
        return rest_of_chain(out, product, steps, epilogue.size());
    }
  }
  return elementwise_chain(int_matmul(a, b, a_zero, b_zero), steps);
}

// Note [float32 epilogues] in src/backend/cpu/matmul_weight.cpp.
Tensor detail::matmul_chain(const Tensor& a, const Tensor& b, const std::vector<ChainStep>& steps) {
  BRAID_CHECK(!steps.empty(), "matmul_chain: no steps");
  NoGradGuard no_grad;
  if (a.defined() && b.defined() && a.dim() >= 2 && b.dim() == 2 && a.size(-1) == b.size(0) && a.dtype() == kFloat32 &&
      b.dtype() == kFloat32 && a.device() == b.device() && b.is_contiguous()) {
    const int64_t k = a.size(-1), n = b.size(1), m = a.numel() / std::max<int64_t>(k, 1);
    Shape product(a.shape().begin(), a.shape().end() - 1);
    product.push_back(n);
    const std::vector<FusedKernels::EpilogueStep> epilogue = leading_epilogue(steps, product, a.device());
    if (!epilogue.empty()) {
      Tensor out = new_tensor({m, n}, kFloat32, a.device());
      if (backend_of(a).fused().matmul_epilogue(contiguous(a).reshape({m, k}), b, epilogue, out))
        return rest_of_chain(out, product, steps, epilogue.size());
    }
  }
  return elementwise_chain(matmul(a, b), steps);
}

}  // namespace braid
