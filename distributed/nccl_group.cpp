// The NCCL process group: collectives on CUDA tensors, run by NCCL on a communication stream of
// the group's own and watched against the job's deadline. Built into libbraid_cuda.so (it links
// NCCL and the CUDA runtime) and registered as the native group of CUDA tensors when the CUDA
// backend loads; the world's group routes CUDA tensors to it (Note [Native device groups] in
// staged_group.cpp). MPI stays the control plane: the NCCL id travels over the host group.
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/nccl_internal.h"
#include "core/knob_read.h"

namespace braid::distributed::detail {

namespace {

namespace cuda = ::braid::detail::cuda;
using Clock = std::chrono::steady_clock;

// Note [The NCCL group]
// Streams. Every collective runs on the group's communication stream, which first waits (an
// event) for the work already queued on the device's compute stream, so that it reads what the
// program wrote; its completion is another event. Work::wait() returns once that event has
// completed, so what the program queues afterwards reads the result. Between the two events the
// compute stream runs on: the all-reduce of one DistributedDataParallel bucket overlaps the
// backward of the layers before it, as in PyTorch's and llm.c's use of NCCL. The tensors an
// operation reads or writes are kept alive until its event completes, since braid's device memory
// is reused in the compute stream's order (runtime.h), which knows nothing of this stream.
//
// Deadlines. Communicators are non-blocking (ncclConfig_t.blocking = 0): no NCCL call waits on a
// peer, and a watchdog thread polls ncclCommGetAsyncError and each pending operation's event. An
// asynchronous error, or an operation still pending BRAID_TIMEOUT seconds after it was queued,
// aborts the communicator (ncclCommAbort, which also ends the NCCL kernels the stream is stuck in)
// and fails the group with the MPI path's message: rank, group, op, sequence number. The program
// sees it as a DistributedError from the next wait() or collective, and its failure handlers end the
// job as they do for MPI; an error that nobody has seen within BRAID_NCCL_ABORT_GRACE seconds
// (default 30: the host is stuck elsewhere) ends the job from the watchdog (abort_job).
//
// What NCCL does not do is done with its collectives: the deterministic mode gathers every rank's
// tensor and adds them in rank order (p times the memory of the tensor, bitwise the same on every
// rank and every run), and a compressed wire casts to float16/bfloat16, reduces in that dtype and
// casts back (as Horovod's compression does; the MPI path instead adds in the tensor's own dtype).
// Point-to-point transfers go to NCCL's point-to-point transport (Note [NCCL point-to-point] in
// nccl_p2p.cpp), or are staged through the host group where it is off.

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

double abort_grace_seconds() { return braid::detail::knob_number("BRAID_NCCL_ABORT_GRACE"); }

/// An operation the watchdog waits for: its event, what it keeps alive, and how to name it.
struct Pending {
  std::shared_ptr<Event> done;
  std::vector<Tensor> keep;
  std::string what;  // "all_reduce(sum, 1000 float32) #12"
  Clock::time_point queued;
};

class NcclGroup;

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclGroup> group, std::shared_ptr<Event> done, std::function<void()> after)
      : group_(std::move(group)), done_(std::move(done)), after_(std::move(after)) {}
  void wait() override;
  bool is_completed() override { return done_->done(); }

 private:
  std::shared_ptr<NcclGroup> group_;
  std::shared_ptr<Event> done_;
  std::function<void()> after_;  // on the host once done: the write-back of a compressed all-reduce
};

