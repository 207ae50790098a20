// Scaled dot-product attention (braid/ops.h: scaled_dot_product_attention) as one autograd node:
// the composite softmax(q k^T * scale + mask) v, with dropout on the probabilities, or the
// backend's fused kernels (attention_forward, attention_backward; Note [Fused kernels]) where there
// is no dropout. Both directions' formulas live here.
#include <cmath>
#include <limits>
#include <optional>

#include "braid/amp.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

// Note [Attention as one node]
// The composite, which is the fused kernels' definition and fallback, is PyTorch's reference
// formula with q scaled before the product (as MultiheadAttention always did):
//   s = (q * scale) k^T + bias,  p = softmax(s),  a = p * keep (dropout),  out = a v,
// bias being the mask (bool: 0 where true, -inf where false; float: itself) or the causal -inf
// above the diagonal, upper-left aligned when L != S. Recorded as one node, its backward is
//   dv = a^T g,  da = (g v^T) * keep,  ds = p * (da - rowsum(da * p)),
//   dq = (ds k) * scale,  dk = ds^T (q * scale),  dmask = ds (summed to the mask's shape),
// each product a forward op, so the formulas run on every backend. Without dropout and with a
// backend that has them, the fused kernels compute out with the log-sum-exp of each row of s and
// the backward recomputes p from it (FlashAttention-2), so that neither direction holds an (L, S)
// matrix per batch; a float mask that needs a gradient keeps the composite, whose ds is that
// gradient. Dropout keeps the composite too: its mask is drawn from the generator as dropout's is,
// so a seeded run gives the values it gave before the op existed. Under autocast (Note [Autocast])
// both products read operands rounded to the scope's dtype, as two matmuls would, and the
// backward multiplies by those rounded operands widened to float32. Where autocast's output is half
// (a GPU), the fused forward writes it directly, rounded once from float32, and the backward reads
// that half out and gradient and writes half gradients when q, k and v are half: its rowsum(g * out)
// then sees the rounded out, as PyTorch's fused kernels do (the gradients move within that rounding;
// the output is bit for bit the float32 result rounded once). An active ONNX trace runs the
// composite's ops one by one, as the exporter knows them.

constexpr double kInf = std::numeric_limits<double>::infinity();

