// Matrix products with numpy.matmul semantics (1-d promotion, broadcast batch axes). The backend
// receives transposed views as they are, so the backward products never copy to transpose. Under
// autocast the product reads half-precision operands and writes float32, or the half dtype on a
// device that keeps half activations (Note [Autocast]).
#include "braid/amp.h"
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

}  // namespace braid
