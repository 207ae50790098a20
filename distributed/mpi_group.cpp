// The MPI process group. Collectives run in call order on one worker thread per group, so that a
// bucket's all-reduce proceeds while the caller goes on with backward; point-to-point transfers are
// posted by the caller directly. Nothing here blocks inside MPI: requests are polled against the
// deadline (Note [Failing ranks end the job]).
//
// Note [All-reduce algorithm]
// Small buffers and non-float data go to MPI_Iallreduce. Large float buffers use a ring (reduce-
// scatter then all-gather, 2(p-1)/p of the buffer sent per rank, the bandwidth optimum) written on
// MPI point-to-point in chunks, so that adding chunk i overlaps receiving chunk i+1; Debian's MPICH
// is several times slower on one node (benchmarks/README.md, "Data-parallel communication"). The
// ring's order of additions depends only on the size and the number of ranks, and every rank ends
// with the owner's bytes, so it is also the deterministic mode and carries compressed wire dtypes.
// Below 32 KiB, on a power-of-two group, recursive doubling (log2 p exchanges of the whole buffer,
// latency-optimal) is faster than MPI_Iallreduce; each pair adds the same two operands, so every
// rank still ends with the same bits.
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
#include "distributed/mpi_runtime.h"

namespace braid::distributed::detail {

namespace {

using Clock = std::chrono::steady_clock;

/// Buffers of at least this many bytes take the ring (Note [All-reduce algorithm]).
constexpr int64_t kRingMinBytes = 32 * 1024;
/// Bytes per ring message: small enough that reduction overlaps the transfer of the next chunk.
constexpr int64_t kRingChunkBytes = 1 << 20;
constexpr int kRingTag = 11;
/// Largest message recursive doubling sends in one piece (below MPI's rendezvous threshold).
constexpr int64_t kEagerBytes = 8 * 1024;
/// Buffers below this size (on power-of-two groups) take recursive doubling.
constexpr int64_t kDoublingMaxBytes = 256 * 1024;

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  throw DistributedError(::braid::detail::cat("braid: ", what, ": MPI error: ", std::string(msg, static_cast<size_t>(len))));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Bool: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

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

/// What a collective call is, as the debug mode compares it across ranks.
struct Signature {
  int64_t seq = 0, op = 0, dtype = -1, numel = 0, arg = 0;
  bool operator==(const Signature&) const = default;
  std::string str() const {
    std::ostringstream os;
    os << op_name(op) << "(";
    if (op == kAllReduce || op == kReduceScatter) os << reduce_op_name(static_cast<ReduceOp>(arg)) << ", ";
    if (op == kBroadcast) os << "root " << arg << ", ";
    if (op == kSplit) os << "color " << arg;
    if (dtype >= 0) os << numel << " " << dtype_name(static_cast<DType>(dtype));
    os << ")";
    return os.str();
  }
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
    return submit(sig, [this, t, op, options](const Signature& s) { all_reduce_now(t, op, options, s); }, false);
  }

