// Element-type facts and the promotion rule binary ops use.
#include "braid/dtype.h"

#include <cmath>
#include <limits>

#include "braid/error.h"

namespace braid {

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Int32: return 4;
    case DType::Bool: return 1;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8:
      return 1;
    case DType::UInt8:
      return 1;
  }
  return 0;
}

std::string dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::Bool: return "bool";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8:
      return "int8";
    case DType::UInt8:
      return "uint8";
  }
  return "unknown";
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

bool is_compute_type(DType t) {
  return t != DType::Float16 && t != DType::BFloat16 && t != DType::Int8 && t != DType::UInt8;
}

DType compute_type(DType t) {
  if (t == DType::Float16 || t == DType::BFloat16) return DType::Float32;
  if (t == DType::Int8 || t == DType::UInt8) return DType::Int32;
  return t;
}

// The table is in dtype.h (Note [Type promotion]). int8 and uint8 promote as int32; the half types
// rank between the integers and float32, and two different ones meet in float32.
DType promote_types(DType a, DType b) {
  if (a == b && is_half(a)) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool: return 0;
      case DType::Int8:
      case DType::UInt8:
      case DType::Int32: return 1;
      case DType::Int64: return 2;
      case DType::Float16:
      case DType::BFloat16: return 3;
      case DType::Float32: return 4;
      case DType::Float64: return 5;
    }
    return 0;
  };
  const int ra = rank(a), rb = rank(b);
  if (ra == 3 && rb < 3) return a;  // a half tensor with an integer or bool one keeps its dtype
  if (rb == 3 && ra < 3) return b;
  static const DType by_rank[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float32, DType::Float32,
                                  DType::Float64};
  return by_rank[std::max(ra, rb)];
}

bool scalar_fits(double v, DType t) {
  if (t == DType::Bool || t == DType::Float64) return true;
  if (is_floating(t)) {  // NaN and inf convert; a finite value must not exceed the largest (PyTorch's rule)
    const double max = t == DType::Float32   ? std::numeric_limits<float>::max()
                       : t == DType::Float16 ? 65504.0
                                             : 3.3895313892515355e38;  // bfloat16
    return !std::isfinite(v) || std::fabs(v) <= max;
  }
  if (!std::isfinite(v)) return false;
  // Conversion truncates toward zero; the bounds are exact powers of two.
  const double lo = t == DType::Int8    ? -128.0
                    : t == DType::UInt8 ? 0.0
                    : t == DType::Int32 ? -2147483648.0
                                        : -9223372036854775808.0;
  const double hi = t == DType::Int8    ? 128.0
                    : t == DType::UInt8 ? 256.0
                    : t == DType::Int32 ? 2147483648.0
                                        : 9223372036854775808.0;
  return std::trunc(v) >= lo && v < hi;
}

DType scalar_result_type(DType t, double v) {
  if (is_floating(t)) return t;
  const DType as_int = t == DType::Bool ? DType::Int64 : compute_type(t);
  const bool whole = std::isfinite(v) && v == std::trunc(v);
  return whole && scalar_fits(v, as_int) ? as_int : DType::Float32;
}

void check_scalar_fits(double v, DType t, const char* op) {
  BRAID_CHECK(scalar_fits(v, t), op, ": value ", v, " cannot be converted to ", dtype_name(t), " without overflow");
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s, const char* op) {
  const std::string who = op != nullptr ? std::string(op) + ": shape " : "shape ";
  int64_t n = 1;
  for (int64_t d : s) {
    BRAID_CHECK(d >= 0, who, shape_str(s), " has a negative size");
    BRAID_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / d, who, shape_str(s),
                " has more elements than fit in int64");
    n *= d;
  }
  return n;
}

}  // namespace braid
