// Dropout: a seeded Bernoulli mask scaled by 1 / (1 - p) in training, the identity in eval. The
// mask comes from a Generator, so a fixed seed reproduces a run at any thread count.
#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::nn {

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  BRAID_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  BRAID_CHECK_T(TypeError, is_floating(x.dtype()), "dropout: expected a floating-point input, got ",
                dtype_name(x.dtype()));
  if (p == 1.0) return x * 0.0;  // keeps the graph, so the gradient is zero rather than missing
  if (is_half(x.dtype())) {  // x times the float32 scaled mask, rounded once (PyTorch's float32 opmath)
    const Tensor keep = bernoulli(x.shape(), 1.0 - p, kFloat32, gen, x.device()) * (1.0 / (1.0 - p));
    return (x * keep).to(x.dtype());
  }
  return x * (bernoulli(x.shape(), 1.0 - p, x.dtype(), gen, x.device()) * (1.0 / (1.0 - p)));
}

Dropout::Dropout(double p, Generator* gen) : Module("Dropout"), p_(p), gen_(gen) {
  BRAID_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), gen_); }

std::string Dropout::describe() const { return detail::cat("Dropout(p=", p_, ")"); }

}  // namespace braid::nn
