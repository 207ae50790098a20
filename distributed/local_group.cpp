// The world of one: a real process group whose collectives are identities, so that every model,
// test and the training program run unchanged without a launcher.
#include "distributed/internal.h"
#include "braid/ops.h"

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
  WorkPtr isend(const Tensor& t, int dst, int) override {
    check_collective_tensor(t, "isend");
    check_peer(dst, 1, "isend");
    throw DistributedError("isend: a world of one has no peer to send to (launch with mpiexec -n N)");
  }
  WorkPtr irecv(Tensor t, int src, int) override {
    check_collective_tensor(t, "irecv");
    check_peer(src, 1, "irecv");
    throw DistributedError("irecv: a world of one has no peer to receive from (launch with mpiexec -n N)");
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
};

}  // namespace

ProcessGroupPtr make_local_group() { return std::make_shared<LocalGroup>("world"); }

}  // namespace braid::distributed::detail
