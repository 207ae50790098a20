// Process groups: who takes part in a collective and how it runs. init() discovers the world the
// launcher made (mpiexec, srun, or none: a world of one), and a ProcessGroup over it offers the
// collectives that data-parallel and pipeline training need. A world of one is a real group whose
// collectives are identities, so every program runs without a launcher. No MPI header is seen here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/tensor.h"

namespace braid::distributed {

enum class ReduceOp { Sum, Average, Max, Min };
const char* reduce_op_name(ReduceOp op);

struct InitOptions {
  /// A collective or point-to-point transfer that has not completed after this many seconds ends
  /// with a DistributedError naming the op, its sequence number and the ranks that did not arrive.
  /// Default: $BRAID_TIMEOUT, else 600.
  double timeout_seconds = -1;
  /// Debug mode: before each collective the ranks compare what they are about to call (op, size,
  /// dtype, root) and stop with an error instead of hanging when they differ. Default:
  /// $BRAID_DISTRIBUTED_DEBUG=1.
  int debug = -1;
  /// Installs handlers so that an uncaught exception or a fatal signal on one rank prints which rank
  /// failed and why, then ends the whole job (MPI_Abort) instead of leaving the others waiting.
  bool handle_failures = true;
};

/// Where this process sits in the job.
struct WorldInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  ///< rank among the processes on this node
  int local_size = 1;
  std::string launcher;  ///< "mpiexec", "srun", "mpi" (another MPI launcher) or "none"
  std::string host;
};

/// Starts the distributed runtime (idempotent). Under mpiexec or srun this initialises MPI; run
/// plainly it makes a world of one. Throws DistributedError when the world is not what the launcher
/// promised (e.g. srun --mpi=none: N singletons while SLURM_NTASKS says N), saying how to launch.
const WorldInfo& init(const InitOptions& options = {});
bool is_initialized();
/// Stops the runtime's threads and finalises MPI. Called at exit if the program did not.
void finalize();
/// The world of this process (init() first).
const WorldInfo& world_info();
/// "rank 0 = pid 123 on node1, rank 1 = pid 124 on node1, ..." (gathered at init).
std::string rank_table();
/// Change the collective timeout and the debug mode after init (every rank should set the same).
void set_timeout(double seconds);
void set_debug(bool on);

/// Ends every rank of the job with code after printing message; for programs' top-level handlers.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

/// An operation in flight. wait() returns once it has completed and rethrows its error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

/// The precision floating-point data travels at. Compressed transfers add in the tensor's own
/// dtype and round every partial sum that is sent, so all ranks still end with identical values.
enum class WireDType { Native, Float16, BFloat16 };

struct AllReduceOptions {
  WireDType wire_dtype = WireDType::Native;
  /// Reduce in a fixed order that depends only on the size and the number of ranks, so that every
  /// run gives bitwise the same result on every rank.
  bool deterministic = false;
};

/// What a group has moved since it was made or last reset: calls and elements per kind of transfer.
/// elements counts whole buffers: all_reduce's and broadcast's tensor, all_gather's output (N times
/// its input), reduce_scatter's input, the in-place forms' flat tensor, a send's or receive's
/// tensor. bus_elements() turns that into what one rank sends with the bandwidth-optimal
/// algorithms (a ring): 2(N-1)/N of an all-reduce, (N-1)/N of a reduce-scatter or an all-gather,
/// all of a broadcast.
struct TrafficCount {
  int64_t calls = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
};
struct Traffic {
  int ranks = 1;
  TrafficCount all_reduce, broadcast, all_gather, reduce_scatter, send, recv;
  /// Elements one rank sends for the collectives above (not point-to-point), as described.
  double bus_elements() const;
};

