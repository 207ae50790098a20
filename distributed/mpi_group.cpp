// The MPI process group. Collectives run in call order on one worker thread per group, so that a
// bucket's all-reduce proceeds while the caller goes on with backward; point-to-point transfers are
// posted by the caller directly. Nothing here blocks inside MPI: requests are polled against the
// deadline (Note [Failing ranks end the job]).

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <sstream>
#include <thread>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"
#include "distributed/mpi_reduce.h"
#include "distributed/mpi_runtime.h"

namespace braid::distributed::detail {

namespace {

using Clock = std::chrono::steady_clock;

enum OpCode : int64_t {
  kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier, kSplit, kReduceScatterInplace, kAllGatherInplace
};

const char* op_name(int64_t code) {
  switch (code) {
    case kAllReduce: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kBarrier: return "barrier";
    case kSplit: return "split";
    case kReduceScatterInplace: return "reduce_scatter_inplace";
    case kAllGatherInplace: return "all_gather_inplace";
  }
  return "?";
}

/// "all_reduce(sum, 10 float32)", "broadcast(root 0, 3 float32)", "barrier()".
std::string describe_call(const CallSig& c) {
  const auto [op, dtype, numel, arg] = c;
  std::ostringstream os;
  os << op_name(op) << "(";
  if (op == kAllReduce || op == kReduceScatter) os << reduce_op_name(static_cast<ReduceOp>(arg)) << ", ";
  if (op == kBroadcast) os << "root " << arg << ", ";
  if (op == kSplit) os << "color " << arg;
  if (dtype >= 0) os << numel << " " << dtype_name(static_cast<DType>(dtype));
  os << ")";
  return os.str();
}

/// What a collective call is, as the debug mode compares it across ranks (Note [Collective
/// fingerprints]).
struct Signature {
  int64_t seq = 0, op = 0, dtype = -1, numel = 0, arg = 0;
  bool operator==(const Signature&) const = default;
  CallSig call() const { return {op, dtype, numel, arg}; }
  std::string str() const { return describe_call(call()); }
};

/// Yields for a short while, as a collective often completes within microseconds: sleeping on a
/// condition variable at once would add two thread wake-ups to every small collective.
template <typename Ready>
bool spin_briefly(Ready ready) {
  for (int i = 0; i < 256; ++i) {
    if (ready()) return true;
    std::this_thread::yield();
  }
  return ready();
}

class CollectiveWork : public Work {
 public:
  void wait() override {
    if (!spin_briefly([&] { return done_.load(std::memory_order_acquire); })) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return done_.load(); });
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override { return done_.load(std::memory_order_acquire); }
  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::move(e);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;  // written before done_ is set
};

struct Task {
  Signature sig;
  std::function<void(const Signature&)> run;
  std::shared_ptr<CollectiveWork> work;
};

/// Polls reqs until all complete; past the deadline, on_timeout() supplies the error message.
void wait_requests(std::vector<MPI_Request>& reqs, const std::function<std::string()>& on_timeout,
                   const char* what) {
  if (reqs.empty()) return;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(settings().timeout_seconds));
  while (true) {
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what);
    if (flag) return;
    const auto now = Clock::now();
    if (now > deadline) throw DistributedError(on_timeout());
    // Spin while a reply is likely soon (a small collective completes in about a microsecond),
    // then yield, then back off so that a waiting rank does not take the cores that backward, or
    // oversubscribed ranks, need.
    const auto waited = now - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(2)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class MpiGroup;
std::mutex g_groups_mu;
std::vector<MpiGroup*> g_groups;

class MpiGroup : public ProcessGroup {
 public:
  MpiGroup(MPI_Comm comm, std::string name, uint64_t id) : comm_(comm), name_(std::move(name)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    reducer_.init(comm_, rank_, size_);
    check_mpi(MPI_Comm_dup(comm_, &p2p_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN);
    MPI_Group g, wg;
    MPI_Comm_group(comm_, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    std::vector<int> mine(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) mine[static_cast<size_t>(i)] = i;
    world_ranks_.resize(static_cast<size_t>(size_));
    MPI_Group_translate_ranks(g, size_, mine.data(), wg, world_ranks_.data());
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    progress_.id = id;
    progress_.name = name_;
    progress_.describe = describe_call;
    register_group(&progress_);
    worker_ = std::thread([this] { work_loop(); });
    std::lock_guard<std::mutex> lock(g_groups_mu);
    g_groups.push_back(this);
  }

  ~MpiGroup() override {
    {
      std::lock_guard<std::mutex> lock(g_groups_mu);
      std::erase(g_groups, this);
    }
    shutdown();
  }

  /// Stops the worker and frees the communicators (before MPI_Finalize, or at destruction).
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    unregister_group(&progress_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&p2p_);
      MPI_Comm_free(&comm_);
    }
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  int world_rank(int r) const override {
    check_peer(r, size_, "world_rank");
    return world_ranks_[static_cast<size_t>(r)];
  }

  WorkPtr all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    check_all_reduce(t, op, options);
    Signature sig{0, kAllReduce, static_cast<int64_t>(t.dtype()), t.numel(), static_cast<int64_t>(op)};
    return submit(sig, [this, t, op, options](const Signature& s) { reducer_.all_reduce(t, op, options, waiter(s)); }, false);
  }

