// Matrix products with numpy.matmul semantics (1-d promotion, broadcast batch axes). The backend
// receives transposed views as they are, so the backward products never copy to transpose. Under
// autocast the product reads half-precision operands and writes float32, or the half dtype on a
// device that keeps half activations (Note [Autocast]).
#include "braid/amp.h"
#include "braid/nn/layers.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace detail {

Tensor matmul_raw(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype) {
  const int64_t m = a.size(-2), k = a.size(-1), k2 = b.size(-2), n = b.size(-1);
  BRAID_CHECK(k == k2, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " do not match (", k,
              " != ", k2, ")");
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  so.insert(so.end(), {m, n});
  Tensor out = new_tensor(so, out_dtype ? *out_dtype : is_compute_type(a.dtype()) ? a.dtype() : kFloat32, a.device());
  backend_of(a).matmul(broadcast_view(a, sa), broadcast_view(b, sb), out);
  return out;
}

}  // namespace detail

namespace {

// The product of a and b rounded to the autocast dtype, as one node over a and b themselves; its
// output is autocast_output_dtype's (Note [Autocast]).
Tensor autocast_matmul(const Tensor& a_in, const Tensor& b_in) {
  const DType low = autocast_dtype();
  Tensor a = cast_raw(a_in.detach(), low), b = cast_raw(b_in.detach(), low);
  Tensor out = matmul_raw(a, b, autocast_output_dtype(a_in));
  return record("matmul", out, {a_in, b_in}, [a, b, low](const Tensor& g, Grads& r) {
    autocast off(low, false);
    if (is_half(g.dtype())) {  // half activations: half x half products into float32
      const Tensor gl = cast_raw(g, low);
      if (r.needs(0)) r.set(0, matmul_raw(gl, b.mT(), kFloat32));
      if (r.needs(1)) r.set(1, matmul_raw(a.mT(), gl, kFloat32));
      return;
    }
    if (r.needs(0)) r.set(0, matmul(g, cast(b, kFloat32).mT()));
    if (r.needs(1)) r.set(1, matmul(cast(a, kFloat32).mT(), g));
  });
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const bool amp = autocasts(a_in, b_in);
  if (!amp) {
    check_compute(a_in, "matmul");
    check_compute(b_in, "matmul");
  }
  check_same_device(a_in, b_in, "matmul");
  BRAID_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: both operands need at least 1 dimension, got shapes ",
              shape_str(a_in.shape()), " and ", shape_str(b_in.shape()));
  if (a_in.dim() == 1 && b_in.dim() == 1) return matmul(a_in.unsqueeze(0), b_in.unsqueeze(1)).reshape({});
  if (a_in.dim() == 1) return matmul(a_in.unsqueeze(0), b_in).squeeze(-2);
  if (b_in.dim() == 1) return matmul(a_in, b_in.unsqueeze(1)).squeeze(-1);
  if (amp) return autocast_matmul(a_in, b_in);
  DType t = promote_types(a_in.dtype(), b_in.dtype());
  BRAID_CHECK_T(TypeError, t != kBool, "matmul: not defined for bool tensors");
  Tensor a = cast(a_in, t), b = cast(b_in, t);
  Tensor out = matmul_raw(a, b, t);  // two half operands give their dtype, as in PyTorch
  traced("matmul", out, {a, b});
  if (!is_floating(t) || !needs_grad({a, b})) return out;
  return record("matmul", out, {a, b}, [a = a.detach(), b = b.detach()](const Tensor& g, Grads& r) {
    autocast off(kBFloat16, false);  // Note [Autocast]: backward formulas run as they would outside
    if (r.needs(0)) r.set(0, matmul(g, b.mT()));
    if (r.needs(1)) r.set(1, matmul(a.mT(), g));
  });
}

