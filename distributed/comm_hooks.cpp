// DistributedDataParallel's communication hooks: the all-reduce, and top-K sparsification with
// error feedback and Deep Gradient Compression's corrections. PowerSGD is in powersgd.cpp.
//
// Note [Top-K with error feedback]
// Each rank keeps, per bucket, a residual r of what it has not sent yet. A step adds the bucket's
// gradient g to it (DGC's momentum correction adds the velocity u = m u + g instead, and local
// clipping scales g first), then sends the k entries of largest magnitude, as k values and k int32
// indices gathered from every rank (all_gather_inplace), and zeroes them in r (and in u: momentum
// factor masking). Nothing is lost and nothing is rounded in between: after a step,
// sent + r is exactly the previous r + g (the entries are moved, not computed). Every rank then adds
// all ranks' values at their indices, in rank order, into a zero bucket and multiplies by 1 / N, as
// the all-reduce's average does, so every rank applies the same gradient. The selection is exact
// (ties go to the lower index) and runs on the host: a device bucket's magnitudes are copied down
// to choose the indices; values and the sum stay on the device. When 2k >= n the values and
// indices would cost more than the dense bucket, and the step all-reduces the whole residual; with
// k = n that is DistributedDataParallel's all-reduce of the gradient, bit for bit.
#include "braid/distributed/comm_hooks.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid::distributed {

void CommHook::store(Checkpoint&, const std::string&) const {}
void CommHook::restore(const Checkpoint&, const std::string&) {}

namespace {

class AllReduceHook : public CommHook {
 public:
  explicit AllReduceHook(const AllReduceOptions& o) : options_(o) {}
  std::string name() const override {
    return options_.wire_dtype == WireDType::Native    ? "allreduce"
           : options_.wire_dtype == WireDType::Float16 ? "allreduce (float16 on the wire)"
                                                       : "allreduce (bfloat16 on the wire)";
  }
  void launch(const ProcessGroupPtr& group, GradBucket& b) override {
    work_[b.index] = group->all_reduce_async(b.buffer, ReduceOp::Average, options_);
  }
  void finish(const ProcessGroupPtr&, GradBucket& b) override {
    auto it = work_.find(b.index);
    BRAID_CHECK(it != work_.end(), "allreduce hook: bucket ", b.index, " finished without being launched");
    WorkPtr w = std::move(it->second);
    work_.erase(it);
    w->wait();
  }

 private:
  AllReduceOptions options_;
  std::map<size_t, WorkPtr> work_;
};

/// The k indices of v's largest magnitudes (ties to the lower index; NaN counts as largest), in
/// increasing order, as int64 on v's device.
Tensor top_k_indices(const Tensor& v, int64_t k) {
  const Tensor host = abs(v).to(Device::cpu()).to(kFloat64).contiguous();
  const double* h = host.data<double>();
  const int64_t n = host.numel();
  auto mag = [&](int64_t i) { return std::isnan(h[i]) ? INFINITY : h[i]; };
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::nth_element(order.begin(), order.begin() + k, order.end(),
                   [&](int64_t a, int64_t b) { return mag(a) > mag(b) || (mag(a) == mag(b) && a < b); });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return tensor(order, {k}, v.device());
}

}  // namespace

CommHookPtr allreduce_hook(const AllReduceOptions& options) { return std::make_shared<AllReduceHook>(options); }

struct TopKHook::State {
  Tensor residual, velocity, values, indices;
  std::vector<WorkPtr> work;
  bool dense = false;
};

TopKHook::TopKHook(const TopKOptions& o) : options_(o) {
  BRAID_CHECK(o.ratio > 0 && o.ratio <= 1, "TopKHook: ratio must be in (0, 1], got ", o.ratio);
  BRAID_CHECK(o.momentum >= 0 && o.momentum < 1, "TopKHook: momentum must be in [0, 1), got ", o.momentum);
  BRAID_CHECK(o.clip_norm >= 0 && o.warmup_steps >= 0, "TopKHook: clip_norm and warmup_steps must be >= 0, got ",
              o.clip_norm, " and ", o.warmup_steps);
}

std::string TopKHook::name() const {
  return detail::cat("top-k (ratio ", options_.ratio, options_.momentum > 0 ? ", DGC momentum correction" : "",
                     options_.clip_norm > 0 ? ", local clipping" : "", ")");
}

double TopKHook::ratio_at(int64_t step) const {
  if (options_.warmup_steps <= 0 || step >= options_.warmup_steps || options_.ratio >= 0.25) return options_.ratio;
  const double t = static_cast<double>(step) / static_cast<double>(options_.warmup_steps);
  return 0.25 * std::pow(options_.ratio / 0.25, t);  // DGC's 75%, 93.75%, ... sparsity, geometrically
}

const Tensor& TopKHook::residual(size_t b) const {
  static const Tensor none;
  auto it = state_.find(b);
  return it == state_.end() ? none : it->second->residual;
}