  void all_reduce(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    check_all_reduce(t, op, options);
    Signature sig{0, kAllReduce, static_cast<int64_t>(t.dtype()), t.numel(), static_cast<int64_t>(op)};
    submit(sig, [this, t, op, options](const Signature& s) { reducer_.all_reduce(t, op, options, waiter(s)); }, true)->wait();
  }

  void broadcast(Tensor t, int root) override {
    check_collective_tensor(t, "broadcast");
    check_peer(root, size_, "broadcast");
    Signature sig{0, kBroadcast, static_cast<int64_t>(t.dtype()), t.numel(), root};
    submit(sig, [this, t, root](const Signature& sig) {
      const int64_t bytes = t.numel() * t.element_size();
      std::vector<MPI_Request> reqs;
      for (int64_t off = 0; off < bytes; off += kMaxMessage) {
        MPI_Request r;
        check_mpi(MPI_Ibcast(static_cast<char*>(t.raw_data()) + off, static_cast<int>(std::min(kMaxMessage, bytes - off)),
                             MPI_BYTE, root, comm_, &r),
                  "MPI_Ibcast");
        reqs.push_back(r);
      }
      wait(reqs, sig);
    }, true)->wait();
  }

  Tensor all_gather(const Tensor& t) override {
    check_collective_tensor(t, "all_gather");
    const int64_t bytes = t.numel() * t.element_size();
    BRAID_CHECK(bytes < kMaxMessage, "all_gather: ", bytes, " bytes per rank is more than one MPI message holds (",
                kMaxMessage, "); gather slices");
    Shape shape = t.shape();
    shape.insert(shape.begin(), size_);
    Tensor out = empty(shape, t.dtype());
    Signature sig{0, kAllGather, static_cast<int64_t>(t.dtype()), t.numel(), 0};
    submit(sig, [this, t, out, bytes](const Signature& sig) {
      std::vector<MPI_Request> req(1);
      check_mpi(MPI_Iallgather(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, out.raw_data(), static_cast<int>(bytes),
                               MPI_BYTE, comm_, req.data()),
                "MPI_Iallgather");
      wait(req, sig);
    }, true)->wait();
    return out;
  }