class NcclGroup final : public ProcessGroup, public std::enable_shared_from_this<NcclGroup> {
 public:
  NcclGroup(const ProcessGroupPtr& host, Device device) : host_(host), device_(device) {
    cuda::DeviceGuard guard(device.index);
    where_ = ::braid::detail::cat("braid: rank ", host->world_rank(host->rank()), " (rank ", host->rank(),
                                  " of group '", host->name(), "', NCCL on ", device.str(), ")");
    ncclUniqueId id;
    if (host->rank() == 0) check_nccl(ncclGetUniqueId(&id), where_, "ncclGetUniqueId");
    Tensor bytes = zeros({static_cast<int64_t>(sizeof id)}, kUInt8, Device::cpu());
    if (host->rank() == 0) std::memcpy(bytes.raw_data(), &id, sizeof id);
    host->broadcast(bytes, 0);
    std::memcpy(&id, bytes.raw_data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, host->size(), id, host->rank(), &config), where_,
               "ncclCommInitRankConfig");
    settle("creating the communicator");
    int lo = 0, hi = 0;
    cuda::check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "nccl", "cudaDeviceGetStreamPriorityRange");
    cuda::check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi), "nccl",
                "cudaStreamCreateWithPriority");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclGroup() override {
    {
      // What is still queued completes (or the watchdog fails it at its deadline) before the
      // communicator goes.
      std::unique_lock<std::mutex> lock(mu_);
      while (!pending_.empty() && failed_.empty()) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
      }
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cuda::DeviceGuard guard(device_.index);
    if (failed_.empty()) {
      cudaStreamSynchronize(stream_);
      ncclCommFinalize(comm_);
      ncclResult_t st = ncclInProgress;
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommDestroy(comm_);
    }
    pending_.clear();
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name() + " (NCCL)"; }
  int world_rank(int r) const override { return host_->world_rank(r); }

  WorkPtr all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    check_all_reduce(t, op, options);
    check_device(t, "all_reduce");
    BRAID_CHECK_T(TypeError, t.dtype() != DType::Bool || op == ReduceOp::Max || op == ReduceOp::Min,
                  "all_reduce: ", reduce_op_name(op), " of a bool tensor; use max (any) or min (all), or cast");
    const std::string what = describe_op("all_reduce", t, reduce_op_name(op));
    if (options.deterministic && size() > 1) return deterministic_all_reduce(t, op);
    if (options.wire_dtype != WireDType::Native && t.dtype() != DType::Float16 && t.dtype() != DType::BFloat16) {
      NoGradGuard no_grad;
      Tensor wire = t.to(options.wire_dtype == WireDType::Float16 ? kFloat16 : kBFloat16);
      return enqueue(what, {wire}, [&](cudaStream_t s) {
        return ncclAllReduce(ptr(wire), ptr(wire), wire.numel(), nccl_dtype(wire.dtype(), "all_reduce"), nccl_op(op),
                             comm_, s);
      }, [t, wire]() mutable {
        NoGradGuard guard;
        t.copy_(wire);
      });
    }
    return enqueue(what, {t}, [&](cudaStream_t s) {
      return ncclAllReduce(ptr(t), ptr(t), t.numel(), nccl_dtype(t.dtype(), "all_reduce"), nccl_op(op), comm_, s);
    });
  }

  void broadcast(Tensor t, int root) override {
    check_collective_tensor(t, "broadcast");
    check_peer(root, size(), "broadcast");
    check_device(t, "broadcast");
    enqueue(describe_op("broadcast", t, "root " + std::to_string(root)), {t}, [&](cudaStream_t s) {
      return ncclBroadcast(ptr(t), ptr(t), t.numel(), nccl_dtype(t.dtype(), "broadcast"), root, comm_, s);
    })->wait();
  }

  Tensor all_gather(const Tensor& t) override {
    check_collective_tensor(t, "all_gather");
    check_device(t, "all_gather");
    Shape shape = t.shape();
    shape.insert(shape.begin(), size());
    Tensor out = empty(shape, t.dtype(), t.device());
    enqueue(describe_op("all_gather", t), {t, out}, [&](cudaStream_t s) {
      return ncclAllGather(ptr(t), ptr(out), t.numel(), nccl_dtype(t.dtype(), "all_gather"), comm_, s);
    })->wait();
    return out;
  }

  Tensor reduce_scatter(const Tensor& t, ReduceOp op) override {
    check_collective_tensor(t, "reduce_scatter");
    check_device(t, "reduce_scatter");
    BRAID_CHECK(t.dim() >= 1 && t.shape()[0] % size() == 0, "reduce_scatter: the leading axis of shape ",
                shape_str(t.shape()), " does not divide into ", size(), " ranks");
    BRAID_CHECK_T(TypeError, t.dtype() != DType::Bool, "reduce_scatter: a bool tensor; cast it first");
    Shape shape = t.shape();
    shape[0] /= size();
    Tensor out = empty(shape, t.dtype(), t.device());
    enqueue(describe_op("reduce_scatter", t, reduce_op_name(op)), {t, out}, [&](cudaStream_t s) {
      return ncclReduceScatter(ptr(t), ptr(out), out.numel(), nccl_dtype(t.dtype(), "reduce_scatter"), nccl_op(op),
                               comm_, s);
    })->wait();
    return out;
  }

  /// Every rank's device work queued before the barrier has reached the communication stream.
  void barrier() override {
    Tensor one = ones({1}, kFloat32, device_);
    all_reduce_async(one, ReduceOp::Sum, {})->wait();
  }

  WorkPtr isend(const Tensor& t, int dst, int tag) override {
    check_collective_tensor(t, "isend");
    check_peer(dst, size(), "isend");
    check_device(t, "isend");
    if (DeviceP2P* p = p2p()) return p->isend(t, dst, tag);
    return staged_isend(*host_, t, dst, tag);
  }
  WorkPtr irecv(Tensor t, int src, int tag) override {
    check_collective_tensor(t, "irecv");
    check_peer(src, size(), "irecv");
    check_device(t, "irecv");
    if (DeviceP2P* p = p2p()) return p->irecv(std::move(t), src, tag);
    return staged_irecv(*host_, std::move(t), src, tag);
  }
  std::shared_ptr<ProcessGroup> split(int, int) override { throw_not_native("split"); }

  /// Throws the group's failure, if any, marking it seen.
  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) return;
    seen_ = true;
    throw DistributedError(failed_);
  }

 private:
  static void* ptr(const Tensor& t) { return reinterpret_cast<void*>(t.data_ptr()); }

  /// NCCL's point-to-point transport over the host group (shared with the routing group's), or
  /// nullptr where BRAID_NCCL_P2P=0.
  DeviceP2P* p2p() {
    std::call_once(p2p_once_, [&] { p2p_ = make_nccl_p2p(host_, device_); });
    return p2p_.get();
  }

  [[noreturn]] void throw_not_native(const char* op) const {
    throw DistributedError(::braid::detail::cat(where_, ": ", op, " is not an NCCL operation of braid's; the "
                                                "routing group stages it through MPI (internal error)"));
  }

  void check_device(const Tensor& t, const char* op) const {
    BRAID_CHECK(t.device() == device_, op, ": a tensor on ", t.device().str(), " given to the NCCL group of ",
                  device_.str(), "; a group serves one GPU per rank");
  }

  /// Waits for a non-blocking communicator to finish the call just made (NCCL may return before it
  /// has), against the deadline.
  void settle(const char* what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(settings().timeout_seconds));
    ncclResult_t st = ncclInProgress;
    while (true) {
      check_nccl(ncclCommGetAsyncError(comm_, &st), where_, "ncclCommGetAsyncError");
      if (st != ncclInProgress) break;
      if (Clock::now() > deadline) {
        fail(::braid::detail::cat(where_, ": ", what, " did not complete within ", settings().timeout_seconds,
                                  " s; a peer is dead or hung. (BRAID_TIMEOUT sets the limit.)"));
        throw_if_failed();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check_nccl(st, where_, what);
  }

  template <typename Call>
  WorkPtr enqueue(const std::string& op, std::vector<Tensor> keep, Call&& call, std::function<void()> after = {}) {
    throw_if_failed();
    cuda::DeviceGuard guard(device_.index);
    const int64_t seq = ++seq_;
    const std::string what = ::braid::detail::cat(op, " #", seq);
    Event ready(device_.index);
    cuda::check(cudaEventRecord(ready.event, cuda::stream(device_.index)), "nccl", "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(stream_, ready.event, 0), "nccl", "cudaStreamWaitEvent");
    {
      std::lock_guard<std::mutex> lock(call_mu_);  // one NCCL call at a time on a communicator
      check_nccl(call(stream_), where_, what.c_str());
      settle(what.c_str());
    }
    auto done = std::make_shared<Event>(device_.index);
    cuda::check(cudaEventRecord(done->event, stream_), "nccl", "cudaEventRecord");
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(Pending{done, std::move(keep), what, Clock::now()});
    }
    cv_.notify_all();
    return std::make_shared<NcclWork>(shared_from_this(), std::move(done), std::move(after));
  }

  // Note [The NCCL group]: every rank adds the gathered tensors in rank order.
  WorkPtr deterministic_all_reduce(const Tensor& t, ReduceOp op) {
    Tensor all = all_gather(t);  // waits
    NoGradGuard no_grad;
    Tensor acc = all.select(0, 0).clone();
    for (int r = 1; r < size(); ++r) {
      Tensor x = all.select(0, r);
      acc = op == ReduceOp::Max ? maximum(acc, x) : op == ReduceOp::Min ? minimum(acc, x) : add(acc, x);
    }
    if (op == ReduceOp::Average) acc = acc / static_cast<double>(size());
    Tensor dst = t;
    dst.copy_(acc);
    // A work whose event follows the copy on the compute stream, like every other.
    return enqueue(describe_op("all_reduce", t, "deterministic"), {t}, [&](cudaStream_t) { return ncclSuccess; });
  }

  void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.empty()) return;
      failed_ = message;
      failed_at_ = Clock::now();
    }
    ncclCommAbort(comm_);
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }

  void watch() {
    cuda::DeviceGuard guard(device_.index);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 200 : 2));
      if (stop_) break;
      if (!failed_.empty()) {
        if (!seen_ && Clock::now() - failed_at_ > std::chrono::duration<double>(abort_grace_seconds())) {
          lock.unlock();
          abort_job(failed_ + " (the program did not collect this error; the watchdog ends the job)");
        }
        continue;
      }
      std::vector<Pending> finished;  // released outside the lock: freeing device memory takes the pool's
      while (!pending_.empty() && pending_.front().done->done()) {
        finished.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
      if (!finished.empty()) {
        lock.unlock();
        finished.clear();
        lock.lock();
      }
      std::string error;
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
        error = ::braid::detail::cat(where_, ": NCCL reported ", ncclGetErrorString(st), " (",
                                     ncclGetLastError(comm_), ")",
                                     pending_.empty() ? "" : " during " + pending_.front().what);
      else if (!pending_.empty() &&
               Clock::now() - pending_.front().queued > std::chrono::duration<double>(settings().timeout_seconds))
        error = ::braid::detail::cat(where_, ": ", pending_.front().what, " did not complete within ",
                                     settings().timeout_seconds,
                                     " s; a peer is dead, hung, or its schedule differs, or the device is "
                                     "stuck in a kernel. (BRAID_TIMEOUT sets the limit.)");
      if (!error.empty()) {
        lock.unlock();
        fail(error);
        lock.lock();
      }
    }
  }

  friend class NcclWork;
  ProcessGroupPtr host_;
  Device device_;
  std::string where_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int64_t seq_ = 0;
  std::mutex call_mu_;
  std::mutex mu_;  // guards what follows, shared with the watchdog
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::string failed_;
  Clock::time_point failed_at_;
  bool seen_ = false;
  bool stop_ = false;
  std::thread watchdog_;
  std::once_flag p2p_once_;
  std::shared_ptr<DeviceP2P> p2p_;
};

