// Device tensors through a process group that moves host memory (MPI): each operation goes to the
// device's native group where there is one (NCCL), or else copies its tensor to the host, runs
// there, and copies the result back when the work completes.
#include <array>
#include <map>
#include <mutex>

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
// staging for its own device where it is available. The host copy is page-locked where the device
// offers it (empty_pinned; Note [Pinned host memory] for CUDA), so both copies run at the copy
// engine's speed; a receive's copy is not filled from the device, since the transfer overwrites it.
Tensor to_host(const Tensor& t, bool fill = true) {
  NoGradGuard guard;
  Tensor h = empty_pinned(t.shape(), t.dtype(), t.device());
  if (fill) h.copy_(t.detach());
  return h;
}

void write_back(const Tensor& host, Tensor& dst) {
  NoGradGuard guard;
  dst.copy_(host);
}

// Note [Native device groups]
// A device may have a transport of its own that moves its tensors without the host: NCCL for CUDA.
// Its backend module registers a factory when it loads (register_device_group; libbraid_cuda.so
// registers NCCL's). The first collective on a tensor of that device makes the native group over
// the host group's ranks (a collective act: every rank reaches it at the same call, since
// collectives are called in the same order everywhere), and from then on that device's
// collectives go to it. Where no factory is registered, or it declines (two ranks share a GPU, or
// BRAID_NCCL=0), the device's tensors are staged. Point-to-point transfers cannot make a group:
// only two ranks take part, so nothing collective may happen at them. They go to the device's
// point-to-point transport instead (register_device_p2p; NCCL's, Note [NCCL point-to-point] in
// nccl_p2p.cpp), which each rank makes alone on its first transfer of a device tensor and which
// sets up each ordered pair of ranks lazily; where there is none (BRAID_NCCL=0, BRAID_NCCL_P2P=0,
// or a build without NCCL) the transfers are staged, and the transport itself stages the pairs
// whose two ranks share a GPU. The host group's tag kDeviceP2PTag is kept for the transport's own
// messages.
std::mutex g_factories_mu;
std::array<DeviceGroupFactory, 3> g_factories{};
std::array<DeviceP2PFactory, 3> g_p2p_factories{};