  Tensor reduce_scatter(const Tensor& t, ReduceOp op) override {
    check_collective_tensor(t, "reduce_scatter");
    BRAID_CHECK(t.dim() >= 1 && t.size(0) % size_ == 0, "reduce_scatter: the leading axis of shape ",
                shape_str(t.shape()), " must divide into ", size_, " equal parts, one per rank");
    BRAID_CHECK_T(TypeError, mpi_type(t.dtype()) != MPI_DATATYPE_NULL && t.dtype() != DType::Bool,
                  "reduce_scatter: ", dtype_name(t.dtype()), " is not supported; cast to float32");
    BRAID_CHECK_T(TypeError, is_floating(t.dtype()) || op != ReduceOp::Average, "reduce_scatter: average of a ",
                  dtype_name(t.dtype()), " tensor; use sum");
    Shape shape = t.shape();
    shape[0] /= size_;
    Tensor out = empty(shape, t.dtype());
    Signature sig{0, kReduceScatter, static_cast<int64_t>(t.dtype()), t.numel(), static_cast<int64_t>(op)};
    submit(sig, [this, t, out, op](const Signature& sig) {
      BRAID_CHECK(out.numel() < kMaxMessage, "reduce_scatter: ", out.numel(), " elements per rank is too many for one "
                  "MPI message");
      std::vector<MPI_Request> req(1);
      check_mpi(MPI_Ireduce_scatter_block(t.raw_data(), out.raw_data(), static_cast<int>(out.numel()),
                                          mpi_type(t.dtype()), mpi_op(op), comm_, req.data()),
                "MPI_Ireduce_scatter_block");
      wait(req, sig);
      if (op == ReduceOp::Average) {
        NoGradGuard no_grad;
        Tensor(out).mul_(1.0 / size_);
      }
    }, true)->wait();
    return out;
  }

  void barrier() override {
    Signature sig{0, kBarrier, -1, 0, 0};
    submit(sig, [this](const Signature& sig) {
      std::vector<MPI_Request> req(1);
      check_mpi(MPI_Ibarrier(comm_, req.data()), "MPI_Ibarrier");
      wait(req, sig);
    }, true)->wait();
  }

  WorkPtr isend(const Tensor& t, int dst, int tag) override {
    check_collective_tensor(t, "isend");
    check_peer(dst, size_, "isend");
    return p2p(t, dst, tag, true);
  }

  WorkPtr irecv(Tensor t, int src, int tag) override {
    check_collective_tensor(t, "irecv");
    check_peer(src, size_, "irecv");
    return p2p(t, src, tag, false);
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    Signature sig{0, kSplit, -1, 0, 0};
    const int64_t index = ++splits_;
    MPI_Comm child = MPI_COMM_NULL;
    submit(sig, [this, color, key, &child](const Signature&) {
      check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split");
    }, true)->wait();
    if (child == MPI_COMM_NULL) return nullptr;
    uint64_t id = fnv1a(&index, sizeof index, progress_.id);
    const int64_t c = color;
    id = fnv1a(&c, sizeof c, id);
    return std::make_shared<MpiGroup>(child, name_ + "/split(color=" + std::to_string(color) + ")", id);
  }

  std::string where() const {
    return ::braid::detail::cat("braid: rank ", world_ranks_[static_cast<size_t>(rank_)], " (rank ", rank_,
                                " of group '", name_, "')");
  }

 private:
  static constexpr int64_t kMaxMessage = int64_t{1} << 30;

  // Note [Collectives on the caller's thread]
  // Every collective takes a number in call order. One the caller will wait for anyway runs on the
  // caller's thread when nothing is queued or running before it (saving two thread hand-offs, the
  // fixed cost of a small collective); otherwise, and for async ones, it joins the worker's queue.
  // inline_busy_ and worker_busy_ make the two paths mutually exclusive, so calls still run one at
  // a time and in order.
  std::shared_ptr<CollectiveWork> submit(Signature sig, std::function<void(const Signature&)> run, bool caller_waits) {
    auto work = std::make_shared<CollectiveWork>();
    Task task{sig, std::move(run), work};
    {
      std::lock_guard<std::mutex> lock(mu_);
      BRAID_CHECK_T(DistributedError, !stop_, "braid: group '", name_, "' has been shut down (finalize() was called)");
      task.sig.seq = ++called_;
      {
        std::lock_guard<std::mutex> progress_lock(progress_.mu);
        progress_.called = task.sig.seq;
        progress_.latest = task.sig.call();
      }
      if (!(caller_waits && queue_.empty() && !worker_busy_ && !inline_busy_)) {
        queue_.push_back(std::move(task));
        queued_.fetch_add(1);
        cv_.notify_one();
        return work;
      }
      inline_busy_ = true;
    }
    execute(task);
    bool queued = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      inline_busy_ = false;
      queued = !queue_.empty();
    }
    if (queued) cv_.notify_one();  // only the worker waits on cv_; waking it for nothing costs microseconds
    return work;
  }

