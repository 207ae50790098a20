// Initialisers (torch.nn.init). Each draws a fresh tensor with the creation ops and copies it in
// under NoGradGuard, so that parameters that autograd tracks can be re-initialised.
#include "braid/nn/init.h"

#include <cmath>

#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid::nn::init {

namespace {

Tensor fill_from(Tensor t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
  return t;
}

void check_float(const Tensor& t, const char* fn) {
  BRAID_CHECK(t.defined(), fn, ": got an undefined tensor");
  BRAID_CHECK_T(TypeError, is_floating(t.dtype()) && is_compute_type(t.dtype()), fn,
                ": expected a float32 or float64 tensor, got ", dtype_name(t.dtype()));
}

int64_t fan(const Tensor& t, const std::string& mode, const char* fn) {
  BRAID_CHECK(mode == "fan_in" || mode == "fan_out", fn, ": mode must be 'fan_in' or 'fan_out', got '", mode, "'");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return mode == "fan_in" ? fan_in : fan_out;
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "conv_transpose2d" || nonlinearity == "sigmoid")
    return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  throw ValueError(detail::cat("calculate_gain: unknown nonlinearity '", nonlinearity,
                               "'; known: linear, conv1d, conv2d, conv_transpose2d, sigmoid, tanh, relu, "
                               "leaky_relu, selu"));
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  BRAID_CHECK(t.dim() >= 2, "calculate_fan_in_and_fan_out: needs a tensor of at least 2 dimensions, got shape ",
              shape_str(t.shape()));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.shape()[d];
  return {t.shape()[1] * receptive, t.shape()[0] * receptive};
}

Tensor uniform_(Tensor t, double a, double b, Generator* gen) {
  check_float(t, "uniform_");
  BRAID_CHECK(a <= b, "uniform_: expected a <= b, got a=", a, " b=", b);
  return fill_from(t, rand(t.shape(), t.dtype(), gen, a, b, t.device()));
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  check_float(t, "normal_");
  BRAID_CHECK(std >= 0, "normal_: expected std >= 0, got ", std);
  return fill_from(t, randn(t.shape(), t.dtype(), gen, mean, std, t.device()));
}

Tensor constant_(Tensor t, double value) {
  check_float(t, "constant_");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor zeros_(Tensor t) { return constant_(t, 0.0); }
Tensor ones_(Tensor t) { return constant_(t, 1.0); }

Tensor kaiming_uniform_(Tensor t, double a, const std::string& mode, const std::string& nonlinearity, Generator* gen) {
  check_float(t, "kaiming_uniform_");
  double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / static_cast<double>(fan(t, mode, "kaiming_uniform_")));
  return uniform_(t, -bound, bound, gen);
}

Tensor kaiming_normal_(Tensor t, double a, const std::string& mode, const std::string& nonlinearity, Generator* gen) {
  check_float(t, "kaiming_normal_");
  double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_normal_")));
  return normal_(t, 0.0, std, gen);
}

Tensor xavier_uniform_(Tensor t, double gain, Generator* gen) {
  check_float(t, "xavier_uniform_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -bound, bound, gen);
}

Tensor xavier_normal_(Tensor t, double gain, Generator* gen) {
  check_float(t, "xavier_normal_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

}  // namespace braid::nn::init
