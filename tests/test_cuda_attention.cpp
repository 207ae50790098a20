// The CUDA backend's fused attention (attention_forward, attention_backward) against the CPU's
// composite (scaled_dot_product_attention, which the CPU runs as matmul, softmax, matmul, and
// autograd's gradients of it): out, the log-sum-exp and the three gradients for float32, float16
// and bfloat16 operands (the CPU given the same rounded values widened to float32), unmasked,
// causal, with a broadcast bool mask and a float one, sequence lengths off the tiles, head dims 16,
// 64 and 128, empty and 1-length sequences; half out and gradients (rounded once from float32); then
// the op itself on cuda:0 against the CPU, and under autocast.
// cuda_parity.h's helpers live in an anonymous namespace; this suite uses a few of them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "cuda_parity.h"
#pragma GCC diagnostic pop

#include "braid/nn/attention.h"

namespace braid {
namespace {

enum class Mask { None, Causal, Bool, Float };

struct Geometry {
  int64_t B, L, S, E, Ev;
};

const char* mask_name(Mask m) {
  switch (m) {
    case Mask::None: return "unmasked";
    case Mask::Causal: return "causal";
    case Mask::Bool: return "bool mask";
    case Mask::Float: return "float mask";
  }
  return "";
}

Tensor uniform(const Shape& s, uint64_t seed) {
  Generator gen(seed);
  return rand(s, kFloat32, &gen, -1, 1, Device::cpu());
}

// The mask for m on the CPU: bool (L, S) broadcast over the batch as a stride-0 (B, L, S) view, or
// float (B, L, S) with -inf entries; key 0 always kept, so that no row is wholly masked.
Tensor make_mask(Mask m, const Geometry& g) {
  if (m != Mask::Bool && m != Mask::Float) return Tensor();
  const Shape shape = m == Mask::Bool ? Shape{g.L, g.S} : Shape{g.B, g.L, g.S};
  Tensor keep = logical_or(gt(uniform(shape, 5), full({}, -0.4)), eq(arange(g.S, kInt64, Device::cpu()), zeros({}, kInt64, Device::cpu())));
  if (m == Mask::Bool) return keep.expand({g.B, g.L, g.S});
  return where(keep, uniform(shape, 6), full({}, -std::numeric_limits<double>::infinity()));
}

std::string what(DType t, Mask m, const Geometry& g) {
  return detail::cat(dtype_name(t), " ", mask_name(m), " B=", g.B, " L=", g.L, " S=", g.S, " E=", g.E, " Ev=", g.Ev);
}

void check_entries(DType t, Mask m, const Geometry& g) {
  const std::string w = what(t, m, g);
  SCOPED_TRACE(w);
  // Operands rounded to t; the CPU reference reads them widened to float32.
  const Tensor q = uniform({g.B, g.L, g.E}, 1).to(t), k = uniform({g.B, g.S, g.E}, 2).to(t),
               v = uniform({g.B, g.S, g.Ev}, 3).to(t), go = uniform({g.B, g.L, g.Ev}, 4);
  const Tensor mask = make_mask(m, g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(g.E));
  const bool causal = m == Mask::Causal;
  Tensor qw = q.to(kFloat32).set_requires_grad(true), kw = k.to(kFloat32).set_requires_grad(true),
         vw = v.to(kFloat32).set_requires_grad(true);
  const Tensor want = scaled_dot_product_attention(qw, kw, vw, mask, 0.0, causal, scale);
  sum(want * go).backward();
  Tensor s = matmul(qw.detach() * scale, kw.detach().mT());
  if (causal) s = s + nn::generate_square_subsequent_mask(std::max(g.L, g.S), kFloat32).narrow(0, 0, g.L).narrow(1, 0, g.S);
  if (mask.defined()) s = mask.dtype() == kBool ? where(mask, s, full({}, -std::numeric_limits<double>::infinity())) : s + mask;
  const Tensor want_lse = logsumexp(s, {-1});

  const Tensor dmask = mask.defined() ? detail::as_strided(mask.contiguous().to(kCuda), mask.shape(), mask.strides(), 0)
                                      : Tensor();
  const Tensor dq = q.to(kCuda), dk = k.to(kCuda), dv = v.to(kCuda);
  Tensor out = fresh({g.B, g.L, g.Ev}, kFloat32, kCuda), lse = fresh({g.B, g.L}, kFloat32, kCuda);
  ASSERT_TRUE(backend(kCuda).fused().attention_forward(dq, dk, dv, dmask, causal, scale, out, lse));
  const Tol tol{2e-5, 2e-6}, grad_tol{1e-4, 1e-5};
  expect_match(out, want.detach(), tol, w + " out");
  expect_match(lse, want_lse, tol, w + " lse");
  Tensor gq = fresh(q.shape(), kFloat32, kCuda), gk = fresh(k.shape(), kFloat32, kCuda),
         gv = fresh(v.shape(), kFloat32, kCuda);
  ASSERT_TRUE(backend(kCuda).fused().attention_backward(dq, dk, dv, dmask, causal, scale, out, lse, go.to(kCuda), gq,
                                                         gk, gv));
  expect_match(gq, qw.grad(), grad_tol, w + " gq");
  expect_match(gk, kw.grad(), grad_tol, w + " gk");
  expect_match(gv, vw.grad(), grad_tol, w + " gv");
}

TEST(CudaAttention, EntriesMatchTheCompositeForEveryDtypeAndMask) {
  REQUIRE_CUDA();
  const Geometry geometries[] = {{2, 33, 17, 16, 16}, {1, 20, 45, 64, 64}, {2, 9, 7, 128, 128}, {1, 1, 1, 16, 8},
                                 {1, 17, 1, 16, 16},  {1, 1, 37, 64, 32}};
  for (DType t : {kFloat32, kFloat16, kBFloat16})
    for (Mask m : {Mask::None, Mask::Causal, Mask::Bool, Mask::Float})
      for (const Geometry& g : geometries) check_entries(t, m, g);
}

// Half out, grad_out and gradients (autocast's half activations): the kernels compute in float32 and
// round once on the store, so out is bit for bit the float32 out rounded, and the gradients those of
// the float32 entries given the same (half, widened) out and grad_out, rounded once.
TEST(CudaAttention, HalfOutAndGradientsAreTheFloat32ValuesRoundedOnce) {
  REQUIRE_CUDA();
  const Geometry geometries[] = {{2, 33, 17, 16, 16}, {1, 20, 45, 64, 32}};
  for (DType t : {kFloat16, kBFloat16})
    for (Mask m : {Mask::None, Mask::Causal, Mask::Bool})
      for (const Geometry& g : geometries) {
        const std::string w = what(t, m, g);
        SCOPED_TRACE(w);
        const Tensor q = uniform({g.B, g.L, g.E}, 1).to(t).to(kCuda), k = uniform({g.B, g.S, g.E}, 2).to(t).to(kCuda),
                     v = uniform({g.B, g.S, g.Ev}, 3).to(t).to(kCuda);
        const Tensor go = uniform({g.B, g.L, g.Ev}, 4).to(t).to(kCuda);
        const Tensor mask = make_mask(m, g);
        const Tensor dmask = mask.defined() ? mask.to(kCuda).expand({g.B, g.L, g.S}) : Tensor();
        const bool causal = m == Mask::Causal;
        auto& fused = backend(kCuda).fused();
        Tensor out32 = fresh({g.B, g.L, g.Ev}, kFloat32, kCuda), lse32 = fresh({g.B, g.L}, kFloat32, kCuda);
        Tensor outh = fresh({g.B, g.L, g.Ev}, t, kCuda), lseh = fresh({g.B, g.L}, kFloat32, kCuda);
        ASSERT_TRUE(fused.attention_forward(q, k, v, dmask, causal, 0.25, out32, lse32));
        ASSERT_TRUE(fused.attention_forward(q, k, v, dmask, causal, 0.25, outh, lseh));
        expect_match(outh, out32.to(t), {}, w + " half out");
        expect_match(lseh, lse32, {}, w + " lse");
        const auto grads = [&](const Tensor& out, const Tensor& g_out, DType gt) {
          std::vector<Tensor> r = {fresh(q.shape(), gt, kCuda), fresh(k.shape(), gt, kCuda), fresh(v.shape(), gt, kCuda)};
          EXPECT_TRUE(fused.attention_backward(q, k, v, dmask, causal, 0.25, out, lseh, g_out, r[0], r[1], r[2]));
          return r;
        };
        const std::vector<Tensor> want = grads(outh.to(kFloat32), go.to(kFloat32), kFloat32);
        const std::vector<Tensor> half = grads(outh, go, t), wide = grads(outh, go, kFloat32);
        for (size_t i = 0; i < 3; ++i) {
          expect_match(half[i], want[i].to(t), {}, w + " half gradient " + std::to_string(i));
          expect_match(wide[i], want[i], {}, w + " float32 gradient " + std::to_string(i));
        }
      }
}

// The op under autocast on cuda:0 (half activations): a half result, bit for bit the fused float32
// result rounded once, and half gradients for half operands.
TEST(CudaAttention, AutocastOpReturnsTheRoundedFloat32Result) {
  REQUIRE_CUDA();
  for (DType t : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor q = uniform({2, 3, 9, 16}, 1).to(t).to(kCuda).set_requires_grad(true),
                 k = uniform({2, 3, 7, 16}, 2).to(t).to(kCuda).set_requires_grad(true),
                 v = uniform({2, 3, 7, 16}, 3).to(t).to(kCuda).set_requires_grad(true);
    Tensor out;
    {
      autocast on(t);
      out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
    }
    ASSERT_EQ(out.dtype(), t);
    Tensor want = fresh({6, 9, 16}, kFloat32, kCuda), lse = fresh({6, 9}, kFloat32, kCuda);
    ASSERT_TRUE(backend(kCuda).fused().attention_forward(q.detach().reshape({6, 9, 16}), k.detach().reshape({6, 7, 16}),
                                                         v.detach().reshape({6, 7, 16}), Tensor(), true, 0.25, want,
                                                         lse));
    expect_match(out.detach().reshape({6, 9, 16}), want.to(t), {}, "autocast out");
    sum(out.to(kFloat32) * uniform(out.shape(), 9).to(kCuda)).backward();
    for (const Tensor* x : {&q, &k, &v}) EXPECT_EQ(x->grad().dtype(), t);
  }
}

TEST(CudaAttention, EmptySequencesAndWhollyMaskedRows) {
  REQUIRE_CUDA();
  auto& fused = backend(kCuda).fused();
  // No keys: out is 0 (an empty sum), lse -inf.
  Tensor out = fresh({1, 3, 4}, kFloat32, kCuda), lse = fresh({1, 3}, kFloat32, kCuda);
  ASSERT_TRUE(fused.attention_forward(zeros({1, 3, 4}, kFloat32, kCuda), zeros({1, 0, 4}, kFloat32, kCuda),
                                      zeros({1, 0, 4}, kFloat32, kCuda), Tensor(), false, 0.5, out, lse));
  expect_match(out, zeros({1, 3, 4}), {}, "no keys: out");
  expect_match(lse, full({1, 3}, -std::numeric_limits<double>::infinity()), {}, "no keys: lse");
  // No queries: nothing to write, and no launch fails.
  Tensor none = fresh({1, 0, 4}, kFloat32, kCuda), none_lse = fresh({1, 0}, kFloat32, kCuda);
  EXPECT_TRUE(fused.attention_forward(zeros({1, 0, 4}, kFloat32, kCuda), zeros({1, 5, 4}, kFloat32, kCuda),
                                      zeros({1, 5, 4}, kFloat32, kCuda), Tensor(), false, 0.5, none, none_lse));
  // A row whose every key is masked is NaN, as the composite's softmax makes it.
  const Tensor mask = tensor_bool({true, true, false, false}, {1, 2, 2}, Device::cpu());
  const Tensor q = uniform({1, 2, 16}, 7), kv = uniform({1, 2, 16}, 8);
  const Tensor want = scaled_dot_product_attention(q, kv, kv, mask);
  Tensor o = fresh({1, 2, 16}, kFloat32, kCuda), l = fresh({1, 2}, kFloat32, kCuda);
  ASSERT_TRUE(fused.attention_forward(q.to(kCuda), kv.to(kCuda), kv.to(kCuda), mask.to(kCuda), false, 0.25, o, l));
  expect_match(o, want, {2e-5, 2e-6}, "wholly masked row");
  // Head dims past 128 and float64 are declined (the op then runs the composite).
  Tensor wide = fresh({1, 2, 160}, kFloat32, kCuda), wl = fresh({1, 2}, kFloat32, kCuda);
  EXPECT_FALSE(fused.attention_forward(zeros({1, 2, 160}, kFloat32, kCuda), zeros({1, 2, 160}, kFloat32, kCuda),
                                       zeros({1, 2, 160}, kFloat32, kCuda), Tensor(), false, 0.1, wide, wl));
  EXPECT_FALSE(fused.attention_forward(zeros({1, 2, 4}, kFloat64, kCuda), zeros({1, 2, 4}, kFloat64, kCuda),
                                       zeros({1, 2, 4}, kFloat64, kCuda), Tensor(), false, 0.1, wide, wl));
}

// The op on cuda:0 (fused where it can, the composite for dropout and a float mask that needs a
// gradient) against the op on the CPU, values and gradients, with broadcast batch and heads.
TEST(CudaAttention, OpMatchesTheCpuWithGradients) {
  REQUIRE_CUDA();
  struct OpCase {
    std::string name;
    Shape q, k, v, mask;
    bool float_mask, mask_grad, causal;
  };
  const OpCase cases[] = {
      {"broadcast heads", {2, 3, 5, 16}, {1, 3, 7, 16}, {3, 7, 8}, {}, false, false, false},
      {"causal", {2, 2, 9, 16}, {2, 2, 6, 16}, {2, 2, 6, 16}, {}, false, false, true},
      {"key padding", {2, 2, 4, 16}, {2, 2, 6, 16}, {2, 2, 6, 16}, {2, 1, 1, 6}, true, false, false},
      {"mask gradient", {2, 4, 16}, {2, 6, 16}, {2, 6, 16}, {4, 6}, true, true, false},
  };
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> cpu_grads;
    Tensor cpu_out;
    for (Device d : {Device::cpu(), kCuda}) {
      std::vector<Tensor> in = {uniform(c.q, 1).to(d).set_requires_grad(true), uniform(c.k, 2).to(d).set_requires_grad(true),
                                uniform(c.v, 3).to(d).set_requires_grad(true)};
      Tensor mask;
      if (!c.mask.empty()) mask = uniform(c.mask, 4).to(d).set_requires_grad(c.mask_grad);
      const Tensor out = scaled_dot_product_attention(in[0], in[1], in[2], mask, 0.0, c.causal);
      sum(out * uniform(out.shape(), 9).to(d)).backward();
      if (c.mask_grad) in.push_back(mask);
      if (d.is_cpu()) {
        cpu_out = out.detach();
        for (const Tensor& x : in) cpu_grads.push_back(x.grad());
        continue;
      }
      expect_match(out.detach(), cpu_out, {2e-5, 2e-6}, c.name + " out");
      for (size_t i = 0; i < in.size(); ++i) expect_match(in[i].grad(), cpu_grads[i], {1e-4, 1e-5}, c.name + " grad");
    }
  }
}

}  // namespace
}  // namespace braid