Shape batch_of(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

Shape with_rows(Shape batch, int64_t r, int64_t c) {
  batch.insert(batch.end(), {r, c});
  return batch;
}

// The additive bias of the scores s (undefined when there is none).
Tensor score_bias(const Tensor& mask, bool causal, const Tensor& s) {
  const DType dt = s.dtype();
  const Device dev = s.device();
  if (causal) {
    const int64_t L = s.size(-2), S = s.size(-1);
    return where(gt(arange(S, kInt64, dev).unsqueeze(0), arange(L, kInt64, dev).unsqueeze(1)),
                 full({}, -kInf, dt, dev), zeros({}, dt, dev));
  }
  if (!mask.defined()) return mask;
  if (mask.dtype() == kBool) return where(mask, zeros({}, dt, dev), full({}, -kInf, dt, dev));
  return mask.dtype() == dt ? mask : mask.to(dt);
}

struct Composite {
  Tensor out, probs, keep;  // keep: dropout's scaled mask, undefined without dropout
};

// The operands as the products read them: rounded to the autocast dtype and widened to float32.
struct Rounding {
  bool amp = false;
  DType low = kBFloat16;
  Tensor operator()(const Tensor& t) const { return amp ? cast(cast(t, low), kFloat32) : t; }
};

// The composite forward with forward ops (recorded, and traced, when the caller lets them be). Under
// autocast (rd.amp) the products read operands rounded as rd rounds them and the rest runs in float32,
// whatever the device's rule for products (Note [Autocast]): the op's output is rounded once, after.
Composite composite(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal, double scale,
                    double p, Generator* gen, const Rounding& rd = Rounding{}) {
  std::optional<autocast> off;
  if (rd.amp) off.emplace(rd.low, false);
  Tensor s = matmul(rd(q * scale), rd(k).mT());
  const Tensor bias = score_bias(mask, causal, s);
  if (bias.defined()) s = s + bias;
  Composite c;
  c.probs = softmax(s, -1);
  Tensor a = c.probs;
  if (p == 1.0) {  // as dropout(): keeps the graph, so the gradient is zero rather than missing
    c.keep = zeros_like(a);
    a = a * 0.0;
  } else if (p > 0.0) {
    c.keep = bernoulli(a.shape(), 1.0 - p, a.dtype(), gen, a.device()) * (1.0 / (1.0 - p));
    a = a * c.keep;
  }
  c.out = matmul(rd(a), rd(v));
  return c;
}

// Note [Attention as one node]'s backward of the composite, into r's slots q, k, v, mask.
void composite_grads(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                     const Tensor& keep, double scale, const Rounding& rd, Grads& r) {
  autocast off(kBFloat16, false);
  const Tensor a = keep.defined() ? probs * keep : probs;
  if (r.needs(2)) r.set(2, matmul(rd(a).mT(), g));
  if (!r.needs(0) && !r.needs(1) && !(r.all().size() > 3 && r.needs(3))) return;
  Tensor da = matmul(g, rd(v).mT());
  if (keep.defined()) da = da * keep;
  const Tensor ds = probs * (da - sum(da * probs, {-1}, true));
  if (r.needs(0)) r.set(0, matmul(ds, rd(k)) * scale);
  if (r.needs(1)) r.set(1, matmul(ds.mT(), rd(q * scale)));
  if (r.all().size() > 3) r.set(3, ds);
}

// t broadcast to (batch..., r, c) and seen as (B, r, c): a view with one batch stride where the
// broadcast allows it (a mask shared by every batch, or one per batch), else a contiguous copy.
Tensor rows3(const Tensor& t, const Shape& batch, int64_t r, int64_t c) {
  const Tensor b = broadcast_view(t, with_rows(batch, r, c));
  int64_t n = 1, stride = 0;
  bool one_stride = true;
  for (size_t i = batch.size(); i-- > 0;) {
    if (batch[i] == 1) continue;
    if (n > 1 && b.strides()[i] != stride * n) one_stride = false;
    if (n == 1) stride = b.strides()[i];
    n *= batch[i];
  }
  if (one_stride) return as_strided(b, {n, r, c}, {stride, b.strides()[b.dim() - 2], b.strides()[b.dim() - 1]}, b.offset());
  return contiguous_raw(b).view({n, r, c});
}

// The fused forward and its node; an undefined result where the backend declines.
Tensor fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal, double scale,
             const Rounding& rd) {
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  const Shape batch = broadcast_shapes(broadcast_shapes(batch_of(q), batch_of(k)), batch_of(v));
  if (mask.defined() && broadcast_shapes(with_rows(batch, L, S), mask.shape()) != with_rows(batch, L, S)) return {};
  int64_t B = 1;
  for (int64_t d : batch) B *= d;
  if (B == 0 || L == 0 || S == 0) return {};
  const auto operand = [&](const Tensor& t, int64_t n, int64_t e) {
    const Tensor x = rd.amp ? cast_raw(t.detach(), rd.low) : t.detach();
    return contiguous_raw(broadcast_view(x, with_rows(batch, n, e))).view({B, n, e});
  };
  const Tensor q3 = operand(q, L, E), k3 = operand(k, S, E), v3 = operand(v, S, Ev);
  Tensor m3;
  if (mask.defined()) m3 = rows3(mask.dtype() == kBool ? mask : cast_raw(mask, kFloat32), batch, L, S);
  // Under autocast with half activations the kernel offers to round its float32 result once into a
  // half out, which saves the cast's pass; a backend that declines writes float32, which the caller
  // rounds: one rounding of the same value either way.
  const DType compute = rd.amp ? kFloat32 : q.dtype(), want = rd.amp ? autocast_output_dtype(q) : compute;
  Tensor out3, lse = new_tensor({B, L}, kFloat32, q.device());
  const auto forward = [&](DType dtype) {
    out3 = new_tensor({B, L, Ev}, dtype, q.device());
    return backend_of(q).fused().attention_forward(q3, k3, v3, m3, causal, scale, out3, lse);
  };
  if (!(want != compute && want == rd.low && forward(want)) && !forward(compute)) return {};
  const DType out_dtype = out3.dtype();
  // Gradients in that half dtype when every operand has it (the engine would round them to it anyway).
  const bool half_grads = out_dtype != compute && q.dtype() == out_dtype && k.dtype() == out_dtype &&
                          v.dtype() == out_dtype;
  const DType grad_dtype = half_grads ? out_dtype : compute;
  const Tensor out = out3.view(with_rows(batch, L, Ev));
  if (!needs_grad({q, k, v})) return out;
  return record("scaled_dot_product_attention", out, {q, k, v},
                [=, saved_out = out3](const Tensor& g, Grads& r) {
                  const Tensor g3 = contiguous_raw(g).view({B, L, Ev});
                  Tensor gq = new_tensor(q3.shape(), grad_dtype, q3.device());
                  Tensor gk = new_tensor(k3.shape(), grad_dtype, q3.device());
                  Tensor gv = new_tensor(v3.shape(), grad_dtype, q3.device());
                  if (backend_of(q3).fused().attention_backward(q3, k3, v3, m3, causal, scale, saved_out, lse, g3, gq,
                                                                  gk, gv)) {
                    r.set(0, gq.view(with_rows(batch, L, E)));
                    r.set(1, gk.view(with_rows(batch, S, E)));
                    r.set(2, gv.view(with_rows(batch, S, Ev)));
                    return;
                  }
                  // The backend has a forward but no backward: recompute the probabilities.
                  const auto wide = [&](const Tensor& t) { return cast(t, compute); };
                  Tensor probs;
                  {
                    NoGradGuard inner;
                    autocast off(kBFloat16, false);
                    Tensor s = matmul(wide(q3) * scale, wide(k3).mT());
                    const Tensor bias = score_bias(m3, causal, s);
                    probs = softmax(bias.defined() ? s + bias : s, -1);
                  }
                  composite_grads(wide(g3), wide(q3), wide(k3), wide(v3), probs, Tensor(), scale, Rounding{}, r);
                  for (size_t i = 0; i < 3; ++i)
                    if (r.needs(i)) r.all()[i] = r.all()[i].view(with_rows(batch, i == 0 ? L : S, i == 2 ? Ev : E));
                });
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale, Generator* gen) {
  const char* op = "scaled_dot_product_attention";
  for (const Tensor* t : {&q, &k, &v}) {
    check_compute(*t, op);
    BRAID_CHECK_T(TypeError, is_floating(t->dtype()), op, ": query, key and value must be floating-point, got ",
                  dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), " and ", dtype_name(v.dtype()));
    BRAID_CHECK(t->dim() >= 2, op, ": query, key and value need (..., L or S, E) shapes, got ", shape_str(q.shape()),
                ", ", shape_str(k.shape()), " and ", shape_str(v.shape()));
    check_same_device(q, *t, op);
  }
  BRAID_CHECK_T(TypeError, k.dtype() == q.dtype() && v.dtype() == q.dtype(), op,
                ": query, key and value must have one dtype, got ", dtype_name(q.dtype()), ", ",
                dtype_name(k.dtype()), " and ", dtype_name(v.dtype()));
  BRAID_CHECK(q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2), op,
              ": expected query (..., L, E), key (..., S, E) and value (..., S, Ev), got shapes ",
              shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  const Shape batch = broadcast_shapes(broadcast_shapes(batch_of(q), batch_of(k), op), batch_of(v), op);
  const int64_t L = q.size(-2), S = k.size(-2);
  if (attn_mask.defined()) {
    check_same_device(q, attn_mask, op);
    BRAID_CHECK_T(TypeError, attn_mask.dtype() == kBool || is_floating(attn_mask.dtype()), op,
                  ": attn_mask must be bool or floating-point, got ", dtype_name(attn_mask.dtype()));
    check_compute(attn_mask, op);
    broadcast_shapes(attn_mask.shape(), with_rows(batch, L, S), op);
    BRAID_CHECK(!is_causal, op, ": give attn_mask or is_causal, not both (attn_mask shape ",
                shape_str(attn_mask.shape()), ")");
  }
  BRAID_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout_p must be in [0, 1], got ", dropout_p);
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (active_trace() != nullptr) return composite(q, k, v, attn_mask, is_causal, sc, dropout_p, gen).out;

  Rounding rd;
  rd.amp = autocasts(q, k) && autocasts(q, v);
  rd.low = rd.amp ? autocast_dtype() : kBFloat16;
  if (!rd.amp && is_half(q.dtype())) {  // half operands outside a scope: float32 inside, rounded once
    const Tensor m = attn_mask.defined() && is_half(attn_mask.dtype()) ? cast(attn_mask, kFloat32) : attn_mask;
    return cast(scaled_dot_product_attention(cast(q, kFloat32), cast(k, kFloat32), cast(v, kFloat32), m, dropout_p,
                                             is_causal, sc, gen),
                q.dtype());
  }
  // On autocast's lower-precision list: the float32 result rounded to the device's output dtype.
  const auto rounded = [&](const Tensor& out) { return rd.amp ? cast(out, autocast_output_dtype(q)) : out; };
  const bool mask_grad = attn_mask.defined() && attn_mask.dtype() != kBool && needs_grad(attn_mask);
  if (dropout_p == 0.0 && !mask_grad) {
    Tensor out = fused(q, k, v, attn_mask, is_causal, sc, rd);
    if (out.defined()) return rounded(out);
  }
  const bool grad = needs_grad({q, k, v, attn_mask});
  Composite c;
  {
    NoGradGuard no_grad;
    c = composite(q.detach(), k.detach(), v.detach(), attn_mask.defined() ? attn_mask.detach() : attn_mask, is_causal,
                  sc, dropout_p, gen, rd);
  }
  if (!grad) return rounded(c.out);
  const Tensor mask_in = mask_grad ? attn_mask : Tensor();
  return rounded(record(op, c.out, {q, k, v, mask_in},
                        [q = q.detach(), k = k.detach(), v = v.detach(), probs = c.probs, keep = c.keep, sc, rd](
                            const Tensor& g, Grads& r) { composite_grads(g, q, k, v, probs, keep, sc, rd, r); }));
}

}  // namespace braid
