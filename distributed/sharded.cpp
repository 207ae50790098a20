// ShardedDataParallel: buckets (DistributedDataParallel's at stages 1 and 2, the units at stage 3),
// each a flat parameter buffer that the module's tensors view, cut into one segment per rank.
// Backward reduce-scatters each bucket's gradients as it completes; step() runs the optimizer on
// this rank's segments and all-gathers them (stage 3 gathers a unit when it is used:
// sharded_units.cpp).
//
// Note [Sharded equals data-parallel]
// Each element's gradient is summed by reduce_scatter_inplace in the tree that all_reduce with
// deterministic = true uses for the same bucket (Note [Reduction order] in mpi_group.cpp), and the
// buckets of stages 1 and 2 are DistributedDataParallel's, so the averaged gradients have the same
// bits as under DistributedDataParallel(deterministic = true); an elementwise optimizer then makes
// the same update on a segment as on the whole tensor, and after any number of steps the
// parameters are bitwise those of data-parallel training. Stage 3's buckets are its units, not
// data-parallel's buckets: recursive doubling's tree (power-of-two groups, buckets under 256 KiB)
// does not depend on where a bucket begins, so the bits still agree there, while the ring's does,
// and with larger buckets or other group sizes stage 3 agrees to rounding. Without deterministic,
// data-parallel training takes another order only for buckets that neither recursive doubling nor
// the ring (32 KiB and more) serves; on two ranks every order is the same.
#include "braid/distributed/sharded.h"

#include <exception>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"
#include "distributed/sharded_internal.h"

namespace braid::distributed {

// Note [Parameters in flat buffers]
// The module's parameter becomes a view of its bucket's flat buffer: the same tensor (its identity,
// autograd state, hooks and name are kept) over other memory, as PyTorch's `p.data = flat[a:b]`.
// Everything that holds the parameter sees the new memory; the old is freed with its last user.
void detail::rebind(const Tensor& param, const Tensor& view) {
  TensorImpl& impl = *param.impl_ptr();
  impl.storage = view.storage();
  impl.offset = view.offset();
  impl.shape = view.shape();
  impl.strides = view.strides();
}

namespace {

int64_t bytes_of(const Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

}  // namespace

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<nn::Module> module, const OptimizerFactory& make_optimizer,
                                         ProcessGroupPtr group, const ShardedOptions& options)
    : module_(std::move(module)), group_(group ? std::move(group) : world()), options_(options) {
  BRAID_CHECK(module_ != nullptr, "ShardedDataParallel: the module is null");
  BRAID_CHECK(options_.stage >= 1 && options_.stage <= 3, "ShardedDataParallel: stage must be 1, 2 or 3, got ",
              options_.stage);
  BRAID_CHECK(options_.stage == 3 || options_.units.empty(), "ShardedDataParallel: units are for stage 3; stage ",
              options_.stage, " shards by buckets");
  BRAID_CHECK(options_.bucket_cap_mb >= 0, "ShardedDataParallel: bucket_cap_mb must be >= 0, got ",
              options_.bucket_cap_mb);
  BRAID_CHECK(make_optimizer != nullptr, "ShardedDataParallel: no optimizer factory given");
  for (const auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    // Mixed precision in braid is autocast over float32 parameters, so there are no 2-byte
    // parameters that would need float32 master copies.
    BRAID_CHECK_T(TypeError, p.dtype() == kFloat32 || p.dtype() == kFloat64, "ShardedDataParallel: parameter '", name,
                  "' is ", dtype_name(p.dtype()), "; sharding takes float32 or float64 parameters (use autocast for "
                  "mixed precision)");
    names_.push_back(name);
    params_.push_back(p);
  }
  detail::check_and_broadcast_model(*module_, *group_, options_.broadcast_buffers, "ShardedDataParallel");

  std::vector<bool> is_unit;
  std::vector<std::string> unit_paths;
  if (options_.stage == 3) {
    make_buckets(plan_units(is_unit, unit_paths), is_unit);
  } else {
    const auto plans = detail::plan_buckets(params_, options_.bucket_cap_mb);
    make_buckets(plans, std::vector<bool>(plans.size(), false));
  }
  std::vector<Tensor> shards;
  for (auto& b : buckets_) shards.push_back(b->shard);
  optimizer_ = make_optimizer(shards);
  BRAID_CHECK(optimizer_ != nullptr, "ShardedDataParallel: the optimizer factory returned null");
  ready_.assign(params_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k)
    hook_ids_.push_back(add_grad_ready_hook(params_[k], [this, k] { on_grad_ready(k); }));
  if (options_.stage == 3) {
    for (size_t i = 0; i < buckets_.size(); ++i)
      if (buckets_[i]->unit) release(i);
    wrap_units(unit_paths);
  }
}

void ShardedDataParallel::make_buckets(const std::vector<std::vector<size_t>>& plans, const std::vector<bool>& is_unit) {
  const int64_t n_ranks = group_->size(), r = group_->rank();
  bucket_of_.assign(params_.size(), 0);
  NoGradGuard no_grad;
  for (size_t i = 0; i < plans.size(); ++i) {
    const auto& plan = plans[i];
    auto& b = *buckets_.emplace_back(std::make_unique<Bucket>());
    b.unit = is_unit[i];
    const Tensor& first = params_[plan.front()];
    for (size_t k : plan) {
      const Tensor& p = params_[k];
      BRAID_CHECK_T(TypeError, p.dtype() == first.dtype() && p.device() == first.device(), "ShardedDataParallel: '",
                    names_[k], "' is ", dtype_name(p.dtype()), " on ", p.device().str(), " but '", names_[plan.front()],
                    "' of the same unit is ", dtype_name(first.dtype()), " on ", first.device().str(),
                    "; a unit's parameters share one flat buffer");
      b.params.push_back(k);
      b.offsets.push_back(b.numel);
      b.shapes.push_back(p.shape());
      b.numel += p.numel();
      bucket_of_[k] = buckets_.size() - 1;
    }
    b.flat = empty({b.numel}, first.dtype(), first.device());
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params_[b.params[j]];
      Tensor view = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.shape());
      view.copy_(p);
      detail::rebind(p, view);
    }
    b.begin = b.numel * r / n_ranks;
    b.end = b.numel * (r + 1) / n_ranks;
    Tensor segment = b.flat.narrow(0, b.begin, b.end - b.begin);
    // A unit's segment outlives its flat buffer's memory: the shard is its own copy.
    b.shard = b.unit ? segment.clone() : segment.detach();
    b.shard.set_requires_grad(true);
    if (options_.stage == 1) b.grad_flat = zeros({b.numel}, first.dtype(), first.device());
  }
}

