// The loss modules (Note [Loss modules] in braid/nn/loss.h): settings kept at construction, forward
// calls the loss function. Reductions are checked at construction, so a typo fails where it is made.
#include "braid/nn/loss.h"

#include "braid/ops.h"

namespace braid::nn {

Loss::Loss(std::string type, std::string reduction) : Module(std::move(type)), reduction_(std::move(reduction)) {
  if (reduction_ != "none" && reduction_ != "mean" && reduction_ != "sum")
    throw ValueError(detail::cat(type_name(), ": unknown reduction '", reduction_, "'; known: none, mean, sum"));
}

Tensor Loss::forward(const Tensor& x) {
  throw TypeError(detail::cat(type_name(), ".forward: a loss takes (input, target), got only an input of shape ",
                              x.defined() ? shape_str(x.shape()) : std::string("(undefined)")));
}

std::string Loss::describe() const { return detail::cat(type_name(), "(reduction='", reduction_, "')"); }

Tensor Loss::keep(const std::string& name, const Tensor& weight) {
  return weight.defined() ? register_buffer(name, weight) : weight;
}

CrossEntropyLoss::CrossEntropyLoss(const Tensor& weight, int64_t ignore_index, const std::string& reduction,
                                   double label_smoothing)
    : Loss("CrossEntropyLoss", reduction), weight_(keep("weight", weight)), ignore_index_(ignore_index),
      label_smoothing_(label_smoothing) {}

Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  return cross_entropy(input, target, weight_, ignore_index_, reduction(), label_smoothing_);
}

NLLLoss::NLLLoss(const Tensor& weight, int64_t ignore_index, const std::string& reduction)
    : Loss("NLLLoss", reduction), weight_(keep("weight", weight)), ignore_index_(ignore_index) {}

Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) {
  return nll_loss(input, target, weight_, ignore_index_, reduction());
}

MSELoss::MSELoss(const std::string& reduction) : Loss("MSELoss", reduction) {}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) { return mse_loss(input, target, reduction()); }

L1Loss::L1Loss(const std::string& reduction) : Loss("L1Loss", reduction) {}

Tensor L1Loss::forward(const Tensor& input, const Tensor& target) { return l1_loss(input, target, reduction()); }

SmoothL1Loss::SmoothL1Loss(const std::string& reduction, double beta) : Loss("SmoothL1Loss", reduction), beta_(beta) {}

Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return smooth_l1_loss(input, target, reduction(), beta_);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(const Tensor& weight, const std::string& reduction, const Tensor& pos_weight)
    : Loss("BCEWithLogitsLoss", reduction), weight_(keep("weight", weight)), pos_weight_(keep("pos_weight", pos_weight)) {}

Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy_with_logits(input, target, weight_, reduction(), pos_weight_);
}

}  // namespace braid::nn
