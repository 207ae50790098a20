// SyncBatchNorm and the differentiable all-reduce it is built from. The layer is composed of
// forward ops and all_reduce_sum, so autograd derives its backward (two all-reduces of gradient
// sums) and no backward is written by hand.
#include <sstream>

#include "autograd/function.h"
#include "braid/autograd.h"
#include "braid/distributed/data_parallel.h"
#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::distributed {

Tensor all_reduce_sum(const Tensor& x, const ProcessGroupPtr& group) {
  BRAID_CHECK(group != nullptr, "all_reduce_sum: the group is null");
  Tensor out = x.detach().contiguous().clone();
  group->all_reduce(out, ReduceOp::Sum);
  return ::braid::detail::record("all_reduce_sum", out, {x}, [group](const Tensor& g, ::braid::detail::Grads& grads) {
    Tensor total = g.contiguous().clone();
    group->all_reduce(total, ReduceOp::Sum);
    grads.set(0, total);
  });
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, double eps, double momentum, bool affine, ProcessGroupPtr group)
    : Module("SyncBatchNorm"), num_features_(num_features), eps_(eps), momentum_(momentum), affine_(affine),
      group_(group ? std::move(group) : world()) {
  BRAID_CHECK(num_features > 0, "SyncBatchNorm: num_features must be positive, got ", num_features);
  BRAID_CHECK(eps > 0, "SyncBatchNorm: eps must be positive, got ", eps);
  if (affine_) {
    weight_ = register_parameter("weight", ones({num_features}, kFloat32, default_device()));
    bias_ = register_parameter("bias", zeros({num_features}, kFloat32, default_device()));
  }
  running_mean_ = register_buffer("running_mean", zeros({num_features}, kFloat32, default_device()));
  running_var_ = register_buffer("running_var", ones({num_features}, kFloat32, default_device()));
  num_batches_tracked_ = register_buffer("num_batches_tracked", zeros({}, kInt64, default_device()));
}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  BRAID_CHECK(x.dim() >= 2 && x.size(1) == num_features_, "SyncBatchNorm: expected input (N, ", num_features_,
              ", ...), got shape ", shape_str(x.shape()));
  std::vector<int64_t> axes{0};
  for (int64_t d = 2; d < x.dim(); ++d) axes.push_back(d);
  Shape cs(static_cast<size_t>(x.dim()), 1);
  cs[1] = num_features_;
  Tensor mean_c, var_c;
  if (is_training()) {
    // The global count, then the global mean, then the global (biased) variance around it: the
    // same two-pass formula as BatchNorm on the concatenated batch.
    Tensor count = full({1}, static_cast<double>(x.numel() / num_features_), kFloat64);
    group_->all_reduce(count, ReduceOp::Sum);
    const double n = count.item();
    BRAID_CHECK(n > 1, "SyncBatchNorm: expected more than 1 value per channel over all ranks when training, got ",
                n, " (input shape ", shape_str(x.shape()), " on this rank)");
    mean_c = (all_reduce_sum(sum(x, axes), group_) * (1.0 / n)).reshape(cs);
    Tensor d = x - mean_c;
    var_c = (all_reduce_sum(sum(d * d, axes), group_) * (1.0 / n)).reshape(cs);
    NoGradGuard no_grad;
    num_batches_tracked_.add_(scalar_like(num_batches_tracked_, 1));
    running_mean_.mul_(1.0 - momentum_).add_(mean_c.reshape({num_features_}), momentum_);
    running_var_.mul_(1.0 - momentum_).add_(var_c.reshape({num_features_}) * (n / (n - 1)), momentum_);
  } else {
    mean_c = running_mean_.reshape(cs);
    var_c = running_var_.reshape(cs);
  }
  return nn::batch_norm_apply(x, mean_c, var_c, weight_, bias_, eps_);
}

std::string SyncBatchNorm::describe() const {
  std::ostringstream os;
  os << "SyncBatchNorm(" << num_features_ << ", eps=" << eps_ << ", momentum=" << momentum_
     << ", affine=" << (affine_ ? "True" : "False") << ", group=" << group_->name() << ")";
  return os.str();
}

int convert_sync_batchnorm(nn::Module& module, ProcessGroupPtr group) {
  int replaced = 0;
  std::vector<std::pair<std::string, std::shared_ptr<nn::BatchNorm>>> found;
  for (auto& [path, m] : module.named_modules("", /*include_self=*/false)) {
    if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(m)) found.emplace_back(path, bn);
  }
  for (auto& [path, bn] : found) {
    BRAID_CHECK(bn->track_running_stats() && bn->momentum().has_value(), "convert_sync_batchnorm: '", path,
                "' (", bn->describe(), ") uses a cumulative average or no running statistics, which SyncBatchNorm "
                "does not support");
    auto sync = std::make_shared<SyncBatchNorm>(bn->num_features(), bn->eps(), *bn->momentum(), bn->affine(), group);
    const auto state = bn->state_dict();
    sync->to(state.at("running_mean").dtype());  // a float64 model stays float64
    sync->load_state_dict(state);
    if (!bn->is_training()) sync->eval();
    module.replace_child(path, sync);
    ++replaced;
  }
  return replaced;
}

}  // namespace braid::distributed
