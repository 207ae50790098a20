// Comparisons and logical ops (bool results, no gradient) and whole-tensor equality checks.
#include <cmath>
#include <cstring>

#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {
Tensor compare(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_compute(a, name);
  check_compute(b, name);
  return traced(name, binary_raw(op, a, b, promote_types(a.dtype(), b.dtype()), kBool, name), {a, b});
}
Tensor logical(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_compute(a, name);
  check_compute(b, name);
  return traced(name, binary_raw(op, a, b, kBool, kBool, name), {a, b});
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", BinaryOp::Ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return logical("logical_and", BinaryOp::And, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return logical("logical_or", BinaryOp::Or, a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return logical("logical_xor", BinaryOp::Xor, a, b); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  BRAID_CHECK(rtol >= 0 && atol >= 0, "allclose: rtol and atol must be non-negative, got ", rtol, " and ", atol);
  broadcast_shapes(a.shape(), b.shape(), "allclose");
  std::vector<double> va = expand(a, broadcast_shapes(a.shape(), b.shape())).to_vector<double>();
  std::vector<double> vb = expand(b, broadcast_shapes(a.shape(), b.shape())).to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) return false;
    if (va[i] == vb[i]) continue;  // equal infinities
    if (std::isinf(va[i]) || std::isinf(vb[i])) return false;  // an infinite difference is never close
    if (!(std::fabs(va[i] - vb[i]) <= atol + rtol * std::fabs(vb[i]))) return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  check_same_device(a, b, "equal");
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = transfer_raw(contiguous_raw(a), Device::cpu()), cb = transfer_raw(contiguous_raw(b), Device::cpu());
  int64_t bytes = a.numel() * a.element_size();
  return bytes == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(bytes)) == 0;
}

}  // namespace braid
