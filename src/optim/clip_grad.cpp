// Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_.
#include <cmath>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "braid/optim/optimizer.h"

namespace braid::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  BRAID_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive or infinity, got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(g);
  if (grads.empty()) return 0.0;

  // Each gradient's part in its own dtype, combined in double: the largest magnitude for the
  // infinity norm, else the sum of |g|^p (the p-th root comes once, at the end).
  const bool inf_norm = std::isinf(norm_type);
  double total = 0;
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    if (inf_norm) {
      const double m = amax(abs(g)).item();  // NaN propagates: once total is NaN, m > total never holds
      if (std::isnan(m) || m > total) total = m;
    } else if (norm_type == 2) {
      total += sum(square(g)).item();
    } else if (norm_type == 1) {
      total += sum(abs(g)).item();
    } else {
      total += sum(pow(abs(g), norm_type)).item();
    }
  }
  if (!inf_norm && norm_type != 1) total = std::pow(total, 1.0 / norm_type);
  BRAID_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm of order ", norm_type,
              " of the gradients of ", grads.size(), " parameters is non-finite (", total,
              "), so it cannot be clipped; pass error_if_nonfinite = false to clip anyway");
  const double coef = max_norm / (total + 1e-6);
  // As PyTorch, a NaN coefficient is applied too (it makes the gradients NaN); only coef >= 1 is a no-op.
  if (!(coef >= 1.0))
    for (Tensor& g : grads) g.mul_(coef);
  return total;
}

}  // namespace braid::optim
