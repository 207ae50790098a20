// Activation layers: thin wrappers over the elementwise ops (and softmax), so that models can hold
// them as children of Sequential.
#include <sstream>

#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, slope_); }
std::string LeakyReLU::describe() const { return detail::cat("LeakyReLU(negative_slope=", slope_, ")"); }

GELU::GELU(std::string approximate) : Module("GELU"), approximate_(std::move(approximate)) {
  BRAID_CHECK(approximate_ == "none" || approximate_ == "tanh", "GELU: approximate must be 'none' or 'tanh', got '",
              approximate_, "'");
}
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_); }
std::string GELU::describe() const { return "GELU(approximate='" + approximate_ + "')"; }

Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor ReLU6::forward(const Tensor& x) { return clamp(x, 0.0, 6.0); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim_); }
std::string Softmax::describe() const { return detail::cat("Softmax(dim=", dim_, ")"); }

}  // namespace braid::nn
