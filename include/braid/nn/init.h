// Weight initialisers, as torch.nn.init: each fills a tensor in place (outside the autograd graph)
// from a Generator (default_generator() when none is given) and returns it. Layers use them for
// their PyTorch-equal default initialisation, so a model ported from PyTorch starts alike.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "braid/random.h"
#include "braid/tensor.h"

namespace braid::nn::init {

/// The recommended gain for a nonlinearity ("linear", "conv1d", "conv2d", "conv_transpose2d",
/// "sigmoid", "tanh", "relu", "leaky_relu", "selu"); param is leaky_relu's negative slope.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);
/// (fan_in, fan_out) of a weight of at least 2 dimensions: size(1) and size(0) times the receptive field.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

/// U(a, b).
Tensor uniform_(Tensor t, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
/// N(mean, std^2).
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
/// U(-bound, bound) with bound = gain * sqrt(3 / fan); mode "fan_in" or "fan_out", a the negative
/// slope for leaky_relu.
Tensor kaiming_uniform_(Tensor t, double a = 0.0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
/// N(0, std^2) with std = gain / sqrt(fan).
Tensor kaiming_normal_(Tensor t, double a = 0.0, const std::string& mode = "fan_in",
                       const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
/// U(-bound, bound) with bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor t, double gain = 1.0, Generator* gen = nullptr);
/// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace braid::nn::init
