// Loss functions composed of differentiable ops (autograd supplies the gradients). Shapes, class
// indices and options are checked at the door so that a bad batch fails with the loss's name and
// the shapes rather than deep inside gather or broadcast.
#include "braid/nn/loss.h"

#include <algorithm>
#include <vector>

#include "braid/amp.h"
#include "braid/ops.h"

namespace braid::nn {

namespace {

enum class Reduction { None, Mean, Sum };

Reduction parse_reduction(const std::string& reduction, const char* op) {
  if (reduction == "none") return Reduction::None;
  if (reduction == "mean") return Reduction::Mean;
  if (reduction == "sum") return Reduction::Sum;
  throw ValueError(detail::cat(op, ": unknown reduction '", reduction, "'; known: none, mean, sum"));
}

Tensor reduce(const Tensor& loss, Reduction r) {
  switch (r) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: return mean(loss);
  }
  return loss;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

void check_floating_input(const Tensor& input, const char* op) {
  BRAID_CHECK(input.defined(), op, ": input is undefined");
  BRAID_CHECK_T(TypeError, is_floating(input.dtype()), op, ": input must be floating-point, got ",
                dtype_name(input.dtype()));
}

void check_same_shape(const Tensor& input, const Tensor& target, const char* op) {
  BRAID_CHECK(target.defined(), op, ": target is undefined");
  BRAID_CHECK(target.shape() == input.shape(), op, ": target shape ", shape_str(target.shape()),
              " does not match input shape ", shape_str(input.shape()),
              "; losses do not broadcast, since a mismatch here is usually a bug (reshape the target)");
}

void check_class_weight(const Tensor& weight, int64_t classes, const char* op) {
  if (!weight.defined()) return;
  BRAID_CHECK(weight.dim() == 1 && weight.numel() == classes, op, ": weight must be 1-d with one entry per class (",
              classes, "), got shape ", shape_str(weight.shape()));
  BRAID_CHECK_T(TypeError, is_floating(weight.dtype()), op, ": weight must be floating-point, got ",
                dtype_name(weight.dtype()));
}

/// weight as a (1, C, 1, ...) tensor of input's dtype that broadcasts along the class axis 1.
Tensor class_weight_view(const Tensor& weight, const Tensor& input) {
  Shape s(input.dim(), 1);
  s[1] = input.size(1);
  return cast(weight, input.dtype()).reshape(s);
}

// Note [Class-index losses]
// Positions whose target equals ignore_index are given class 0 for the gather (any valid index
// works) and then masked out of the loss and out of the weight sum that "mean" divides by, so they
// contribute neither value nor gradient. The masking is a `where`, not a multiplication by zero,
// because a log-probability of -inf at class 0 would turn 0 * -inf into NaN.
struct IndexTerms {
  Tensor ignored;  // (N, d...) bool
  Tensor picked;   // (N, d...) input at the target class, 0 where ignored
  Tensor weights;  // (N, d...) the target's class weight, 0 where ignored
};

IndexTerms index_terms(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                       const char* op) {
  BRAID_CHECK_T(TypeError, target.dtype() == kInt64 || target.dtype() == kInt32, op,
                ": class-index target must be int64 (or int32), got ", dtype_name(target.dtype()));
  Shape expected = input.shape();
  expected.erase(expected.begin() + 1);
  BRAID_CHECK(target.shape() == expected, op, ": target shape ", shape_str(target.shape()),
              " does not match input shape ", shape_str(input.shape()), " without its class axis 1 (expected ",
              shape_str(expected), ")");
  const int64_t classes = input.size(1);
  Tensor t = cast(target, kInt64);
  Tensor ignored = eq(t, scalar_like(t, static_cast<double>(ignore_index)));
  Tensor safe = where(ignored, scalar_like(t, 0), t);
  if (safe.numel() > 0 && (amin(safe).item() < 0 || amax(safe).item() >= static_cast<double>(classes))) {
    std::vector<int64_t> v = safe.to_vector<int64_t>();
    auto bad = std::find_if(v.begin(), v.end(), [classes](int64_t c) { return c < 0 || c >= classes; });
    throw IndexError(detail::cat(op, ": target class index ", *bad, " (at flat position ", bad - v.begin(),
                                 ") is out of range for ", classes, " classes (input shape ",
                                 shape_str(input.shape()), "); ignore_index is ", ignore_index));
  }
  const DType dt = input.dtype();
  Tensor zero = scalar_like(input, 0);
  IndexTerms r;
  r.ignored = ignored;
  r.picked = where(ignored, zero, gather(input, 1, safe.unsqueeze(1)).squeeze(1));
  if (weight.defined()) {
    Tensor w = index_select(cast(weight, dt), 0, safe.reshape({-1})).reshape(t.shape());
    r.weights = where(ignored, zero, w);
  } else {
    r.weights = cast(logical_not(ignored), dt);
  }
  return r;
}

/// A class-index loss of per-position values loss (N, d...) under reduction; "mean" divides by the
/// weight sum of the positions that are not ignored.
Tensor reduce_by_weight(const Tensor& loss, const Tensor& weights, Reduction r) {
  return r == Reduction::Mean ? sum(loss) / sum(weights) : reduce(loss, r);
}

/// Runs f on a batch of one when input is unbatched (C), and drops the batch axis from "none".
template <typename F>
Tensor with_batch_axis(const Tensor& input, const Tensor& target, bool target_has_class_axis, Reduction r, F f) {
  if (input.dim() != 1) return f(input, target);
  BRAID_CHECK(target.defined(), "loss: target is undefined");
  Tensor out = f(input.unsqueeze(0), target.dim() == (target_has_class_axis ? 1 : 0) ? target.unsqueeze(0) : target);
  return r == Reduction::None ? out.squeeze(0) : out;
}

void check_class_input(const Tensor& input, const char* op) {
  check_floating_input(input, op);
  BRAID_CHECK(input.dim() >= 1, op, ": input must be (N, C, ...) or unbatched (C), got shape ",
              shape_str(input.shape()));
}

}  // namespace

Tensor cross_entropy(const Tensor& input_in, const Tensor& target_in, const Tensor& weight, int64_t ignore_index,
                     const std::string& reduction, double label_smoothing) {
  // On autocast's float32 list (Note [Autocast]).
  const Tensor input = autocast_float32(input_in), target = autocast_float32(target_in);
  const char* op = "cross_entropy";
  const Reduction r = parse_reduction(reduction, op);
  check_class_input(input, op);
  BRAID_CHECK(target.defined(), op, ": target is undefined");
  BRAID_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
              label_smoothing);
  const bool probabilities = is_floating(target.dtype());
  return with_batch_axis(input, target, probabilities, r, [&](const Tensor& x, const Tensor& t) {
    const int64_t classes = x.size(1);
    const double eps = label_smoothing;
    check_class_weight(weight, classes, op);
    Tensor logp = log_softmax(x, 1);
    Tensor w = weight.defined() ? class_weight_view(weight, x) : Tensor();
    if (probabilities) {
      BRAID_CHECK(t.shape() == x.shape(), op, ": a class-probability target must have the input's shape ",
                  shape_str(x.shape()), ", got ", shape_str(t.shape()),
                  " (class indices must be an integer tensor)");
      Tensor p = cast(t, x.dtype());
      if (eps > 0) p = p * (1.0 - eps) + eps / static_cast<double>(classes);
      Tensor term = logp * p;
      if (w.defined()) term = term * w;
      Tensor loss = -sum(term, {1});
      if (r != Reduction::Mean) return reduce(loss, r);
      return sum(loss) / static_cast<double>(loss.numel());  // 0 / 0 = NaN for an empty batch, as PyTorch
    }
    IndexTerms it = index_terms(logp, t, weight, ignore_index, op);
    Tensor loss = -(it.picked * it.weights);
    if (eps > 0) {
      // The uniform part of the smoothed target: every class at eps / C, weighted per class.
      Tensor smooth = -sum(w.defined() ? logp * w : logp, {1});
      smooth = where(it.ignored, scalar_like(x, 0), smooth);
      loss = loss * (1.0 - eps) + smooth * (eps / static_cast<double>(classes));
    }
    return reduce_by_weight(loss, it.weights, r);
  });
}

