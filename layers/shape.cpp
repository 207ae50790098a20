// Shape layers: Flatten (Identity is inline in the header).
#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::nn {

Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_, end_); }

std::string Flatten::describe() const { return detail::cat("Flatten(start_dim=", start_, ", end_dim=", end_, ")"); }

}  // namespace braid::nn
