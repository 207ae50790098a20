// Element types and devices. float32 is the working type, float64 serves gradient checks, the
// integer types hold indices and labels, bool holds masks; float16/bfloat16 are storage formats
// that convert to and from the others.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid {

enum class DType { Float32, Float64, Int64, Int32, Bool, Float16, BFloat16 };

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kInt64 = DType::Int64;
constexpr DType kInt32 = DType::Int32;
constexpr DType kBool = DType::Bool;
constexpr DType kFloat16 = DType::Float16;
constexpr DType kBFloat16 = DType::BFloat16;

/// Bytes per element.
int64_t dtype_size(DType t);
/// Lower-case name, as PyTorch prints it ("float32").
std::string dtype_name(DType t);
/// float16, bfloat16, float32 or float64.
bool is_floating(DType t);
/// Types the compute kernels run on (all but float16/bfloat16, which are storage only).
bool is_compute_type(DType t);
/// The type two operands of a binary op are computed in (NumPy/PyTorch promotion).
DType promote_types(DType a, DType b);

enum class DeviceType { CPU, CUDA };

/// Where a tensor's storage lives. Only the CPU is compiled in this build; the field exists so that
/// device backends plug in without changing call sites.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

inline Device cpu() { return Device{DeviceType::CPU, 0}; }

/// Sizes of a tensor, outermost first.
using Shape = std::vector<int64_t>;

/// "[2, 3]".
std::string shape_str(const Shape& s);
/// Number of elements; throws ValueError on a negative size or overflow.
int64_t shape_numel(const Shape& s);

}  // namespace braid