  void all_reduce(Tensor t, ReduceOp op, const AllReduceOptions& options) override {
    check_all_reduce(t, op, options);
    Signature sig{0, kAllReduce, static_cast<int64_t>(t.dtype()), t.numel(), static_cast<int64_t>(op)};
    submit(sig, [this, t, op, options](const Signature& s) { all_reduce_now(t, op, options, s); }, true)->wait();
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
      progress_.called = task.sig.seq;
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
      if (settings().debug) check_same_call(task.sig);
      NoGradGuard no_grad;
      task.run(task.sig);
      progress_.completed = task.sig.seq;
      task.work->finish(nullptr);
    } catch (const DistributedError& e) {
      if (failed_.empty()) failed_ = e.what();
      task.work->finish(std::current_exception());
    } catch (...) {
      task.work->finish(std::current_exception());
    }
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
                                      who_did_not_arrive(progress_.id, sig.seq, world_ranks_),
                                      ". (BRAID_TIMEOUT sets the limit.)");
        },
        op_name(sig.op));
  }

  // Debug mode: the ranks exchange what they are about to call; any difference is reported by
  // every rank instead of hanging in mismatched collectives.
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
    os << where() << ": ranks called different collectives (debug mode): ";
    for (int r = 0; r < size_; ++r) {
      const Signature& s = all[static_cast<size_t>(r)];
      os << (r ? "; " : "") << "rank " << world_ranks_[static_cast<size_t>(r)] << " called " << s.str() << " as #"
         << s.seq;
    }
    throw DistributedError(os.str());
  }

  // Note [Reduction order]: which algorithm a buffer takes depends only on its size, dtype, the
  // options and the group's size, and reduce_scatter_inplace takes the reduce-scatter half of the
  // algorithm all_reduce with deterministic = true takes (recursive halving for recursive
  // doubling, the ring's first half for the ring), so that every element is summed in the same
  // tree: a sharded run's gradients have the bits of a data-parallel run's.
  enum class Algo { Doubling, Ring, Mpi };
  Algo choose(const Tensor& t, ReduceOp op, const AllReduceOptions& options) const {
    const bool floating = is_floating(t.dtype());
    const bool half = t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16;
    const bool sum_like = op == ReduceOp::Sum || op == ReduceOp::Average;
    const bool compressed = half || options.wire_dtype != WireDType::Native;
    const bool pow2 = (size_ & (size_ - 1)) == 0;
    if (!compressed && pow2 && t.numel() * t.element_size() < kDoublingMaxBytes) return Algo::Doubling;
    if (floating && sum_like &&
        (half || options.deterministic || options.wire_dtype != WireDType::Native ||
         t.numel() * t.element_size() >= kRingMinBytes))
      return Algo::Ring;
    return Algo::Mpi;
  }

  DType wire_of(const Tensor& t, WireDType wire_dtype) const {
    return wire_dtype == WireDType::Float16    ? DType::Float16
           : wire_dtype == WireDType::BFloat16 ? DType::BFloat16
                                               : t.dtype();
  }

  void all_reduce_now(const Tensor& t, ReduceOp op, const AllReduceOptions& options, const Signature& sig) {
    if (size_ == 1 || t.numel() == 0) return;
    switch (choose(t, op, options)) {
      case Algo::Doubling: recursive_doubling(t, op, sig); return;
      case Algo::Ring: {
        const Tensor flat = t.view({t.numel()});
        const DType wire = wire_of(t, options.wire_dtype);
        ring_reduce_scatter(flat, wire, op == ReduceOp::Average, sig);
        ring_all_gather(flat, wire, sig);
        return;
      }
      case Algo::Mpi: break;
    }
    std::vector<MPI_Request> req(1);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype()), mpi_op(op),
                             comm_, req.data()),
              "MPI_Iallreduce");
    wait(req, sig);
    if (op == ReduceOp::Average) Tensor(t).mul_(1.0 / size_);
  }

  void reduce_scatter_now(const Tensor& t, ReduceOp op, AllReduceOptions options, const Signature& sig) {
    if (size_ == 1 || t.numel() == 0) return;
    options.deterministic = true;
    const Tensor flat = t.view({t.numel()});
    switch (choose(t, op, options)) {
      case Algo::Doubling: recursive_halving(flat, op, sig); return;
      case Algo::Ring: ring_reduce_scatter(flat, wire_of(t, options.wire_dtype), op == ReduceOp::Average, sig); return;
      case Algo::Mpi: all_reduce_now(t, op, options, sig); return;  // integers, max, min: the whole buffer
    }
  }

  // Sends bytes of send to partner while receiving its bytes into recv, in pieces small enough for
  // MPI's eager protocol: one rendezvous handshake costs more than several eager messages here.
  void exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int partner,
                const Signature& sig) {
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < recv_bytes; off += kEagerBytes) {
      MPI_Request r;
      check_mpi(MPI_Irecv(static_cast<char*>(recv) + off, static_cast<int>(std::min(kEagerBytes, recv_bytes - off)),
                          MPI_BYTE, partner, kRingTag, comm_, &r),
                "MPI_Irecv (recursive doubling)");
      reqs.push_back(r);
    }
    for (int64_t off = 0; off < send_bytes; off += kEagerBytes) {
      MPI_Request r;
      check_mpi(MPI_Isend(static_cast<const char*>(send) + off, static_cast<int>(std::min(kEagerBytes, send_bytes - off)),
                          MPI_BYTE, partner, kRingTag, comm_, &r),
                "MPI_Isend (recursive doubling)");
      reqs.push_back(r);
    }
    wait(reqs, sig);
  }

  // Recursive halving: at distance N/2, N/4, ..., 1 each rank keeps half of its segment range (the
  // half holding its own segment), sends the other half to its partner and adds the partner's copy
  // of the kept half: the tree of recursive_doubling, element by element.
  void recursive_halving(const Tensor& flat, ReduceOp op, const Signature& sig) {
    const int64_t n = flat.numel(), es = flat.element_size();
    Tensor other = empty({n}, flat.dtype());
    int lo = 0, hi = size_;
    for (int mask = size_ >> 1; mask >= 1; mask >>= 1) {
      const int mid = lo + (hi - lo) / 2;
      const bool upper = (rank_ & mask) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      const int64_t kb = n * keep_lo / size_, ke = n * keep_hi / size_;
      const int64_t gb = n * give_lo / size_, ge = n * give_hi / size_;
      exchange(static_cast<const char*>(flat.raw_data()) + gb * es, (ge - gb) * es,
               static_cast<char*>(other.raw_data()) + kb * es, (ke - kb) * es, rank_ ^ mask, sig);
      combine(flat.narrow(0, kb, ke - kb), other.narrow(0, kb, ke - kb), op);
      lo = keep_lo;
      hi = keep_hi;
    }
    if (op == ReduceOp::Average) flat.narrow(0, n * rank_ / size_, n * (rank_ + 1) / size_ - n * rank_ / size_).mul_(1.0 / size_);
  }

  // Exchanges the whole buffer with the partner at distance N/2, N/4, ..., 1 and combines.
  void recursive_doubling(const Tensor& t, ReduceOp op, const Signature& sig) {
    const int64_t n = t.numel(), bytes = n * t.element_size();
    Tensor other = empty({n}, t.dtype());
    for (int mask = size_ >> 1; mask >= 1; mask >>= 1) {
      exchange(t.raw_data(), bytes, other.raw_data(), bytes, rank_ ^ mask, sig);
      combine(t, other, op);
    }
    if (op == ReduceOp::Average) Tensor(t).mul_(1.0 / size_);
  }

  template <typename T>
  static void combine_as(T* a, const T* b, int64_t n, ReduceOp op) {
    switch (op) {
      case ReduceOp::Max:
        for (int64_t i = 0; i < n; ++i) a[i] = a[i] < b[i] ? b[i] : a[i];
        break;
      case ReduceOp::Min:
        for (int64_t i = 0; i < n; ++i) a[i] = b[i] < a[i] ? b[i] : a[i];
        break;
      default:
        for (int64_t i = 0; i < n; ++i) a[i] = static_cast<T>(a[i] + b[i]);
    }
  }

  /// a = op(a, b) elementwise, in a's dtype (small buffers: a plain loop beats a dispatched op).
  static void combine(const Tensor& a, const Tensor& b, ReduceOp op) {
    const int64_t n = a.numel();
    switch (a.dtype()) {
      case DType::Float32: combine_as(static_cast<float*>(a.raw_data()), static_cast<const float*>(b.raw_data()), n, op); break;
      case DType::Float64: combine_as(static_cast<double*>(a.raw_data()), static_cast<const double*>(b.raw_data()), n, op); break;
      case DType::Int64: combine_as(static_cast<int64_t*>(a.raw_data()), static_cast<const int64_t*>(b.raw_data()), n, op); break;
      case DType::Int32: combine_as(static_cast<int32_t*>(a.raw_data()), static_cast<const int32_t*>(b.raw_data()), n, op); break;
      case DType::Bool: {
        // Sum of bools is "any", as MPI's sum of 0/1 bytes clamped back to bool would give.
        auto* x = static_cast<uint8_t*>(a.raw_data());
        const auto* y = static_cast<const uint8_t*>(b.raw_data());
        for (int64_t i = 0; i < n; ++i) x[i] = op == ReduceOp::Min ? (x[i] && y[i]) : (x[i] || y[i]);
        break;
      }
      default: BRAID_ASSERT(false, "combine: unexpected dtype ", dtype_name(a.dtype()));
    }
  }

  // Sends src to the right neighbour while receiving the left neighbour's matching segment; each
  // received chunk is either added into dst (reduce) or copied into it. Chunks are double-buffered
  // so that chunk i is added while chunk i+1 arrives.
  void ring_step(const Tensor& src, const Tensor& dst, DType wire, bool reduce, const Signature& sig) {
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    const int64_t wsize = dtype_size(wire);
    const Tensor send = src.dtype() == wire ? src : src.to(wire);
    const bool direct = !reduce && dst.dtype() == wire;  // receive straight into place
    const int64_t chunk = std::max<int64_t>(1, kRingChunkBytes / wsize);
    const int64_t n_send = send.numel(), n_recv = dst.numel();
    std::vector<MPI_Request> sends;
    for (int64_t off = 0; off < n_send; off += chunk) {
      MPI_Request r;
      check_mpi(MPI_Isend(static_cast<char*>(send.raw_data()) + off * wsize, static_cast<int>(std::min(chunk, n_send - off) * wsize),
                          MPI_BYTE, right, kRingTag, comm_, &r),
                "MPI_Isend (ring)");
      sends.push_back(r);
    }
    Tensor buf[2];
    if (!direct) buf[0] = empty({std::min(chunk, n_recv)}, wire), buf[1] = empty({std::min(chunk, n_recv)}, wire);
    auto post = [&](int64_t off, int slot) {
      const int64_t len = std::min(chunk, n_recv - off);
      void* where = direct ? static_cast<char*>(dst.raw_data()) + off * wsize : buf[slot].raw_data();
      MPI_Request r;
      check_mpi(MPI_Irecv(where, static_cast<int>(len * wsize), MPI_BYTE, left, kRingTag, comm_, &r), "MPI_Irecv (ring)");
      return r;
    };
    std::vector<MPI_Request> pending(1);
    if (n_recv > 0) pending[0] = post(0, 0);
    for (int64_t off = 0, i = 0; off < n_recv; off += chunk, ++i) {
      std::vector<MPI_Request> cur{pending[0]};
      if (off + chunk < n_recv) pending[0] = post(off + chunk, static_cast<int>((i + 1) % 2));
      wait(cur, sig);
      if (direct) continue;
      const int64_t len = std::min(chunk, n_recv - off);
      Tensor got = buf[i % 2].narrow(0, 0, len);
      Tensor out = dst.narrow(0, off, len);
      if (reduce) out.add_(got.dtype() == out.dtype() ? got : got.to(out.dtype()));
      else out.copy_(got);
    }
    wait(sends, sig);
  }

  // The ring's segments by label: label i is segment (i - 1) mod N, so that the segment a rank
  // finishes in the reduce-scatter half (label rank + 1) is its own, segment rank.
  static Tensor ring_segment(const Tensor& flat, int label, int p) {
    const int64_t n = flat.numel();
    const int i = (label + p - 1) % p;
    const int64_t b = n * i / p, e = n * (i + 1) / p;
    return flat.narrow(0, b, e - b);
  }

  // After it, this rank's own segment holds the sum over the ring, finished once here (averaged,
  // rounded to the wire dtype) so that every rank receives the same bytes in the all-gather half.
  void ring_reduce_scatter(const Tensor& flat, DType wire, bool average, const Signature& sig) {
    const int p = size_, r = rank_;
    for (int s = 0; s < p - 1; ++s)
      ring_step(ring_segment(flat, (r - s + p) % p, p), ring_segment(flat, (r - s - 1 + 2 * p) % p, p), wire, true, sig);
    Tensor own = ring_segment(flat, (r + 1) % p, p);
    if (average) own.mul_(1.0 / p);
    if (wire != flat.dtype()) own.copy_(own.to(wire));
  }

  void ring_all_gather(const Tensor& flat, DType wire, const Signature& sig) {
    const int p = size_, r = rank_;
    for (int s = 0; s < p - 1; ++s)
      ring_step(ring_segment(flat, (r + 1 - s + p) % p, p), ring_segment(flat, (r - s + p) % p, p), wire, false, sig);
  }

  WorkPtr p2p(const Tensor& t, int peer, int tag, bool is_send);

  MPI_Comm comm_ = MPI_COMM_NULL, p2p_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
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
  BRAID_CHECK(tag >= 0 && tag < 32767, is_send ? "isend" : "irecv", ": tag must be in [0, 32767), got ", tag);
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