namespace {

// Note [Linear as one node]
// A linear layer with a bias, y = x W^T + b, is a product and an add: two launches, the add reading
// and writing the whole output again. Where the backend has linear_bias (CUDA: cuBLASLt's bias
// epilogue, as PyTorch's addmm), the layer is one node: the bias is added to the float32 product
// before its one rounding, and backward is the product's two gradients (the formulas of matmul's
// node, autocast's included) and the bias's sum. The composite, matmul and then the add (under
// autocast the bias rounded to a half product's dtype first, as PyTorch's linear), is the
// definition: it runs wherever the entry declines (the CPU has none) and while an ONNX trace
// records. With a half output the composite rounds twice, the product and then the sum, where the
// entry rounds once: the two agree within one rounding.
Tensor linear_composite(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Tensor y = matmul(x, w.mT());
  if (!bias.defined()) return y;
  return y + (is_half(y.dtype()) && !is_half(bias.dtype()) && autocast_enabled() ? bias.to(y.dtype()) : bias);
}

// x (M, K) W^T + b as one node where the backend's linear_bias takes it; undefined where it does not,
// its scratch released before the caller runs the composite (a peak of memory the composite alone
// would not reach, which the recomputation tests measure).
Tensor linear_node(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (active_trace() != nullptr || x.dim() != 2 || bias.dim() != 1 || bias.size(0) != w.size(0) ||
      x.device() != w.device() || bias.device() != x.device())
    return Tensor();
  const bool amp = autocasts(x, w) && autocast_eligible(bias);
  const DType in = amp ? autocast_dtype() : x.dtype(), out_dtype = amp ? autocast_output_dtype(x) : x.dtype();
  if (!amp && (w.dtype() != in || bias.dtype() != in || (in != kFloat32 && !is_half(in)))) return Tensor();
  const Tensor a = contiguous_raw(cast_raw(x.detach(), in)), wt = contiguous_raw(cast_raw(w.detach(), in));
  Tensor out = new_tensor({x.size(0), w.size(0)}, out_dtype, x.device());
  if (!backend_of(x).fused().linear_bias(a, wt, contiguous_raw(cast_raw(bias.detach(), out_dtype)), out))
    return Tensor();
  if (!needs_grad({x, w, bias})) return out;
  return record("linear", out, {x, w, bias}, [a, wt, amp, in](const Tensor& g, Grads& r) {
    autocast off(amp ? in : kBFloat16, false);  // Note [Autocast]: the formulas run as outside a scope
    if (amp && is_half(g.dtype())) {  // half activations: half x half products into float32
      const Tensor gl = cast_raw(g, in);
      if (r.needs(0)) r.set(0, matmul_raw(gl, wt, kFloat32));
      if (r.needs(1)) r.set(1, matmul_raw(gl.mT(), a, kFloat32));
    } else {
      const auto wide = [amp](const Tensor& t) { return amp ? cast(t, kFloat32) : t; };
      if (r.needs(0)) r.set(0, matmul(g, wide(wt)));
      if (r.needs(1)) r.set(1, matmul(g.mT(), wide(a)));
    }
    if (r.needs(2)) r.set(2, sum(g, {0}));
  });
}

}  // namespace

// Leading axes are folded into one before the product, so that (N, L, in) inputs run as one GEMM
// rather than a batch of small ones against a broadcast weight.
Tensor nn::linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  BRAID_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), "linear: input shape ",
              shape_str(x.shape()), " does not match weight shape ", shape_str(weight.shape()));
  const Tensor x2 = x.dim() <= 2 ? x : x.reshape({-1, x.size(-1)});
  Tensor y = bias.defined() ? linear_node(x2, weight, bias) : matmul(x2, weight.mT());
  if (!y.defined()) y = linear_composite(x2, weight, bias);
  if (x.dim() <= 2) return y;
  Shape out = x.shape();
  out.back() = weight.size(0);
  // The leading axis follows from the others: a traced ONNX export keeps it symbolic (the batch).
  if (y.numel() > 0) out.front() = -1;
  return y.reshape(out);
}

}  // namespace braid