  void execute(Task& task) {
    try {
      if (!failed_.empty())
        throw DistributedError(::braid::detail::cat(where(), ": ", task.sig.str(), " #", task.sig.seq,
                                                    " was not run because an earlier collective on this group "
                                                    "failed: ", failed_));
      set_running(task.sig);
      if (settings().debug) check_same_call(task.sig);
      NoGradGuard no_grad;
      task.run(task.sig);
      progress_.completed = task.sig.seq;
      set_running(Signature{});
      task.work->finish(nullptr);
    } catch (const DistributedError& e) {
      set_running(Signature{});
      if (failed_.empty()) failed_ = e.what();
      task.work->finish(std::current_exception());
    } catch (...) {
      set_running(Signature{});
      task.work->finish(std::current_exception());
    }
  }

  void set_running(const Signature& sig) {
    std::lock_guard<std::mutex> lock(progress_.mu);
    progress_.running = sig.call();
    progress_.running_seq = sig.seq;
  }

  void work_loop() {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !inline_busy_); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        queued_.fetch_sub(1);
        worker_busy_ = true;
      }
      execute(task);
      std::lock_guard<std::mutex> lock(mu_);
      worker_busy_ = false;
    }
  }

  void wait(std::vector<MPI_Request>& reqs, const Signature& sig) {
    wait_requests(
        reqs,
        [&] {
          return ::braid::detail::cat(where(), ": ", sig.str(), " #", sig.seq, " did not complete within ",
                                      settings().timeout_seconds, " s; ",
                                      who_did_not_arrive(progress_.id, sig.seq, sig.call(), world_ranks_, describe_call),
                                      ". (BRAID_TIMEOUT sets the limit.)");
        },
        op_name(sig.op));
  }

  // Note [Collective fingerprints]
  // Debug mode: before each collective the ranks all-gather what they are about to call (op, dtype,
  // element count, reduce op or root, and the call's number on this group); any difference is
  // reported by every rank, naming each rank's call, instead of hanging or mixing up buffers. A
  // rank that skipped a collective is caught at its next one, whose number then pairs with the
  // others' skipped call. Without debug mode, a timeout asks the late ranks what they are doing
  // (Note [What a late rank is doing] in mpi_runtime.cpp).
  void check_same_call(const Signature& mine) {
    std::vector<Signature> all(static_cast<size_t>(size_));
    std::vector<MPI_Request> req(1);
    check_mpi(MPI_Iallgather(&mine, sizeof(Signature), MPI_BYTE, all.data(), sizeof(Signature), MPI_BYTE, comm_,
                             req.data()),
              "MPI_Iallgather (debug check)");
    wait(req, mine);
    bool same = true;
    for (const Signature& s : all) same = same && s == all[0];
    if (same) return;
    std::ostringstream os;
    os << where() << ": collective mismatch on group '" << name_ << "' at call #" << mine.seq
       << " (BRAID_DISTRIBUTED_DEBUG): ";
    for (int r = 0; r < size_; ++r) {
      const Signature& s = all[static_cast<size_t>(r)];
      os << (r ? ", " : "") << "rank " << world_ranks_[static_cast<size_t>(r)] << " " << s.str();
      if (s.seq != mine.seq) os << " as #" << s.seq;
    }
    throw DistributedError(os.str());
  }

  WorkPtr p2p(const Tensor& t, int peer, int tag, bool is_send);

  MpiReducer::Wait waiter(const Signature& sig) {
    return [this, sig](std::vector<MPI_Request>& reqs) { wait(reqs, sig); };
  }

  MPI_Comm comm_ = MPI_COMM_NULL, p2p_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MpiReducer reducer_;
  std::string name_;
  std::vector<int> world_ranks_;
  GroupProgress progress_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false, stopped_ = false;
  bool worker_busy_ = false, inline_busy_ = false;  // see Note [Collectives on the caller's thread]
  std::atomic<int> queued_{0};
  int64_t called_ = 0;
  int64_t splits_ = 0;
  std::string failed_;  // the first collective failure; the group is unusable after it

  friend class P2PWork;
};

