// Linear: y = x W^T + b over the last axis, initialised as PyTorch's (kaiming_uniform_ with
// a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)), for weight and bias alike).
#include <cmath>

#include "braid/amp.h"
#include "braid/nn/init.h"
#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::nn {

// nn::linear, the op, is in src/ops/linalg.cpp (Note [Linear as one node]).

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Module("Linear"), in_(in_features), out_(out_features) {
  BRAID_CHECK(in_features >= 0 && out_features >= 0, "Linear: feature counts must be non-negative, got in_features=",
              in_features, " out_features=", out_features);
  weight_ = register_parameter("weight", init::kaiming_uniform_(empty({out_, in_}, kFloat32, default_device()), std::sqrt(5.0)));
  if (bias) {
    double bound = in_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_)) : 0.0;
    bias_ = register_parameter("bias", init::uniform_(empty({out_}, kFloat32, default_device()), -bound, bound));
  }
}

Tensor Linear::forward(const Tensor& x) {
  BRAID_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear: expected input with last dimension ", in_,
              " (in_features), got shape ", shape_str(x.shape()));
  return linear(x, weight_, bias_);
}

std::string Linear::describe() const {
  return detail::cat("Linear(in_features=", in_, ", out_features=", out_, ", bias=", bias_.defined() ? "True" : "False",
                     ")");
}

}  // namespace braid::nn