void NcclWork::wait() {
  const auto start = Clock::now();
  while (!done_->done()) {
    group_->throw_if_failed();
    if (Clock::now() - start < std::chrono::milliseconds(1)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  group_->throw_if_failed();
  if (after_) {
    after_();
    after_ = nullptr;
  }
}

/// gpu_identity, padded to a fixed width.
Tensor gpu_identity_tensor(const Device& device) {
  const std::string id = gpu_identity(device);
  Tensor t = zeros({128}, kUInt8, Device::cpu());
  std::memcpy(t.raw_data(), id.data(), std::min<size_t>(id.size(), 127));
  return t;
}

// The factory the CUDA backend registers: nullptr, and every CUDA tensor staged through MPI, where
// two ranks of the group would share one GPU, which NCCL refuses ("Duplicate GPU detected"), or
// where BRAID_NCCL=0. Every rank gathers the same identities, so every rank makes the same choice.
ProcessGroupPtr make_nccl_group(const ProcessGroupPtr& host, const Device& device) {
  if (!braid::detail::knob_flag("BRAID_NCCL")) return nullptr;  // every rank has the same environment
  Tensor ids = host->all_gather(gpu_identity_tensor(device));
  const auto* p = static_cast<const char*>(ids.raw_data());
  for (int a = 0; a < host->size(); ++a)
    for (int b = a + 1; b < host->size(); ++b)
      if (std::memcmp(p + 128 * a, p + 128 * b, 128) == 0) {
        if (host->rank() == 0)
          std::fprintf(stderr,
                       "braid: ranks %d and %d of group '%s' share GPU %s; NCCL needs one GPU per rank, so "
                       "CUDA tensors travel through MPI, staged in host memory\n",
                       a, b, host->name().c_str(), p + 128 * a);
        return nullptr;
      }
  return std::make_shared<NcclGroup>(host, device);
}

}  // namespace

void register_nccl() {
  register_device_group(DeviceType::CUDA, &make_nccl_group);
  register_device_p2p(DeviceType::CUDA, &make_nccl_p2p);
}

}  // namespace braid::distributed::detail