Tensor nll_loss(const Tensor& input_in, const Tensor& target_in, const Tensor& weight, int64_t ignore_index,
                const std::string& reduction) {
  // On autocast's float32 list (Note [Autocast]).
  const Tensor input = autocast_float32(input_in), target = autocast_float32(target_in);
  const char* op = "nll_loss";
  const Reduction r = parse_reduction(reduction, op);
  check_class_input(input, op);
  return with_batch_axis(input, target, false, r, [&](const Tensor& x, const Tensor& t) {
    check_class_weight(weight, x.size(1), op);
    IndexTerms it = index_terms(x, t, weight, ignore_index, op);
    return reduce_by_weight(-(it.picked * it.weights), it.weights, r);
  });
}

Tensor mse_loss(const Tensor& input_in, const Tensor& target_in, const std::string& reduction) {
  // On autocast's float32 list (Note [Autocast]).
  const Tensor input = autocast_float32(input_in), target = autocast_float32(target_in);
  const Reduction r = parse_reduction(reduction, "mse_loss");
  check_floating_input(input, "mse_loss");
  check_same_shape(input, target, "mse_loss");
  return reduce(square(input - target), r);
}

Tensor l1_loss(const Tensor& input_in, const Tensor& target_in, const std::string& reduction) {
  // On autocast's float32 list (Note [Autocast]).
  const Tensor input = autocast_float32(input_in), target = autocast_float32(target_in);
  const Reduction r = parse_reduction(reduction, "l1_loss");
  check_floating_input(input, "l1_loss");
  check_same_shape(input, target, "l1_loss");
  return reduce(abs(input - target), r);
}

