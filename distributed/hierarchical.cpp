// HierarchicalGroup: the all-reduce in three phases over the group's nodes, run in order on a
// worker thread of its own so that each call returns at once, as the flat all-reduce does.
//
// Note [Hierarchical all-reduce]
// For a flat buffer of n elements on N = M x L ranks (M nodes of L ranks): (1) reduce-scatter
// inside the node (reduce_scatter_inplace: local rank l ends with segment l = [n l / L, n (l + 1) / L)
// summed over its node); (2) all-reduce of that segment among the M ranks of local rank l, one per
// node, which therefore hold the same segment; (3) all-gather inside the node. A rank sends about
// 2 n (L - 1) / L elements inside its node and 2 (n / L)(M - 1) / M across nodes, against
// 2 n (N - 1) / N across nodes for a flat ring (whose neighbours are, at best, on other nodes once per
// node): the cross-node share falls L-fold. Averages sum in both phases and scale once by 1 / N at
// the end of phase 2. Sums are grouped differently from the flat algorithms, so the bits equal
// theirs when every partial sum is exact (integer-valued data) and differ by rounding otherwise.
#include "braid/distributed/hierarchical.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "braid/ops.h"
#include "core/knob_read.h"
#include "distributed/internal.h"

namespace braid::distributed {

NodeLayout node_layout(const ProcessGroupPtr& group, const HierarchicalOptions& options) {
  BRAID_CHECK(group != nullptr, "node_layout: the group is null");
  BRAID_CHECK(options.ranks_per_node >= 0, "HierarchicalOptions: ranks_per_node must be >= 0, got ",
              options.ranks_per_node);
  const int n = group->size(), r = group->rank();
  int k = options.ranks_per_node > 0 ? options.ranks_per_node : static_cast<int>(braid::detail::knob_count("BRAID_RANKS_PER_NODE"));
  std::vector<int64_t> key(static_cast<size_t>(n));
  if (k > 0) {
    for (int i = 0; i < n; ++i) key[static_cast<size_t>(i)] = i / k;
  } else {
    const std::string& host = world_info().host;
    Tensor mine = zeros({1}, kInt64, Device::cpu());
    mine.data<int64_t>()[0] = static_cast<int64_t>(detail::fnv1a(host.data(), host.size()));
    key = group->all_gather(mine).reshape({n}).to_vector<int64_t>();
  }
  // Nodes numbered by first appearance; counts per node.
  std::map<int64_t, int> number;
  std::vector<int> node_of(static_cast<size_t>(n)), count;
  for (int i = 0; i < n; ++i) {
    auto [it, fresh] = number.emplace(key[static_cast<size_t>(i)], static_cast<int>(number.size()));
    if (fresh) count.push_back(0);
    node_of[static_cast<size_t>(i)] = it->second;
    ++count[static_cast<size_t>(it->second)];
  }
  NodeLayout l;
  l.nodes = static_cast<int>(count.size());
  l.node = node_of[static_cast<size_t>(r)];
  l.ranks_per_node = count[static_cast<size_t>(l.node)];
  for (int i = 0; i < r; ++i) l.local_rank += node_of[static_cast<size_t>(i)] == l.node;
  for (int c : count) l.even = l.even && c == count[0];
  return l;
}

std::shared_ptr<HierarchicalGroup> make_hierarchical_group(const ProcessGroupPtr& group,
                                                           const HierarchicalOptions& options) {
  BRAID_CHECK(options.min_bytes >= 0, "HierarchicalOptions: min_bytes must be >= 0, got ", options.min_bytes);
  const NodeLayout l = node_layout(group, options);
  if (!l.hierarchical()) return nullptr;
  ProcessGroupPtr intra = group->split(l.node, group->rank());
  ProcessGroupPtr inter = group->split(l.local_rank, l.node);
  return std::make_shared<HierarchicalGroup>(group, std::move(intra), std::move(inter), l, options.min_bytes);
}

// One thread running the three-phase jobs in the order they were called (every rank calls them in
// the same order, so the phases' collectives match across ranks).
struct HierarchicalGroup::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::packaged_task<void()>> jobs;
  bool stop = false;
  detail::TrafficCounter traffic;
  std::thread thread{[this] { loop(); }};

  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void loop() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();  // an exception goes to the job's future
    }
  }
  std::shared_future<void> push(std::function<void()> fn) {
    std::packaged_task<void()> task(std::move(fn));
    std::shared_future<void> done = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu);
      jobs.push_back(std::move(task));
    }
    cv.notify_one();
    return done;
  }
};

namespace {
class FutureWork final : public Work {
 public:
  explicit FutureWork(std::shared_future<void> f) : f_(std::move(f)) {}
  void wait() override { f_.get(); }
  bool is_completed() override { return f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

 private:
  std::shared_future<void> f_;
};
}  // namespace

HierarchicalGroup::HierarchicalGroup(ProcessGroupPtr group, ProcessGroupPtr intra, ProcessGroupPtr inter,
                                     const NodeLayout& layout, int64_t min_bytes)
    : group_(std::move(group)),
      intra_(std::move(intra)),
      inter_(std::move(inter)),
      layout_(layout),
      min_bytes_(min_bytes),
      worker_(std::make_unique<Worker>()) {}

HierarchicalGroup::~HierarchicalGroup() = default;

std::string HierarchicalGroup::name() const {
  return braid::detail::cat(group_->name(), " (hierarchical: ", layout_.nodes, " nodes x ", layout_.ranks_per_node, ")");
}

Traffic HierarchicalGroup::traffic() const { return worker_->traffic.get(size()); }
void HierarchicalGroup::reset_traffic() { worker_->traffic.reset(); }

WorkPtr HierarchicalGroup::all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& options) {
  detail::check_all_reduce(t, op, options);
  worker_->traffic.add(&Traffic::all_reduce, t);
  if (t.numel() * static_cast<int64_t>(t.element_size()) < min_bytes_) return group_->all_reduce_async(t, op, options);
  return std::make_shared<FutureWork>(worker_->push([this, t, op, options] {
    const ReduceOp phase = op == ReduceOp::Average ? ReduceOp::Sum : op;
    Tensor flat = t.reshape({t.numel()});
    intra_->reduce_scatter_inplace_async(flat, phase, options)->wait();
    const int64_t n = flat.numel(), L = layout_.ranks_per_node, l = layout_.local_rank;
    Tensor segment = flat.narrow(0, n * l / L, n * (l + 1) / L - n * l / L);
    if (segment.numel() > 0) inter_->all_reduce_async(segment, phase, options)->wait();
    if (op == ReduceOp::Average && segment.numel() > 0) segment.mul_(1.0 / static_cast<double>(size()));
    intra_->all_gather_inplace_async(flat)->wait();
  }));
}

}  // namespace braid::distributed
