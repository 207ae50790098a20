// What the distributed runtime's files share: the process-wide settings, the validation every
// group applies at its front door, and the registry that lets a rank answer a peer's question
// "how far have you got on group g?" when a collective times out.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "braid/distributed/process_group.h"
#include "braid/error.h"
#include "braid/nn/module.h"

namespace braid::distributed::detail {

struct Settings {
  std::atomic<double> timeout_seconds{600};
  std::atomic<bool> debug{false};
};
Settings& settings();

/// A collective as numbers, {op, dtype, numel, arg} (the group's own codes; op 0: none), so that
/// peers can compare calls and the control thread can describe one without allocating.
using CallSig = std::array<int64_t, 4>;

/// Progress of one group on this rank, readable by the control thread.
struct GroupProgress {
  uint64_t id = 0;
  std::string name;
  std::atomic<int64_t> called{0};     // collectives the program has called (the newest's number)
  std::atomic<int64_t> completed{0};  // collectives finished
  std::string (*describe)(const CallSig&) = nullptr;  // "all_reduce(sum, 10 float32)"
  std::mutex mu;                                       // guards called's update and the fields below
  CallSig latest{};                                    // the call numbered called
  CallSig running{};                                   // the call being executed now (op 0: none)
  int64_t running_seq = 0;
};
void register_group(GroupProgress* g);
void unregister_group(GroupProgress* g);

/// What this rank says about group id when a peer asks.
struct ProgressReport {
  int64_t called = -1, completed = -1;  // -1: this rank has no such group
  CallSig latest{};                     // its call number called
  std::string now;                      // the collectives it is executing, on any group ("" if none)
};
ProgressReport group_progress(uint64_t id);

/// 64-bit FNV-1a, for group ids and model fingerprints.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

/// Front-door checks shared by every group.
void check_collective_tensor(const Tensor& t, const char* op);
void check_peer(int peer, int size, const char* op);
void check_all_reduce(const Tensor& t, ReduceOp op, const AllReduceOptions& options);

/// "all_reduce(sum, 1000 float32)".
std::string describe_op(const char* op, const Tensor& t, const std::string& extra = "");

/// "parameter 'fc.weight' float32 [4, 3]".
std::string describe_tensor(const std::string& kind, const std::string& name, const Tensor& t);
/// Throws DistributedError naming the first difference when the ranks' lines (their models'
/// parameter and buffer descriptions) differ; who names the caller in the message.
void check_same_model(ProcessGroup& g, const std::vector<std::string>& lines, const char* who);
/// check_same_model over module's parameters and buffers, then rank 0's values to every rank.
void check_and_broadcast_model(nn::Module& module, ProcessGroup& group, bool broadcast_buffers, const char* who);
/// Gradient buckets of about cap_mb megabytes (0: one per parameter), never mixing dtypes or
/// devices, filled in reverse registration order (backward's order): indices into params, each
/// bucket in its filling order.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<Tensor>& params, double cap_mb);

/// The counts behind ProcessGroup::traffic() (thread-safe: backward's hooks call collectives too).
class TrafficCounter {
 public:
  /// One call of kind on t, counted as factor times t's elements.
  void add(TrafficCount Traffic::*kind, const Tensor& t, int64_t factor = 1);
  Traffic get(int ranks) const;
  void reset();

 private:
  mutable std::mutex mu_;
  Traffic counts_;
};

/// host_group for tensors on any device: a tensor that is not on the CPU goes to its device's native
/// group where there is one (route_native; Note [Native device groups]), else travels as a host
/// copy (Note [Staging device tensors] in staged_group.cpp).
ProcessGroupPtr stage_device_tensors(ProcessGroupPtr host_group, bool route_native = true);

/// Makes the group that moves device's tensors natively over host_group's ranks, or returns nullptr
/// where that transport cannot serve them (Note [Native device groups] in staged_group.cpp). Called
/// by every rank of host_group at the same point, like a collective.
using DeviceGroupFactory = ProcessGroupPtr (*)(const ProcessGroupPtr& host_group, const Device& device);
/// Registered by a device's backend module when it loads (libbraid_cuda.so: NCCL).
void register_device_group(DeviceType type, DeviceGroupFactory factory);
/// The registered factory's group for device, or nullptr (none registered, or it declined).
ProcessGroupPtr make_native_group(const ProcessGroupPtr& host_group, const Device& device);

/// The tag of the host group that a device's point-to-point transport keeps for its own messages
/// (Note [NCCL point-to-point] in nccl_p2p.cpp): programs' tags are below it.
constexpr int kDeviceP2PTag = 32767;

/// A device's own point-to-point transport over a host group's ranks (NCCL for CUDA). Unlike a
/// native group it is made by one rank alone, on its first transfer of a device tensor, and it
/// sets up each pair of ranks when they first exchange a tensor.
class DeviceP2P {
 public:
  virtual ~DeviceP2P() = default;
  virtual WorkPtr isend(const Tensor& t, int dst, int tag) = 0;
  virtual WorkPtr irecv(Tensor t, int src, int tag) = 0;
};
using DeviceP2PFactory = std::shared_ptr<DeviceP2P> (*)(const ProcessGroupPtr& host_group, const Device& device);
void register_device_p2p(DeviceType type, DeviceP2PFactory factory);
/// The registered factory's transport for device, or nullptr (none registered, or it declined).
std::shared_ptr<DeviceP2P> make_device_p2p(const ProcessGroupPtr& host_group, const Device& device);
/// A transfer of a device tensor staged through host memory over host (Note [Staging device
/// tensors]): what the groups do where the device has no transport of its own.
WorkPtr staged_isend(ProcessGroup& host, const Tensor& t, int dst, int tag);
WorkPtr staged_irecv(ProcessGroup& host, Tensor t, int src, int tag);

/// Registers the NCCL group and NCCL's point-to-point transport for CUDA tensors
/// (distributed/nccl_group.cpp and nccl_p2p.cpp, in libbraid_cuda.so).
void register_nccl();

/// The world of one: every collective is an identity (Average divides by one).
ProcessGroupPtr make_local_group();

#ifdef BRAID_DISTRIBUTED_MPI
/// The MPI world (MPI is initialised by then).
ProcessGroupPtr make_mpi_world();
void stop_mpi_groups();
#endif

}  // namespace braid::distributed::detail