class P2PWork : public Work {
 public:
  P2PWork(MPI_Request req, Tensor t, std::string desc, std::string where, int64_t bytes)
      : req_(req), t_(std::move(t)), desc_(std::move(desc)), where_(std::move(where)), bytes_(bytes) {}
  ~P2PWork() override {
    if (req_ != MPI_REQUEST_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) {
        MPI_Cancel(&req_);
        MPI_Request_free(&req_);
      }
    }
  }
  void wait() override {
    if (done_) return;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(settings().timeout_seconds));
    MPI_Status st;
    while (true) {
      int flag = 0;
      check_mpi(MPI_Test(&req_, &flag, &st), where_ + ": " + desc_);
      if (flag) break;
      const auto now = Clock::now();
      if (now > deadline)
        throw DistributedError(::braid::detail::cat(where_, ": ", desc_, " did not complete within ",
                                                    settings().timeout_seconds,
                                                    " s; the peer is dead, hung, or its schedule differs. "
                                                    "(BRAID_TIMEOUT sets the limit.)"));
      if (now - start < std::chrono::milliseconds(2)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    req_ = MPI_REQUEST_NULL;
    done_ = true;
    if (is_recv_) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      BRAID_CHECK_T(DistributedError, count == bytes_, where_, ": ", desc_, " received ", count, " bytes, expected ",
                    bytes_, " (sender and receiver disagree on shape or dtype)");
    }
  }
  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status st;
    MPI_Request_get_status(req_, &flag, &st);
    return flag != 0;
  }
  bool is_recv_ = false;

 private:
  MPI_Request req_;
  Tensor t_;  // keeps the buffer alive
  std::string desc_, where_;
  int64_t bytes_;
  bool done_ = false;
};

WorkPtr MpiGroup::p2p(const Tensor& t, int peer, int tag, bool is_send) {
  const int64_t bytes = t.numel() * t.element_size();
  BRAID_CHECK(bytes < kMaxMessage, is_send ? "isend" : "irecv", ": ", bytes, " bytes is more than one message holds");
  // kDeviceP2PTag is the device transports' (Note [NCCL point-to-point]); the staging group keeps programs below it.
  BRAID_CHECK(tag >= 0 && tag <= kDeviceP2PTag, is_send ? "isend" : "irecv", ": tag must be in [0, 32767), got ", tag);
  MPI_Request req;
  if (is_send)
    check_mpi(MPI_Isend(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "MPI_Isend");
  else
    check_mpi(MPI_Irecv(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, p2p_, &req), "MPI_Irecv");
  std::string desc = ::braid::detail::cat(is_send ? "send of " : "recv of ", t.numel(), " ", dtype_name(t.dtype()),
                                          is_send ? " to rank " : " from rank ", world_ranks_[static_cast<size_t>(peer)],
                                          " (tag ", tag, ")");
  auto w = std::make_shared<P2PWork>(req, t, std::move(desc), where(), bytes);
  w->is_recv_ = !is_send;
  return w;
}

}  // namespace

ProcessGroupPtr make_mpi_world() {
  MPI_Comm comm;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  return std::make_shared<MpiGroup>(comm, "world", 1);
}

void stop_mpi_groups() {
  std::vector<MpiGroup*> groups;
  {
    std::lock_guard<std::mutex> lock(g_groups_mu);
    groups = g_groups;
  }
  for (MpiGroup* g : groups) g->shutdown();
}

}  // namespace braid::distributed::detail