ShardedDataParallel::~ShardedDataParallel() {
  for (size_t k = 0; k < params_.size(); ++k) remove_grad_ready_hook(params_[k], hook_ids_[k]);
  for (auto& b : buckets_) {
    if (!b->work) continue;
    try {
      b->work->wait();
    } catch (...) {  // reported by the backward that launched it
    }
  }
  if (wrapped_.empty()) return;
  // Stage 3: the model gets its whole parameters back (unless an error is unwinding the stack, when
  // a collective could wait for ranks that are not coming) and its own modules in place of the units.
  try {
    if (std::uncaught_exceptions() == 0)
      for (size_t i = 0; i < buckets_.size(); ++i) gather(i);
  } catch (...) {
  }
  for (auto it = wrapped_.rbegin(); it != wrapped_.rend(); ++it) module_->replace_child(it->first, it->second);
}

std::vector<std::vector<std::string>> ShardedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    auto& names = out.emplace_back();
    for (size_t k : b->params) names.push_back(names_[k]);
  }
  return out;
}

std::pair<int64_t, int64_t> ShardedDataParallel::shard_range(size_t bucket) const {
  BRAID_CHECK_T(IndexError, bucket < buckets_.size(), "ShardedDataParallel::shard_range: bucket ", bucket, " of ",
                buckets_.size());
  return {buckets_[bucket]->begin, buckets_[bucket]->end};
}

ShardedDataParallel::NoSync::NoSync(ShardedDataParallel& sdp) : sdp_(sdp), prev_(sdp.sync_) {
  BRAID_CHECK(sdp.options_.stage < 3, "ShardedDataParallel::NoSync: stage 3 frees the parameters after each use, so "
              "it cannot accumulate gradients locally; run backward with synchronisation (the gradients accumulate "
              "in the shard)");
  sdp_.sync_ = false;
}

void ShardedDataParallel::on_grad_ready(size_t k) {
  if (!sync_) return;
  if (!in_backward_) {
    in_backward_ = true;
    std::fill(ready_.begin(), ready_.end(), false);
    for (auto& b : buckets_) b->pending = b->params.size(), b->launched = false;
    next_launch_ = 0;
    queue_backward_callback([this] { finish_backward(); });
  }
  if (ready_[k]) return;
  ready_[k] = true;
  const size_t i = bucket_of_[k];
  if (--buckets_[i]->pending > 0) return;
  // Stage 3: every parameter of the unit has its gradient, so backward needs its values no more.
  if (buckets_[i]->unit) release(i);
  launch_ready_buckets();
}

// In index order on every rank, whatever order the gradients arrive in (as DistributedDataParallel).
void ShardedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) launch(next_launch_++);
}

