// The world of one: a real process group whose collectives are identities, so that every model,
// test and the training program run unchanged without a launcher.
#include <deque>
#include <map>
#include <mutex>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed::detail {

namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class LocalGroup : public ProcessGroup {
 public:
  explicit LocalGroup(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  int world_rank(int r) const override {
    check_peer(r, 1, "world_rank");
    return 0;
  }
  WorkPtr all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    check_all_reduce(t, op, options);
    traffic_.add(&Traffic::all_reduce, t);
    return std::make_shared<DoneWork>();
  }
  void broadcast(Tensor t, int root) override {
    check_collective_tensor(t, "broadcast");
    check_peer(root, 1, "broadcast");
    traffic_.add(&Traffic::broadcast, t);
  }
  Tensor all_gather(const Tensor& t) override {
    check_collective_tensor(t, "all_gather");
    traffic_.add(&Traffic::all_gather, t);
    return t.clone().unsqueeze(0);
  }
  Tensor reduce_scatter(const Tensor& t, ReduceOp) override {
    check_collective_tensor(t, "reduce_scatter");
    BRAID_CHECK(t.dim() >= 1, "reduce_scatter: expected at least one axis, got a scalar");
    traffic_.add(&Traffic::reduce_scatter, t);
    return t.clone();
  }
  WorkPtr reduce_scatter_inplace_async(Tensor flat, ReduceOp op, const AllReduceOptions& options) override {
    check_all_reduce(flat, op, options);
    traffic_.add(&Traffic::reduce_scatter, flat);
    return std::make_shared<DoneWork>();
  }
  WorkPtr all_gather_inplace_async(Tensor flat) override {
    check_collective_tensor(flat, "all_gather_inplace");
    traffic_.add(&Traffic::all_gather, flat);
    return std::make_shared<DoneWork>();
  }
  void barrier() override {}
  // A rank may send to itself, as under MPI: a send is kept (a copy) until the receive with its tag
  // takes it, in order per tag. A receive with nothing sent is an error at once: no other rank can
  // send it later.
  WorkPtr isend(const Tensor& t, int dst, int tag) override {
    check_collective_tensor(t, "isend");
    check_peer(dst, 1, "isend");
    traffic_.add(&Traffic::send, t);
    NoGradGuard guard;
    std::lock_guard<std::mutex> lock(mu_);
    sent_[tag].push_back(t.detach().clone());
    return std::make_shared<DoneWork>();
  }
  WorkPtr irecv(Tensor t, int src, int tag) override {
    check_collective_tensor(t, "irecv");
    check_peer(src, 1, "irecv");
    traffic_.add(&Traffic::recv, t);
    Tensor sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sent_.find(tag);
      BRAID_CHECK_T(DistributedError, it != sent_.end() && !it->second.empty(), "irecv: rank 0 of a world of one ",
                    "receives from itself with tag ", tag, ", but sent nothing with that tag (launch with mpiexec -n N "
                    "for peers)");
      sent = std::move(it->second.front());
      it->second.pop_front();
    }
    BRAID_CHECK_T(DistributedError, sent.dtype() == t.dtype() && sent.numel() == t.numel(),
                  "irecv: rank 0 receives from itself with tag ", tag, " into ", dtype_name(t.dtype()), " ",
                  shape_str(t.shape()), " what it sent as ", dtype_name(sent.dtype()), " ", shape_str(sent.shape()),
                  " (sender and receiver disagree on shape or dtype)");
    NoGradGuard guard;
    t.copy_(sent.reshape(t.shape()));
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<ProcessGroup> split(int color, int) override {
    if (color < 0) return nullptr;
    return std::make_shared<LocalGroup>(name_ + "/split(color=" + std::to_string(color) + ")");
  }
  Traffic traffic() const override { return traffic_.get(1); }
  void reset_traffic() override { traffic_.reset(); }

 private:
  std::string name_;
  TrafficCounter traffic_;
  std::mutex mu_;
  std::map<int, std::deque<Tensor>> sent_;  // sends to self not yet received, by tag
};

}  // namespace

ProcessGroupPtr make_local_group() { return std::make_shared<LocalGroup>("world"); }

}  // namespace braid::distributed::detail
