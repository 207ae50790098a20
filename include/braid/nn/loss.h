// Loss functions, as torch.nn.functional has them. Each is composed of differentiable ops, so its
// gradient comes from autograd; each is written in a numerically stable form (log-softmax, softplus)
// and checks its operands' shapes at the door, naming the loss and the shapes in the error.
#pragma once

#include <cstdint>
#include <string>

#include "braid/nn/module.h"
#include "braid/tensor.h"

namespace braid::nn {

// Every loss takes reduction "none" (the per-element losses), "mean" or "sum"; an empty "mean"
// is NaN, as in PyTorch.

/// Cross-entropy between logits and targets. input is (N, C), (N, C, d1, ...) or unbatched (C).
/// target is either class indices (integer, input's shape without the class axis; entries equal to
/// ignore_index contribute nothing) or class probabilities (floating, input's shape). weight, if
/// defined, is a 1-d rescaling of the C classes; "mean" over class indices divides by the sum of
/// the targets' weights (PyTorch's rule), over probabilities by the number of positions.
/// label_smoothing in [0, 1] mixes the target with the uniform distribution over classes.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                     int64_t ignore_index = -100, const std::string& reduction = "mean",
                     double label_smoothing = 0.0);

/// Negative log-likelihood of class-index targets under log-probabilities input (N, C, ...), with
/// cross_entropy's weight, ignore_index and reduction rules.
Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                int64_t ignore_index = -100, const std::string& reduction = "mean");

/// (input - target)^2; the shapes must be equal.
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

/// |input - target|; the shapes must be equal.
Tensor l1_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

/// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, with d = input - target (beta 0 is l1_loss).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean",
                      double beta = 1.0);

/// Binary cross-entropy of sigmoid(input) against target in [0, 1], computed from the logits as
/// (1 - t) x + (1 + (pos_weight - 1) t) softplus(-x), which neither overflows nor loses precision
/// for large |x|. weight broadcasts against the loss; pos_weight (weight of positive examples)
/// broadcasts along the last axis, one value per class.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                                        const std::string& reduction = "mean", const Tensor& pos_weight = Tensor());

// Note [Loss modules]
// The losses as modules, with torch.nn's names, constructor arguments and defaults: the settings
// are given once, forward(input, target) calls the function above. They are Modules so that a
// class weight moves with to(device) (a buffer, as in PyTorch) and a model prints them; forward(x)
// alone is a TypeError, since a loss needs its target.
class Loss : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  const std::string& reduction() const { return reduction_; }
  std::string describe() const override;

 protected:
  Loss(std::string type, std::string reduction);
  /// Registers weight as a buffer named name when it is defined; returns it.
  Tensor keep(const std::string& name, const Tensor& weight);

 private:
  std::string reduction_;
};

class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(const Tensor& weight = Tensor(), int64_t ignore_index = -100,
                            const std::string& reduction = "mean", double label_smoothing = 0.0);
  Tensor forward(const Tensor& input, const Tensor& target) override;

 private:
  Tensor weight_;
  int64_t ignore_index_;
  double label_smoothing_;
};

class NLLLoss : public Loss {
 public:
  explicit NLLLoss(const Tensor& weight = Tensor(), int64_t ignore_index = -100, const std::string& reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;

 private:
  Tensor weight_;
  int64_t ignore_index_;
};

class MSELoss : public Loss {
 public:
  explicit MSELoss(const std::string& reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

class L1Loss : public Loss {
 public:
  explicit L1Loss(const std::string& reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

class SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(const std::string& reduction = "mean", double beta = 1.0);
  Tensor forward(const Tensor& input, const Tensor& target) override;

 private:
  double beta_;
};

class BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(const Tensor& weight = Tensor(), const std::string& reduction = "mean",
                             const Tensor& pos_weight = Tensor());
  Tensor forward(const Tensor& input, const Tensor& target) override;

 private:
  Tensor weight_, pos_weight_;
};

}  // namespace braid::nn
