// Normalisation layers: BatchNorm1d/2d (batch statistics in training, running statistics in eval),
// LayerNorm and GroupNorm, composed of mean/var and elementwise ops so that autograd derives their
// backward. Weights start at one and biases at zero, as PyTorch's.
#include <algorithm>
#include <sstream>

#include "braid/amp.h"
#include "braid/autograd.h"
#include "braid/nn/layers.h"
#include "braid/ops.h"
#include "util.h"

namespace braid::nn {

using detail::py_bool;

namespace {
/// (1, C, 1, ...) for broadcasting a per-channel vector against a rank-r input.
Shape channel_shape(int64_t c, int64_t rank) {
  Shape s(static_cast<size_t>(rank), 1);
  s[1] = c;
  return s;
}
}  // namespace

BatchNorm::BatchNorm(std::string type, std::vector<int64_t> ranks, int64_t num_features, double eps,
                     std::optional<double> momentum, bool affine, bool track_running_stats)
    : Module(std::move(type)), ranks_(std::move(ranks)), num_features_(num_features), eps_(eps), momentum_(momentum),
      affine_(affine), track_(track_running_stats) {
  BRAID_CHECK(num_features > 0, type_name(), ": num_features must be positive, got ", num_features);
  BRAID_CHECK(eps > 0, type_name(), ": eps must be positive, got ", eps);
  if (affine_) {
    weight_ = register_parameter("weight", ones({num_features}, kFloat32, default_device()));
    bias_ = register_parameter("bias", zeros({num_features}, kFloat32, default_device()));
  }
  if (track_) {
    running_mean_ = register_buffer("running_mean", zeros({num_features}, kFloat32, default_device()));
    running_var_ = register_buffer("running_var", ones({num_features}, kFloat32, default_device()));
    num_batches_tracked_ = register_buffer("num_batches_tracked", zeros({}, kInt64, default_device()));
  }
}

// Note [BatchNorm as scale and shift]
// y = (x - mean) * invstd * weight + bias is computed as y = x * scale + shift with the per-channel
// scale = invstd * weight and shift = bias - mean * scale, as PyTorch's CPU kernel does: two passes
// over the input instead of four. Autograd differentiates through mean and invstd either way.
Tensor BatchNorm::forward(const Tensor& x) {
  BRAID_CHECK(std::find(ranks_.begin(), ranks_.end(), x.dim()) != ranks_.end(), type_name(), ": expected a ",
              ranks_.size() == 1 ? "" : "2-d or ", ranks_.back(), "-d input, got shape ", shape_str(x.shape()));
  BRAID_CHECK(x.size(1) == num_features_, type_name(), ": expected input with ", num_features_,
              " channels (num_features) at axis 1, got shape ", shape_str(x.shape()));
  const Shape cs = channel_shape(num_features_, x.dim());
  if (is_training() || !track_) {
    const int64_t n = x.numel() / num_features_;
    BRAID_CHECK(n > 1, type_name(), ": expected more than 1 value per channel when training, got input shape ",
                shape_str(x.shape()));
    // One node for the whole normalisation (Note [BatchNorm as one node] in src/ops/norm.cpp).
    std::vector<Tensor> out = batch_norm_training(x, weight_, bias_, eps_);
    if (is_training() && track_) {
      NoGradGuard no_grad;
      num_batches_tracked_.add_(scalar_like(num_batches_tracked_, 1));
      const double f = momentum_ ? *momentum_ : 1.0 / num_batches_tracked_.item();
      Tensor unbiased = out[2] * (static_cast<double>(n) / static_cast<double>(n - 1));
      running_mean_.mul_(1.0 - f).add_(out[1], f);
      running_var_.mul_(1.0 - f).add_(unbiased, f);
    }
    return out[0];
  }
  return batch_norm_apply(x, running_mean_.reshape(cs), running_var_.reshape(cs), weight_, bias_, eps_);
}

Tensor batch_norm_apply(const Tensor& x, const Tensor& mean_c, const Tensor& var_c, const Tensor& weight,
                        const Tensor& bias, double eps) {
  const Shape& cs = mean_c.shape();
  Tensor scale = rsqrt(var_c + eps);
  if (weight.defined()) scale = scale * weight.reshape(cs);
  Tensor shift = bias.defined() ? bias.reshape(cs) - mean_c * scale : -(mean_c * scale);
  if (x.dim() >= 2 && x.size(1) == scale.numel()) {  // one pass in inference (braid::channel_affine)
    return channel_affine(x, scale.reshape({scale.numel()}), shift.reshape({scale.numel()}));
  }
  return x * scale + shift;
}

std::string BatchNorm::describe() const {
  std::ostringstream os;
  os << type_name() << "(" << num_features_ << ", eps=" << eps_ << ", momentum=";
  if (momentum_) os << *momentum_;
  else os << "None";
  os << ", affine=" << py_bool(affine_) << ", track_running_stats=" << py_bool(track_) << ")";
  return os.str();
}

BatchNorm1d::BatchNorm1d(int64_t num_features, const BatchNormOptions& o)
    : BatchNorm1d(num_features, o.eps, o.momentum, o.affine, o.track_running_stats) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, const BatchNormOptions& o)
    : BatchNorm2d(num_features, o.eps, o.momentum, o.affine, o.track_running_stats) {}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm("BatchNorm1d", {2, 3}, num_features, eps, momentum, affine, track_running_stats) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm("BatchNorm2d", {4}, num_features, eps, momentum, affine, track_running_stats) {}

