// Device tensors through a process group that moves host memory (MPI): each operation copies its
// tensor to the host, runs there, and copies the result back when the work completes.
#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed::detail {

namespace {

// Note [Staging device tensors]
// MPI reads and writes host memory, so a tensor on another device (a GPU, or the shadow test device)
// travels as a host copy: the operation runs on the copy and, for the operations that write their
// tensor (all_reduce, broadcast, irecv), the copy is written back once the work has completed. CPU
// tensors pass straight through. This keeps every collective working for every device, which
// DistributedDataParallel and the pipeline rely on; a device-native transport (NCCL) replaces the
// staging for its own device where it is available.
Tensor to_host(const Tensor& t) {
  NoGradGuard guard;
  return t.detach().cpu();
}

void write_back(const Tensor& host, Tensor& dst) {
  NoGradGuard guard;
  dst.copy_(host);
}

class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, Tensor host, Tensor dst) : inner_(std::move(inner)), host_(std::move(host)), dst_(std::move(dst)) {}
  void wait() override {
    inner_->wait();
    if (dst_.defined()) write_back(host_, dst_);
    dst_ = Tensor();
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  Tensor host_;  // kept alive until the transfer is done
  Tensor dst_;   // written from host_ on wait (undefined for a send, or once written)
};

class StagedGroup final : public ProcessGroup {
 public:
  explicit StagedGroup(ProcessGroupPtr inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  int world_rank(int r) const override { return inner_->world_rank(r); }

  WorkPtr all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    if (on_host(t)) return inner_->all_reduce_async(std::move(t), op, options);
    check_collective_tensor(t, "all_reduce");
    Tensor h = to_host(t);
    return std::make_shared<StagedWork>(inner_->all_reduce_async(h, op, options), h, t);
  }
  void all_reduce(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    if (on_host(t)) return inner_->all_reduce(std::move(t), op, options);
    check_collective_tensor(t, "all_reduce");
    Tensor h = to_host(t);
    inner_->all_reduce(h, op, options);
    write_back(h, t);
  }
  void broadcast(Tensor t, int root) override {
    if (on_host(t)) return inner_->broadcast(std::move(t), root);
    check_collective_tensor(t, "broadcast");
    Tensor h = to_host(t);
    inner_->broadcast(h, root);
    write_back(h, t);
  }
  Tensor all_gather(const Tensor& t) override {
    if (on_host(t)) return inner_->all_gather(t);
    check_collective_tensor(t, "all_gather");
    return inner_->all_gather(to_host(t)).to(t.device());
  }
  Tensor reduce_scatter(const Tensor& t, ReduceOp op) override {
    if (on_host(t)) return inner_->reduce_scatter(t, op);
    check_collective_tensor(t, "reduce_scatter");
    return inner_->reduce_scatter(to_host(t), op).to(t.device());
  }
  void barrier() override { inner_->barrier(); }
  WorkPtr isend(const Tensor& t, int dst, int tag) override {
    if (on_host(t)) return inner_->isend(t, dst, tag);
    check_collective_tensor(t, "isend");
    Tensor h = to_host(t);
    return std::make_shared<StagedWork>(inner_->isend(h, dst, tag), h, Tensor());
  }
  WorkPtr irecv(Tensor t, int src, int tag) override {
    if (on_host(t)) return inner_->irecv(std::move(t), src, tag);
    check_collective_tensor(t, "irecv");
    Tensor h = to_host(t);
    return std::make_shared<StagedWork>(inner_->irecv(h, src, tag), h, t);
  }
  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    ProcessGroupPtr child = inner_->split(color, key);
    return child ? std::make_shared<StagedGroup>(std::move(child)) : nullptr;
  }

 private:
  static bool on_host(const Tensor& t) { return !t.defined() || t.device().is_cpu(); }
  ProcessGroupPtr inner_;
};

}  // namespace

ProcessGroupPtr stage_device_tensors(ProcessGroupPtr host_group) {
  return std::make_shared<StagedGroup>(std::move(host_group));
}

}  // namespace braid::distributed::detail
