// What every process group shares beyond its interface: the traffic counter that world() and its
// splits keep, and the in-place reduce-scatter and all-gather for groups without their own (they
// run whole collectives: the right values, more bytes).
#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed {

double Traffic::bus_elements() const {
  const double n = ranks, share = (n - 1) / n;
  return 2 * share * static_cast<double>(all_reduce.elements) +
         share * static_cast<double>(reduce_scatter.elements + all_gather.elements) +
         static_cast<double>(broadcast.elements);
}

namespace {
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkPtr ProcessGroup::reduce_scatter_inplace_async(Tensor flat, ReduceOp op, const AllReduceOptions& options) {
  AllReduceOptions o = options;
  o.deterministic = true;
  return all_reduce_async(std::move(flat), op, o);
}

WorkPtr ProcessGroup::all_gather_inplace_async(Tensor flat) {
  detail::check_collective_tensor(flat, "all_gather_inplace");
  const int64_t n = flat.numel(), p = size();
  const int64_t longest = (n + p - 1) / p;
  NoGradGuard no_grad;
  Tensor mine = zeros({longest}, flat.dtype(), flat.device());
  const int64_t b = n * rank() / p, e = n * (rank() + 1) / p;
  mine.narrow(0, 0, e - b).copy_(flat.narrow(0, b, e - b));
  Tensor all = all_gather(mine);
  for (int64_t r = 0; r < p; ++r) {
    const int64_t rb = n * r / p, re = n * (r + 1) / p;
    flat.narrow(0, rb, re - rb).copy_(all.select(0, r).narrow(0, 0, re - rb));
  }
  return std::make_shared<DoneWork>();
}

}  // namespace braid::distributed

namespace braid::distributed::detail {

void TrafficCounter::add(TrafficCount Traffic::*kind, const Tensor& t, int64_t factor) {
  std::lock_guard<std::mutex> lock(mu_);
  TrafficCount& c = counts_.*kind;
  c.calls += 1;
  if (!t.defined()) return;
  c.elements += factor * t.numel();
  c.bytes += factor * t.numel() * t.element_size();
}

Traffic TrafficCounter::get(int ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  Traffic t = counts_;
  t.ranks = ranks;
  return t;
}

void TrafficCounter::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  counts_ = Traffic{};
}

}  // namespace braid::distributed::detail