LayerNorm::LayerNorm(Ints normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"), shape_(normalized_shape.values()), eps_(eps), affine_(elementwise_affine) {
  BRAID_CHECK(!shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t d : shape_) BRAID_CHECK(d > 0, "LayerNorm: normalized_shape ", shape_str(shape_), " must be positive");
  BRAID_CHECK(eps > 0, "LayerNorm: eps must be positive, got ", eps);
  if (affine_) {
    weight_ = register_parameter("weight", ones(shape_, kFloat32, default_device()));
    bias_ = register_parameter("bias", zeros(shape_, kFloat32, default_device()));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const int64_t k = static_cast<int64_t>(shape_.size());
  BRAID_CHECK(x.dim() >= k && Shape(x.shape().end() - k, x.shape().end()) == shape_, "LayerNorm: expected input "
              "whose trailing dimensions are ", shape_str(shape_), " (normalized_shape), got shape ",
              shape_str(x.shape()));
  return affine_ ? layer_norm(x, k, weight_, bias_, eps_) : layer_norm(x, k, Tensor(), Tensor(), eps_);
}

std::string LayerNorm::describe() const {
  std::ostringstream os;
  os << "LayerNorm(" << detail::tuple(shape_) << ", eps=" << eps_ << ", elementwise_affine=" << py_bool(affine_) << ")";
  return os.str();
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, double eps, bool affine)
    : Module("GroupNorm"), groups_(num_groups), channels_(num_channels), eps_(eps), affine_(affine) {
  BRAID_CHECK(num_groups > 0 && num_channels > 0 && num_channels % num_groups == 0, "GroupNorm: num_channels (",
              num_channels, ") must be a positive multiple of num_groups (", num_groups, ")");
  BRAID_CHECK(eps > 0, "GroupNorm: eps must be positive, got ", eps);
  if (affine_) {
    weight_ = register_parameter("weight", ones({num_channels}, kFloat32, default_device()));
    bias_ = register_parameter("bias", zeros({num_channels}, kFloat32, default_device()));
  }
}

Tensor GroupNorm::forward(const Tensor& x_in) {
  BRAID_CHECK(x_in.dim() >= 2 && x_in.size(1) == channels_, "GroupNorm: expected input (N, ", channels_,
              ", *) with num_channels at axis 1, got shape ", shape_str(x_in.shape()));
  if (is_half(x_in.dtype())) {  // on autocast's float32 list; outside a scope float32 inside, rounded once
    const Tensor y = forward(x_in.to(kFloat32));
    return autocast_enabled() ? y : y.to(x_in.dtype());
  }
  const Tensor& x = x_in;
  Tensor g = x.reshape({x.size(0), groups_, -1});
  Tensor y = ((g - mean(g, {2}, true)) * rsqrt(var(g, {2}, 0, true) + eps_)).reshape(x.shape());
  if (!affine_) return y;
  const Shape cs = channel_shape(channels_, x.dim());
  return y * weight_.reshape(cs) + bias_.reshape(cs);
}

std::string GroupNorm::describe() const {
  std::ostringstream os;
  os << "GroupNorm(" << groups_ << ", " << channels_ << ", eps=" << eps_ << ", affine=" << py_bool(affine_) << ")";
  return os.str();
}

}  // namespace braid::nn
