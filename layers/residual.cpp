// Residual: body(x) + shortcut(x), the skip connection of ResNet-style blocks. Without a shortcut
// the input is added as it is; a shortcut (1x1 conv + norm) adapts shapes when the body changes them.
#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::nn {

Residual::Residual(ModulePtr body, ModulePtr shortcut) : Module("Residual"), has_shortcut_(shortcut != nullptr) {
  BRAID_CHECK(body != nullptr, "Residual: body is null");
  register_module("body", std::move(body));
  if (shortcut) register_module("shortcut", std::move(shortcut));
}

// The children are looked up on each call rather than held, so that replace_child takes effect.
Tensor Residual::forward(const Tensor& x) {
  Tensor y = child("body")->forward(x), s = has_shortcut_ ? child("shortcut")->forward(x) : x;
  BRAID_CHECK(y.shape() == s.shape(), "Residual: body output shape ", shape_str(y.shape()),
              " differs from shortcut output shape ", shape_str(s.shape()),
              has_shortcut_ ? "" : "; give a shortcut that maps the input to the body's output shape");
  return y + s;
}

}  // namespace braid::nn