Tensor smooth_l1_loss(const Tensor& input_in, const Tensor& target_in, const std::string& reduction, double beta) {
  // On autocast's float32 list (Note [Autocast]).
  const Tensor input = autocast_float32(input_in), target = autocast_float32(target_in);
  const Reduction r = parse_reduction(reduction, "smooth_l1_loss");
  check_floating_input(input, "smooth_l1_loss");
  check_same_shape(input, target, "smooth_l1_loss");
  BRAID_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative, got ", beta);
  // beta 0 would divide by zero in the quadratic branch, whose NaN gradient where() would not hide.
  if (beta == 0) return l1_loss(input, target, reduction);
  Tensor d = input - target;
  Tensor ad = abs(d);
  Tensor quadratic = square(d) * (0.5 / beta);
  return reduce(where(lt(ad, scalar_like(ad, beta)), quadratic, ad - 0.5 * beta), r);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input_in, const Tensor& target_in, const Tensor& weight,
                                        const std::string& reduction, const Tensor& pos_weight) {
  // On autocast's float32 list (Note [Autocast]).
  const Tensor input = autocast_float32(input_in), target = autocast_float32(target_in);
  const char* op = "binary_cross_entropy_with_logits";
  const Reduction r = parse_reduction(reduction, op);
  check_floating_input(input, op);
  check_same_shape(input, target, op);
  auto check_broadcast = [&](const Tensor& w, const char* name) {
    BRAID_CHECK(!w.defined() || broadcasts_to(w.shape(), input.shape()), op, ": ", name,
                " of shape ", shape_str(w.shape()), " does not broadcast to the input shape ",
                shape_str(input.shape()));
  };
  check_broadcast(weight, "weight");
  check_broadcast(pos_weight, "pos_weight");
  Tensor t = cast(target, input.dtype());
  // log(1 + exp(-x)) is softplus(-x); with pos_weight the positive term is scaled by pos_weight.
  Tensor positive = softplus(-input);
  if (pos_weight.defined()) positive = positive * ((cast(pos_weight, input.dtype()) - 1.0) * t + 1.0);
  Tensor loss = (1.0 - t) * input + positive;
  if (weight.defined()) loss = loss * cast(weight, input.dtype());
  return reduce(loss, r);
}

}  // namespace braid::nn