void TopKHook::launch(const ProcessGroupPtr& group, GradBucket& b) {
  NoGradGuard no_grad;
  auto& s = state_[b.index];
  if (!s) s = std::make_shared<State>();
  const int64_t n = b.buffer.numel(), N = group->size();
  if (!s->residual.defined()) s->residual = zeros_like(b.buffer);
  BRAID_CHECK(s->residual.numel() == n && s->residual.dtype() == b.buffer.dtype(), "TopKHook: bucket ", b.index,
              " has ", n, " ", dtype_name(b.buffer.dtype()), " elements but its residual ", s->residual.numel(), " ",
              dtype_name(s->residual.dtype()), " (a hook serves one model)");
  Tensor g = b.buffer;
  if (options_.clip_norm > 0) {
    const double norm = std::sqrt(sum(g.to(kFloat64) * g.to(kFloat64)).item());
    const double limit = options_.clip_norm / std::sqrt(static_cast<double>(N));
    if (norm > limit) g = g * (limit / norm);
  }
  if (options_.momentum > 0) {
    if (!s->velocity.defined()) s->velocity = zeros_like(b.buffer);
    s->velocity.mul_(options_.momentum).add_(g);
    s->residual.add_(s->velocity);
  } else {
    s->residual.add_(g);
  }
  const int64_t k = std::clamp<int64_t>(std::llround(ratio_at(b.step) * static_cast<double>(n)), 1, n);
  s->work.clear();
  s->dense = 2 * k >= n;
  if (s->dense) {
    b.buffer.copy_(s->residual);
    s->residual.zero_();
    if (s->velocity.defined()) s->velocity.zero_();
    s->work.push_back(group->all_reduce_async(b.buffer, ReduceOp::Average));
    return;
  }
  const Tensor idx = top_k_indices(s->residual, k);
  const Tensor vals = index_select(s->residual, 0, idx);
  // Sent entries leave the residual (and the velocity: momentum factor masking).
  const Tensor sent = gt(scatter_add(zeros({n}, kFloat32, b.buffer.device()), 0, idx, ones({k}, kFloat32, b.buffer.device())),
                         zeros({}, kFloat32, b.buffer.device()));
  const Tensor zero = zeros({}, s->residual.dtype(), s->residual.device());
  s->residual = where(sent, zero, s->residual);
  if (s->velocity.defined()) s->velocity = where(sent, zero, s->velocity);
  const int64_t r = group->rank();
  s->values = zeros({N * k}, b.buffer.dtype(), b.buffer.device());
  s->indices = zeros({N * k}, kInt32, b.buffer.device());
  s->values.narrow(0, r * k, k).copy_(vals);
  s->indices.narrow(0, r * k, k).copy_(idx.to(kInt32));
  s->work.push_back(group->all_gather_inplace_async(s->values));
  s->work.push_back(group->all_gather_inplace_async(s->indices));
}

void TopKHook::finish(const ProcessGroupPtr& group, GradBucket& b) {
  NoGradGuard no_grad;
  auto it = state_.find(b.index);
  BRAID_CHECK(it != state_.end() && !it->second->work.empty(), "TopKHook: bucket ", b.index,
              " finished without being launched");
  State& s = *it->second;
  for (auto& w : s.work) w->wait();
  s.work.clear();
  if (s.dense) return;
  const Tensor summed = scatter_add(zeros_like(b.buffer), 0, s.indices.to(kInt64), s.values);
  b.buffer.copy_(summed).mul_(1.0 / static_cast<double>(group->size()));
  s.values = Tensor(), s.indices = Tensor();
}

void TopKHook::store(Checkpoint& ckpt, const std::string& prefix) const {
  for (const auto& [b, s] : state_) {
    if (s->residual.defined()) ckpt.tensors[detail::cat(prefix, b, ".residual")] = s->residual.clone();
    if (s->velocity.defined()) ckpt.tensors[detail::cat(prefix, b, ".velocity")] = s->velocity.clone();
  }
}

void TopKHook::restore(const Checkpoint& ckpt, const std::string& prefix) {
  std::map<size_t, std::shared_ptr<State>> loaded;
  for (const auto& [key, t] : ckpt.tensors) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string rest = key.substr(prefix.size());
    const size_t dot = rest.find('.');
    BRAID_CHECK(dot != std::string::npos && dot > 0 && rest.find_first_not_of("0123456789") == dot,
                "TopKHook::restore: unexpected entry '", key, "' in ", ckpt.source);
    auto& s = loaded[std::stoul(rest.substr(0, dot))];
    if (!s) s = std::make_shared<State>();
    const std::string what = rest.substr(dot + 1);
    BRAID_CHECK(what == "residual" || what == "velocity", "TopKHook::restore: unexpected entry '", key, "' in ",
                ckpt.source);
    (what == "residual" ? s->residual : s->velocity) = t.clone();
  }
  state_ = std::move(loaded);
}

}  // namespace braid::distributed
