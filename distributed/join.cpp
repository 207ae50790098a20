// Join: uneven inputs for DistributedDataParallel.
//
// Note [Join]
// Every synchronised backward of a rank still training starts with one all-reduce of 1 (the rank is
// active); a rank in finish() contributes 0 to the same all-reduce, so the sum is the number of
// ranks still training, the same on every rank. While it is positive, the finished rank runs the
// bucket all-reduces of that step with zero gradients (through the same hook, in the same bucket
// order, and find_unused_parameters' all-reduce when it is on), so the training ranks' collectives
// always have every rank. When it is zero, every rank has finished: the ranks agree (one all-gather
// of their step counts) on the rank that ran the most steps, the highest of equals (PyTorch's
// _sync_final_model: an all-reduce MAX over the ranks of the last joiners), and take its parameters
// and buffers. A finished rank does not step its optimizer, as in PyTorch: its optimizer state
// (momentum) stays that of its last step; the parameters it ends with are the broadcast ones.
#include <algorithm>

#include "braid/autograd.h"
#include "braid/distributed/data_parallel.h"
#include "braid/ops.h"

namespace braid::distributed {

Join::Join(DistributedDataParallel& ddp, const JoinOptions& options) : ddp_(ddp), options_(options) {
  BRAID_CHECK(!ddp.options_.autotune, "Join: DistributedDataParallel's autotune all-reduces timings that a finished ",
              "rank cannot match; construct it without autotune");
  BRAID_CHECK(ddp.join_ == nullptr, "Join: this DistributedDataParallel already has a Join attached");
  ddp.join_ = this;
}

Join::~Join() {
  if (ddp_.join_ == this) ddp_.join_ = nullptr;
}

int Join::count_active(bool active) {
  Tensor t = full({1}, active ? 1.0 : 0.0, kInt64, Device::cpu());
  ddp_.group_->all_reduce(t, ReduceOp::Sum);
  return static_cast<int>(t.item());
}

void Join::finish() {
  BRAID_CHECK(!finished_, "Join::finish: called twice");
  finished_ = true;
  while (count_active(false) > 0) {
    ddp_.shadow_backward();
    ++shadowed_;
  }
  ProcessGroup& g = *ddp_.group_;
  const auto steps = g.all_gather(full({1}, static_cast<double>(ddp_.steps_), kInt64, Device::cpu())).reshape({-1});
  const auto counts = steps.to_vector<int64_t>();
  const int root = static_cast<int>(counts.rend() - std::max_element(counts.rbegin(), counts.rend()) - 1);
  NoGradGuard no_grad;
  for (const auto& [name, p] : ddp_.module_->named_parameters()) g.broadcast(p, root);
  for (const auto& [name, b] : ddp_.module_->named_buffers()) g.broadcast(b, root);
  ddp_.join_ = nullptr;
}

}  // namespace braid::distributed
