// Gradient checking against central finite differences in float64, as Flashlight and ggml do:
// the analytic gradient of L = sum(f(x) * w), for fixed random weights w, must match
// (L(x + eps) - L(x - eps)) / (2 eps) for every element of every input.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace braid::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Writes v into element j (row-major) of the contiguous tensor x through the tensor API, so that
/// finite differences work on every device (host pointers do not reach device memory).
inline void set_element(const Tensor& x, int64_t j, double v) {
  NoGradGuard no_grad;
  x.detach().view({-1}).narrow(0, j, 1).fill_(v);
}

/// Largest |analytic - numeric| / max(1, |analytic|, |numeric|) over all input elements.
inline double gradcheck_error(const Fn& f, std::vector<Tensor> inputs, double eps = 1e-6, std::string* where = nullptr) {
  for (Tensor& x : inputs) x = x.to(kFloat64).contiguous().clone().detach().set_requires_grad(true);
  Tensor out = f(inputs);
  Generator gen(1234);
  Tensor w = randn(out.shape(), kFloat64, &gen);
  sum(out * w).backward();
  auto loss = [&]() {
    NoGradGuard no_grad;
    return sum(f(inputs) * w).item();
  };
  double worst = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor grad = inputs[i].grad();
    if (!grad.defined()) grad = zeros_like(inputs[i]);
    std::vector<double> analytic = grad.to_vector<double>();
    const std::vector<double> values = inputs[i].to_vector<double>();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      const double saved = values[static_cast<size_t>(j)];
      set_element(inputs[i], j, saved + eps);
      double up = loss();
      set_element(inputs[i], j, saved - eps);
      double down = loss();
      set_element(inputs[i], j, saved);
      double numeric = (up - down) / (2 * eps);
      double err = std::fabs(analytic[j] - numeric) / std::max({1.0, std::fabs(analytic[j]), std::fabs(numeric)});
      if (err > worst) {
        worst = err;
        if (where)
          *where = "input " + std::to_string(i) + " element " + std::to_string(j) + ": analytic " +
                   std::to_string(analytic[j]) + " numeric " + std::to_string(numeric);
      }
    }
  }
  return worst;
}

}  // namespace braid::testing
