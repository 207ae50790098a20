// Stage 3 of ShardedDataParallel: the units. Each unit (a layer, or a block named in the options)
// keeps only this rank's segment of its parameters between uses. A ShardedUnit module stands in the
// model where the layer was: it gathers the parameters, runs the layer, frees them, and returns the
// output through an identity op whose backward gathers them again before the layer's own backward
// runs; once every parameter of the unit has its gradient, the reduce-scatter takes the gradients
// and the parameters are freed again (sharded.cpp).
//
// Note [Freed parameters]
// A freed unit's flat storage holds no memory (Storage::resize(0)) and its parameters have shape
// [0], so that a forward that reaches them outside their unit fails with a shape error naming the
// op rather than reading freed memory. Views that backward saved (a weight's transpose) keep the
// storage object, not its memory, and see the gathered values again once the unit's backward
// begins. A parameter belongs to one unit: sharing one across units (tied embeddings) needs the
// two layers in one unit, as in FSDP.
#include <algorithm>
#include <map>

#include "autograd/function.h"
#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"
#include "distributed/sharded_internal.h"

namespace braid::distributed {

/// Stands in the model for a sharded layer; holds the layer's own parameters, buffers and children
/// under the same names, so the model's names and state dict are unchanged.
class ShardedUnit final : public nn::Module {
 public:
  ShardedUnit(nn::ModulePtr inner, ShardedDataParallel* owner, size_t bucket)
      : Module(inner->type_name()), inner_(std::move(inner)), owner_(owner), bucket_(bucket) {
    for (const auto& [n, p] : inner_->named_parameters(false)) register_parameter(n, p, p.requires_grad());
    for (const auto& [n, b] : inner_->named_buffers(false)) register_buffer(n, b);
    for (const auto& [n, c] : inner_->named_children()) register_module(n, c);
    train(inner_->is_training());
  }

  Tensor forward(const Tensor& x) override {
    if (inner_->is_training() != is_training()) inner_->train(is_training());
    Tensor y = owner_->run_unit(bucket_, *inner_, x);
    for (const auto& [n, b] : inner_->named_buffers(false)) set_buffer(n, b);  // BatchNorm replaces its statistics
    return y;
  }
  std::string describe() const override { return inner_->describe(); }

 private:
  nn::ModulePtr inner_;
  ShardedDataParallel* owner_;
  size_t bucket_;
};

std::vector<std::vector<size_t>> ShardedDataParallel::plan_units(std::vector<bool>& is_unit,
                                                                  std::vector<std::string>& unit_paths) {
  std::vector<std::string> paths = options_.units;
  if (paths.empty()) {
    // The children of the model that hold parameters, looking through a container that holds
    // nothing else (a model whose only child is its encoder: the encoder's layers).
    std::string prefix;
    nn::ModulePtr at = module_;
    while (true) {
      std::vector<std::pair<std::string, nn::ModulePtr>> holders;
      for (const auto& [n, c] : at->named_children())
        if (!c->named_parameters().empty()) holders.emplace_back(n, c);
      if (holders.size() == 1 && at->named_parameters(false).empty() && !holders[0].second->named_children().empty()) {
        prefix += holders[0].first + ".";
        at = holders[0].second;
        continue;
      }
      for (const auto& [n, c] : holders) paths.push_back(prefix + n);
      break;
    }
  }
  for (const auto& p : paths) {
    BRAID_CHECK(!p.empty(), "ShardedDataParallel: the model itself cannot be a unit; its own parameters stay whole");
    (void)module_->child(p);  // IndexError listing the known names
  }
  // Each parameter goes to the innermost unit that contains it.
  std::vector<std::vector<size_t>> members(paths.size());
  std::vector<size_t> resident;
  for (size_t k = 0; k < params_.size(); ++k) {
    long best = -1;
    for (size_t u = 0; u < paths.size(); ++u)
      if (names_[k].rfind(paths[u] + ".", 0) == 0 &&
          (best < 0 || paths[u].size() > paths[static_cast<size_t>(best)].size()))
        best = static_cast<long>(u);
    if (best < 0) resident.push_back(k);
    else members[static_cast<size_t>(best)].push_back(k);
  }
  // Units in backward's order (the reverse of their first parameter's registration), each filled in
  // reverse like plan_buckets; then the parameters that stay whole, in buckets.
  std::vector<size_t> order;
  for (size_t u = 0; u < paths.size(); ++u)
    if (!members[u].empty()) order.push_back(u);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return members[a].front() > members[b].front(); });
  std::vector<std::vector<size_t>> plans;
  for (size_t u : order) {
    plans.emplace_back(members[u].rbegin(), members[u].rend());
    is_unit.push_back(true);
    unit_paths.push_back(paths[u]);
  }
  std::vector<Tensor> rest;
  for (size_t k : resident) rest.push_back(params_[k]);
  for (const auto& plan : detail::plan_buckets(rest, options_.bucket_cap_mb)) {
    auto& p = plans.emplace_back();
    for (size_t j : plan) p.push_back(resident[j]);
    is_unit.push_back(false);
  }
  return plans;
}