// The bucket's gradients go into its flat gradient buffer and leave the parameters (the buffer is
// the only full-size copy); a parameter that had no gradient in this pass adds zeros.
void ShardedDataParallel::launch(size_t i) {
  Bucket& b = *buckets_[i];
  NoGradGuard no_grad;
  if (!b.grad_flat.defined()) b.grad_flat = empty({b.numel}, b.flat.dtype(), b.flat.device());
  if (options_.stage == 1 && b.has_grad) b.carried = b.grad_flat.narrow(0, b.begin, b.end - b.begin).clone();
  for (size_t j = 0; j < b.params.size(); ++j) {
    Tensor p = params_[b.params[j]];
    const int64_t size = (j + 1 < b.params.size() ? b.offsets[j + 1] : b.numel) - b.offsets[j];
    Tensor slot = b.grad_flat.narrow(0, b.offsets[j], size);
    const Tensor g = p.grad();
    if (g.defined() && ready_[b.params[j]]) slot.copy_(g.reshape({size}));
    else slot.zero_();
    p.set_grad(Tensor());
  }
  b.launched = true;
  b.work = group_->reduce_scatter_inplace_async(b.grad_flat, ReduceOp::Average);
  // Stages 2 and 3 keep at most kInFlight full-size gradient buffers: the older buckets' are
  // harvested (waited for if need be) as backward goes on.
  if (options_.stage == 1) return;
  constexpr size_t kInFlight = 2;
  size_t in_flight = 0;
  for (size_t k = i + 1; k-- > 0;) {
    Bucket& older = *buckets_[k];
    if (!older.work) continue;
    if (++in_flight > kInFlight || older.work->is_completed()) harvest(older);
  }
}

// The bucket's reduce-scatter is done: its segment becomes (or adds to) the shard's gradient, and
// at stages 2 and 3 the full-size buffer goes.
void ShardedDataParallel::harvest(Bucket& b) {
  b.work->wait();
  b.work.reset();
  NoGradGuard no_grad;
  Tensor segment = b.grad_flat.narrow(0, b.begin, b.end - b.begin);
  if (options_.stage == 1) {
    // The segment of the persistent buffer is the shard's gradient; a second backward before
    // step() adds to what launch() set aside.
    if (b.carried.defined()) segment.add_(b.carried);
    b.carried = Tensor();
    b.shard_grad = segment;
  } else {
    if (b.has_grad) b.shard_grad.add_(segment);
    else b.shard_grad = segment.clone();
    b.grad_flat = Tensor();
  }
  b.has_grad = true;
}

void ShardedDataParallel::finish_backward() {
  in_backward_ = false;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    // A unit some of whose parameters had no gradient, or one prefetched and not used.
    if (buckets_[i]->unit && (buckets_[i]->gathered || buckets_[i]->gather_work)) release(i);
    buckets_[i]->pending = 0;
  }
  launch_ready_buckets();
  for (auto& b : buckets_)
    if (b->work) harvest(*b);
  learn_order();
}

// The forward that this backward closes gives the order the next step prefetches in.
void ShardedDataParallel::learn_order() {
  if (forward_now_.empty()) return;
  next_in_forward_.clear();
  next_in_backward_.clear();
  for (size_t k = 0; k + 1 < forward_now_.size(); ++k) {
    next_in_forward_.emplace(forward_now_[k], forward_now_[k + 1]);
    next_in_backward_.emplace(forward_now_[k + 1], forward_now_[k]);
  }
  forward_now_.clear();
}

void ShardedDataParallel::step() {
  BRAID_CHECK(!in_backward_, "ShardedDataParallel::step: called during backward");
  NoGradGuard no_grad;
  for (auto& b : buckets_) {
    if (!b->has_grad) continue;
    b->shard.set_grad(b->shard_grad);
  }
  optimizer_->step();
  for (auto& b : buckets_) {
    b->shard.set_grad(Tensor());  // the bucket keeps it until zero_grad()
    if (b->unit) continue;        // gathered from the shard before its next use
    b->work = group_->all_gather_inplace_async(b->flat);
  }
  for (auto& b : buckets_) {
    if (b->unit) continue;
    b->work->wait();
    b->work.reset();
    b->flat.storage()->bump_version();
  }
}

void ShardedDataParallel::zero_grad() {
  for (auto& b : buckets_) {
    b->has_grad = false;
    if (options_.stage >= 2) b->shard_grad = Tensor();
  }
}

ModelStateBytes ShardedDataParallel::model_state_bytes() const {
  ModelStateBytes m;
  for (const auto& b : buckets_) {
    if (!b->unit || b->gathered) m.parameters += bytes_of(b->flat);
    if (b->unit) m.parameters += bytes_of(b->shard);
    m.gradients += options_.stage == 1 ? bytes_of(b->grad_flat) : bytes_of(b->shard_grad);
    if (const optim::ParamState* st = optimizer_->state(b->shard))
      for (const auto& [name, t] : st->tensors) m.optimizer += bytes_of(t);
  }
  return m;
}

}  // namespace braid::distributed