DeviceGroupFactory factory_for(DeviceType type) {
  std::lock_guard<std::mutex> lock(g_factories_mu);
  return g_factories[static_cast<size_t>(type)];
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
  StagedGroup(ProcessGroupPtr inner, bool route) : inner_(std::move(inner)), route_(route) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  int world_rank(int r) const override { return inner_->world_rank(r); }

  WorkPtr all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    traffic_.add(&Traffic::all_reduce, t);
    if (on_host(t)) return inner_->all_reduce_async(std::move(t), op, options);
    if (ProcessGroup* g = native(t)) return g->all_reduce_async(std::move(t), op, options);
    check_collective_tensor(t, "all_reduce");
    Tensor h = to_host(t);
    return std::make_shared<StagedWork>(inner_->all_reduce_async(h, op, options), h, t);
  }
  void all_reduce(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    traffic_.add(&Traffic::all_reduce, t);
    if (on_host(t)) return inner_->all_reduce(std::move(t), op, options);
    if (ProcessGroup* g = native(t)) return g->all_reduce(std::move(t), op, options);
    check_collective_tensor(t, "all_reduce");
    Tensor h = to_host(t);
    inner_->all_reduce(h, op, options);
    write_back(h, t);
  }
  void broadcast(Tensor t, int root) override {
    traffic_.add(&Traffic::broadcast, t);
    if (on_host(t)) return inner_->broadcast(std::move(t), root);
    if (ProcessGroup* g = native(t)) return g->broadcast(std::move(t), root);
    check_collective_tensor(t, "broadcast");
    Tensor h = to_host(t);
    inner_->broadcast(h, root);
    write_back(h, t);
  }
  Tensor all_gather(const Tensor& t) override {
    traffic_.add(&Traffic::all_gather, t, size());
    if (on_host(t)) return inner_->all_gather(t);
    if (ProcessGroup* g = native(t)) return g->all_gather(t);
    check_collective_tensor(t, "all_gather");
    return inner_->all_gather(to_host(t)).to(t.device());
  }
  Tensor reduce_scatter(const Tensor& t, ReduceOp op) override {
    traffic_.add(&Traffic::reduce_scatter, t);
    if (on_host(t)) return inner_->reduce_scatter(t, op);
    if (ProcessGroup* g = native(t)) return g->reduce_scatter(t, op);
    check_collective_tensor(t, "reduce_scatter");
    return inner_->reduce_scatter(to_host(t), op).to(t.device());
  }
  WorkPtr reduce_scatter_inplace_async(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    traffic_.add(&Traffic::reduce_scatter, t);
    if (on_host(t)) return inner_->reduce_scatter_inplace_async(std::move(t), op, options);
    if (ProcessGroup* g = native(t)) return g->reduce_scatter_inplace_async(std::move(t), op, options);
    check_collective_tensor(t, "reduce_scatter_inplace");
    Tensor h = to_host(t);
    return std::make_shared<StagedWork>(inner_->reduce_scatter_inplace_async(h, op, options), h, t);
  }
  WorkPtr all_gather_inplace_async(Tensor t) override {
    traffic_.add(&Traffic::all_gather, t);
    if (on_host(t)) return inner_->all_gather_inplace_async(std::move(t));
    if (ProcessGroup* g = native(t)) return g->all_gather_inplace_async(std::move(t));
    check_collective_tensor(t, "all_gather_inplace");
    Tensor h = to_host(t);
    return std::make_shared<StagedWork>(inner_->all_gather_inplace_async(h), h, t);
  }
  void barrier() override { inner_->barrier(); }
  WorkPtr isend(const Tensor& t, int dst, int tag) override {
    check_tag(tag, "isend");
    traffic_.add(&Traffic::send, t);
    if (on_host(t)) return inner_->isend(t, dst, tag);
    check_collective_tensor(t, "isend");
    check_peer(dst, size(), "isend");
    if (DeviceP2P* p = p2p(t)) return p->isend(t, dst, tag);
    return staged_isend(*inner_, t, dst, tag);
  }
  WorkPtr irecv(Tensor t, int src, int tag) override {
    check_tag(tag, "irecv");
    traffic_.add(&Traffic::recv, t);
    if (on_host(t)) return inner_->irecv(std::move(t), src, tag);
    check_collective_tensor(t, "irecv");
    check_peer(src, size(), "irecv");
    if (DeviceP2P* p = p2p(t)) return p->irecv(std::move(t), src, tag);
    return staged_irecv(*inner_, std::move(t), src, tag);
  }
  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    ProcessGroupPtr child = inner_->split(color, key);
    return child ? std::make_shared<StagedGroup>(std::move(child), route_) : nullptr;
  }
  Traffic traffic() const override { return traffic_.get(size()); }
  void reset_traffic() override { traffic_.reset(); }

 private:
  static bool on_host(const Tensor& t) { return !t.defined() || t.device().is_cpu(); }

  /// The native group of t's device, made on first use; nullptr to stage t.
  ProcessGroup* native(const Tensor& t) {
    if (!route_) return nullptr;
    const Device d = t.device();
    const auto key = std::make_pair(static_cast<int>(d.type), d.index);
    auto it = natives_.find(key);
    if (it == natives_.end()) it = natives_.emplace(key, make_native_group(inner_, d)).first;
    return it->second.get();
  }

  /// The point-to-point transport of t's device, made on first use (by this rank alone); nullptr
  /// to stage t.
  DeviceP2P* p2p(const Tensor& t) {
    if (!route_) return nullptr;
    const Device d = t.device();
    const auto key = std::make_pair(static_cast<int>(d.type), d.index);
    std::lock_guard<std::mutex> lock(p2p_mu_);
    auto it = p2ps_.find(key);
    if (it == p2ps_.end()) it = p2ps_.emplace(key, make_device_p2p(inner_, d)).first;
    return it->second.get();
  }

  static void check_tag(int tag, const char* op) {
    BRAID_CHECK(tag >= 0 && tag < kDeviceP2PTag, op, ": tag must be in [0, ", kDeviceP2PTag, "), got ", tag);
  }

  ProcessGroupPtr inner_;
  bool route_;
  std::map<std::pair<int, int>, ProcessGroupPtr> natives_;  // by (device type, index); null: staged
  std::mutex p2p_mu_;
  std::map<std::pair<int, int>, std::shared_ptr<DeviceP2P>> p2ps_;  // likewise
  TrafficCounter traffic_;
};

}  // namespace

void register_device_group(DeviceType type, DeviceGroupFactory factory) {
  std::lock_guard<std::mutex> lock(g_factories_mu);
  g_factories[static_cast<size_t>(type)] = factory;
}

void register_device_p2p(DeviceType type, DeviceP2PFactory factory) {
  std::lock_guard<std::mutex> lock(g_factories_mu);
  g_p2p_factories[static_cast<size_t>(type)] = factory;
}

std::shared_ptr<DeviceP2P> make_device_p2p(const ProcessGroupPtr& host_group, const Device& device) {
  DeviceP2PFactory f = nullptr;
  if (!device.is_cpu()) {
    std::lock_guard<std::mutex> lock(g_factories_mu);
    f = g_p2p_factories[static_cast<size_t>(device.type)];
  }
  return f ? f(host_group, device) : nullptr;
}

WorkPtr staged_isend(ProcessGroup& host, const Tensor& t, int dst, int tag) {
  Tensor h = to_host(t);
  return std::make_shared<StagedWork>(host.isend(h, dst, tag), h, Tensor());
}

WorkPtr staged_irecv(ProcessGroup& host, Tensor t, int src, int tag) {
  Tensor h = to_host(t, /*fill=*/false);
  return std::make_shared<StagedWork>(host.irecv(h, src, tag), h, std::move(t));
}

ProcessGroupPtr make_native_group(const ProcessGroupPtr& host_group, const Device& device) {
  DeviceGroupFactory f = device.is_cpu() ? nullptr : factory_for(device.type);
  return f ? f(host_group, device) : nullptr;
}

ProcessGroupPtr stage_device_tensors(ProcessGroupPtr host_group, bool route_native) {
  return std::make_shared<StagedGroup>(std::move(host_group), route_native);
}

}  // namespace braid::distributed::detail

namespace braid::distributed {

ProcessGroupPtr native_group(const ProcessGroupPtr& group, Device device) {
  BRAID_CHECK(group != nullptr, "native_group: the group is null");
  (void)empty({0}, kFloat32, device);  // loads the device's backend module, which registers its factory
  return detail::make_native_group(group, device);
}

}  // namespace braid::distributed