// Deepest first, so that a unit inside another is already in place when the outer one takes its
// children.
void ShardedDataParallel::wrap_units(const std::vector<std::string>& unit_paths) {
  std::vector<size_t> order(unit_paths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto depth = [&](size_t i) { return std::count(unit_paths[i].begin(), unit_paths[i].end(), '.'); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return depth(a) > depth(b); });
  for (size_t i : order) {
    nn::ModulePtr inner = module_->child(unit_paths[i]);
    module_->replace_child(unit_paths[i], std::make_shared<ShardedUnit>(inner, this, i));
    wrapped_.emplace_back(unit_paths[i], inner);
  }
}

// Note [Prefetching units]
// A unit's all-gather for its next use is started early, so that it travels while the layer before
// it computes: in forward, when unit i starts, the unit that followed i in the previous step's
// forward; in backward, when unit i is gathered again, the unit that preceded it. The order is the
// previous training step's (the first step gathers each unit when it is reached), and every rank
// makes the same calls in the same order, as collectives need. A unit prefetched but not used
// stays gathered until the end of backward. Prefetching changes when the gathers run, not how many.
void ShardedDataParallel::start_gather(size_t i) {
  Bucket& b = *buckets_[i];
  if (b.gathered || b.gather_work) return;
  NoGradGuard no_grad;
  b.flat.storage()->resize(b.numel * b.flat.element_size());
  b.flat.narrow(0, b.begin, b.end - b.begin).copy_(b.shard);
  b.gather_work = group_->all_gather_inplace_async(b.flat);
}

void ShardedDataParallel::gather(size_t i) {
  Bucket& b = *buckets_[i];
  if (b.gathered) return;
  start_gather(i);
  b.gather_work->wait();
  b.gather_work.reset();
  for (size_t j = 0; j < b.params.size(); ++j) {
    const int64_t size = (j + 1 < b.params.size() ? b.offsets[j + 1] : b.numel) - b.offsets[j];
    detail::rebind(params_[b.params[j]], b.flat.narrow(0, b.offsets[j], size).view(b.shapes[j]));
  }
  b.gathered = true;
}

void ShardedDataParallel::prefetch(size_t i, bool forward) {
  forward_now_.push_back(i);
  if (!options_.prefetch) return;
  const auto& next = forward ? next_in_forward_ : next_in_backward_;
  auto it = next.find(i);
  if (it != next.end()) start_gather(it->second);
}

void ShardedDataParallel::release(size_t i) {
  Bucket& b = *buckets_[i];
  if (b.gather_work) gather(i);  // a prefetch in flight: let it land before the memory goes
  if (!b.gathered) return;
  for (size_t k : b.params) {
    TensorImpl& impl = *params_[k].impl_ptr();
    impl.shape = {0};
    impl.strides = {1};
  }
  b.flat.storage()->resize(0);
  b.gathered = false;
}

Tensor ShardedDataParallel::run_unit(size_t i, nn::Module& inner, const Tensor& x) {
  gather(i);
  if (is_grad_enabled()) prefetch(i, true);
  Tensor y;
  try {
    y = inner.forward(x);
  } catch (...) {
    release(i);
    throw;
  }
  release(i);
  if (!is_grad_enabled() || !y.defined() || !y.requires_grad()) return y;
  // Backward reaches this op before any of the unit's own: the parameters are gathered for them.
  return ::braid::detail::record("sharded_unit", y.detach(), {y}, [this, i](const Tensor& g, ::braid::detail::Grads& grads) {
    gather(i);
    auto it = next_in_backward_.find(i);
    if (options_.prefetch && it != next_in_backward_.end()) start_gather(it->second);
    grads.set(0, g);
  });
}

nn::StateDict ShardedDataParallel::full_state_dict() {
  if (options_.stage < 3) return module_->state_dict();
  nn::StateDict out;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (!buckets_[i]->unit) continue;
    gather(i);
    for (size_t k : buckets_[i]->params) out[names_[k]] = params_[k].detach().clone();
    release(i);
  }
  for (const auto& [name, t] : module_->state_dict())
    if (!out.count(name)) out[name] = t.detach().clone();
  return out;
}

}  // namespace braid::distributed