/// A set of ranks that run collectives together. Collectives are called by every member in the
/// same order; tensors are contiguous, on any device (the MPI group stages device tensors through
/// host memory), and changed in place where the op says so.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "world", or "world/split(color=1)".
  virtual std::string name() const = 0;
  /// The world rank of the group's rank r.
  virtual int world_rank(int r) const = 0;

  /// Reduces t across the group into every member's t.
  virtual WorkPtr all_reduce_async(Tensor t, ReduceOp op = ReduceOp::Sum, const AllReduceOptions& options = {}) = 0;
  /// The blocking form; a group may run it on the calling thread when nothing is queued before it.
  virtual void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum, const AllReduceOptions& options = {}) {
    all_reduce_async(std::move(t), op, options)->wait();
  }
  /// Copies root's t into every member's t.
  virtual void broadcast(Tensor t, int root) = 0;
  /// Stacks every member's t along a new leading axis: shape [size, ...t.shape].
  virtual Tensor all_gather(const Tensor& t) = 0;
  /// Reduces t (leading axis divisible by size) and gives member r the r-th slice along axis 0.
  virtual Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  /// In place on a flat tensor of n elements cut into size() segments, segment r = [n*r/N,
  /// n*(r+1)/N) (any n, so uneven and prime sizes need no padding): afterwards member r's segment r
  /// holds the reduction over the group and the other segments hold partial sums. It is the first
  /// half of all_reduce with deterministic = true, in the same order of additions, so that
  /// reduce_scatter_inplace and then all_gather_inplace give all_reduce's bits (sharded data
  /// parallelism relies on it). The default runs a whole all_reduce.
  virtual WorkPtr reduce_scatter_inplace_async(Tensor flat, ReduceOp op = ReduceOp::Sum,
                                               const AllReduceOptions& options = {});
  /// In place on a flat tensor cut as above: every member's segment r becomes member r's.
  virtual WorkPtr all_gather_inplace_async(Tensor flat);
  virtual void barrier() = 0;
  /// Point-to-point; tag separates streams between the same pair. They do not take part in the
  /// collectives' order, so sends and receives may be interleaved freely (pipeline schedules).
  virtual WorkPtr isend(const Tensor& t, int dst, int tag = 0) = 0;
  virtual WorkPtr irecv(Tensor t, int src, int tag = 0) = 0;
  void send(const Tensor& t, int dst, int tag = 0) { isend(t, dst, tag)->wait(); }
  void recv(Tensor t, int src, int tag = 0) { irecv(std::move(t), src, tag)->wait(); }
  /// Sub-groups (MPI_Comm_split): members with the same color form a group, ordered by key then
  /// rank. Every member calls it; color < 0 returns nullptr (not in any sub-group).
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;

  /// The traffic this group has carried (world() and its splits count every call made on them).
  virtual Traffic traffic() const { return Traffic{size(), {}, {}, {}, {}, {}, {}}; }
  virtual void reset_traffic() {}
};
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

/// The group of every rank (init() on first use).
ProcessGroupPtr world();

// torch.distributed's free functions: each runs on group, or on world() when group is null, so
// that a program of one world never names a group.
/// This process's rank in group, or in the world; 0 before init() (nothing is started).
int get_rank(const ProcessGroupPtr& group = nullptr);
/// The number of ranks in group, or in the world; 1 before init().
int get_world_size(const ProcessGroupPtr& group = nullptr);
/// Reduces tensor in place across the ranks and returns it (ProcessGroup::all_reduce).
Tensor all_reduce(Tensor tensor, ReduceOp op = ReduceOp::Sum, const ProcessGroupPtr& group = nullptr);
/// Copies rank src's tensor into every rank's tensor in place and returns it.
Tensor broadcast(Tensor tensor, int src = 0, const ProcessGroupPtr& group = nullptr);
/// Every rank's tensor stacked along a new leading axis: shape [size, ...tensor.shape].
Tensor all_gather(const Tensor& tensor, const ProcessGroupPtr& group = nullptr);
/// Returns once every rank has called it.
void barrier(const ProcessGroupPtr& group = nullptr);

/// The group that moves device's tensors over group's ranks without the host (NCCL for CUDA), or
/// nullptr where there is none: the device has no such transport, braid was built without it,
/// two ranks share one GPU, or BRAID_NCCL=0. world() and its splits use it by themselves for every
/// collective on such tensors; this is for programs and tests that want it by name. Every rank of
/// group calls it, at the same point, like a collective.
ProcessGroupPtr native_group(const ProcessGroupPtr& group, Device device);

/// all_reduce as a differentiable op: returns the sum over the group of x, and backward sums the
/// gradients over the group (every rank's output depends on every rank's input).
Tensor all_reduce_sum(const Tensor& x, const ProcessGroupPtr& group);

}  // namespace braid::distributed
