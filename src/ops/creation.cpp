// Creation ops: constant fills, ranges, copies of user data and random draws from the Philox stream.
#include <cmath>
#include <cstring>

#include "ops/common.h"

namespace braid {

using namespace detail;

Tensor empty(const Shape& shape, DType dtype, Device device) {
  shape_numel(shape, "empty");
  return new_tensor(shape, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  shape_numel(shape, "full");
  check_scalar_fits(value, dtype, "full");
  Tensor t = new_tensor(shape, dtype, device);
  backend_of(t).fill(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype) { return zeros(t.shape(), dtype.value_or(t.dtype()), t.device()); }
Tensor ones_like(const Tensor& t, std::optional<DType> dtype) { return ones(t.shape(), dtype.value_or(t.dtype()), t.device()); }
Tensor full_like(const Tensor& t, double value, std::optional<DType> dtype) {
  return full(t.shape(), value, dtype.value_or(t.dtype()), t.device());
}
Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }
Tensor scalar_like(const Tensor& t, double value) { return full({}, value, t.dtype(), t.device()); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  BRAID_CHECK(step != 0 && std::isfinite(step), "arange: step must be finite and non-zero, got ", step);
  BRAID_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start and end must be finite, got ", start, " and ", end);
  BRAID_CHECK((end - start) / step >= 0, "arange: step ", step, " does not go from ", start, " towards ", end);
  double count = std::ceil((end - start) / step);
  BRAID_CHECK(count < 9e15, "arange: ", count, " elements is too many");
  if (count > 0) {  // the first and last values must fit an integer dtype
    check_scalar_fits(start, dtype, "arange");
    check_scalar_fits(start + (count - 1) * step, dtype, "arange");
  }
  Tensor t = new_tensor({static_cast<int64_t>(count)}, dtype, device);
  backend_of(t).iota(t, start, step);
  return t;
}

Tensor arange(int64_t end, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype, device);
}

Tensor linspace(double start, double end, int64_t steps, DType dtype, Device device) {
  BRAID_CHECK(steps >= 0, "linspace: steps must be non-negative, got ", steps);
  if (steps > 0) {
    check_scalar_fits(start, dtype, "linspace");
    check_scalar_fits(end, dtype, "linspace");
  }
  Tensor t = new_tensor({steps}, dtype, device);
  backend_of(t).iota(t, start, steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0);
  return t;
}

Tensor eye(int64_t n, DType dtype, Device device) {
  BRAID_CHECK(n >= 0, "eye: n must be non-negative, got ", n);
  Tensor i = arange(n, kInt64, device);
  return cast(eq(i.unsqueeze(1), i.unsqueeze(0)), dtype);
}

Tensor from_buffer(const void* data, const Shape& shape, DType dtype, Device device) {
  shape_numel(shape, "from_buffer");
  backend_for(device);  // NotImplementedError naming the device when it is absent
  Tensor t = new_tensor(shape, dtype, Device::cpu());
  int64_t bytes = t.numel() * dtype_size(dtype);
  BRAID_CHECK(data != nullptr || bytes == 0, "from_buffer: null data for shape ", shape_str(shape));
  if (bytes) std::memcpy(t.raw_data(), data, static_cast<size_t>(bytes));
  return transfer_raw(t, device);
}

Tensor empty_pinned(const Shape& shape, DType dtype, Device device) {
  const int64_t bytes = shape_numel(shape, "empty_pinned") * dtype_size(dtype);
  if (bytes == 0) return empty(shape, dtype, Device::cpu());
  Backend& b = backend_for(device);
  void* p = b.allocate_pinned(device, bytes);
  if (!p) return empty(shape, dtype, Device::cpu());
  auto storage =
      Storage::wrap(p, bytes, Device::cpu(), [&b, device, p, bytes] { b.deallocate_pinned(device, p, bytes); });
  return make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor from_blob(void* data, const Shape& shape, DType dtype) {
  int64_t bytes = shape_numel(shape, "from_blob") * dtype_size(dtype);
  return make_tensor(Storage::wrap(data, bytes), shape, contiguous_strides(shape), 0, dtype);
}

namespace {
template <typename T>
Tensor from_values(const std::vector<T>& v, const Shape& shape, Device device) {
  BRAID_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "tensor: ", v.size(),
              " values do not fill shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  return from_buffer(v.data(), shape, dtype_of<T>(), device);
}
}  // namespace

Tensor tensor(const std::vector<float>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor tensor(const std::vector<double>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor tensor(const std::vector<int64_t>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor tensor(const std::vector<int32_t>& v, const Shape& s, Device d) { return from_values(v, s, d); }
Tensor tensor_bool(const std::vector<bool>& v, const Shape& s, Device d) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  BRAID_CHECK(static_cast<int64_t>(v.size()) == shape_numel(s), "tensor_bool: ", v.size(),
              " values do not fill shape ", shape_str(s));
  return from_buffer(bytes.data(), s, kBool, d);
}

namespace {
Tensor draw(RandomKind kind, const Shape& shape, DType dtype, Generator* gen, double a, double b, Device device,
           const char* op) {
  BRAID_CHECK_T(TypeError, kind == RandomKind::Bernoulli || is_floating(dtype) || dtype == kInt64 || dtype == kInt32,
                op, ": unsupported dtype ", dtype_name(dtype));
  Generator& g = gen ? *gen : default_generator();
  DType compute = is_compute_type(dtype) ? dtype : kFloat32;
  shape_numel(shape, op);
  Tensor t = new_tensor(shape, compute, device);
  uint64_t counter = g.advance(static_cast<uint64_t>(t.numel()));
  backend_of(t).random(kind, t, g.seed(), counter, a, b);
  return compute == dtype ? t : cast_raw(t, dtype);
}
}  // namespace

Tensor rand(const Shape& shape, DType dtype, Generator* gen, double low, double high, Device device) {
  BRAID_CHECK(low <= high, "rand: low ", low, " is greater than high ", high);
  BRAID_CHECK_T(TypeError, is_floating(dtype), "rand: dtype must be floating, got ", dtype_name(dtype));
  return draw(RandomKind::Uniform, shape, dtype, gen, low, high, device, "rand");
}

Tensor randn(const Shape& shape, DType dtype, Generator* gen, double mean, double std, Device device) {
  BRAID_CHECK(std >= 0, "randn: std must be non-negative, got ", std);
  BRAID_CHECK_T(TypeError, is_floating(dtype), "randn: dtype must be floating, got ", dtype_name(dtype));
  return draw(RandomKind::Normal, shape, dtype, gen, mean, std, device, "randn");
}

Tensor rand_like(const Tensor& t, Generator* generator) { return rand(t.shape(), t.dtype(), generator, 0.0, 1.0, t.device()); }
Tensor randn_like(const Tensor& t, Generator* generator) {
  return randn(t.shape(), t.dtype(), generator, 0.0, 1.0, t.device());
}

Tensor bernoulli(const Shape& shape, double p, DType dtype, Generator* gen, Device device) {
  BRAID_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  return draw(RandomKind::Bernoulli, shape, dtype, gen, p, 0, device, "bernoulli");
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype, Generator* gen, Device device) {
  BRAID_CHECK(low < high, "randint: low ", low, " must be less than high ", high);
  BRAID_CHECK_T(TypeError, dtype == kInt64 || dtype == kInt32, "randint: dtype must be int64 or int32, got ",
                dtype_name(dtype));
  return draw(RandomKind::Uniform, shape, dtype, gen, static_cast<double>(low), static_cast<double>(high), device,
              "randint");
}

Tensor randperm(int64_t n, Generator* gen, Device device) {
  BRAID_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  // Sorting random keys would need a sort primitive; a Fisher-Yates pass over one draw of uniforms
  // is exact and depends only on the generator state.
  std::vector<double> u = rand({n}, kFloat64, gen).to_vector<double>();
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = std::min<int64_t>(static_cast<int64_t>(u[i] * static_cast<double>(i + 1)), i);
    std::swap(p[i], p[j]);
  }
  return tensor(p, {n}, device);
}

}  // namespace braid
