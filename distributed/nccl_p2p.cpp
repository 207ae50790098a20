// Point-to-point transfers of CUDA tensors by NCCL send/recv, between any two ranks of a host (MPI)
// group and from a rank to itself: one communicator and stream per ordered pair of ranks, made
// lazily by the two of them, with the sender's announcements over the host group deciding the
// order in which the receiver posts its receives. Built into libbraid_cuda.so with nccl_group.cpp.
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "core/knob_read.h"
#include "distributed/nccl_internal.h"

namespace braid::distributed::detail {

namespace {

namespace cuda = ::braid::detail::cuda;
using ::braid::detail::cat;
using Clock = std::chrono::steady_clock;

// Note [NCCL point-to-point]
// NCCL matches a send with a receive by call order on a communicator, not by tag, while braid's
// isend/irecv (the pipeline's stage boundaries) match by tag and may be posted in any order. So:
//
// Pairs. Each ORDERED pair of ranks (sender -> receiver) has a communicator of its own, with the
// sender as its rank 0, and a stream; a rank sending to itself has a communicator of one. Each
// direction has its own, so that the order of one direction's calls never depends on the other's.
// Nothing is collective: a pair is set up by its two ranks when the sender first sends. The
// sender makes the ncclUniqueId and sends it, with its GPU's identity, over the host group (tag
// kDeviceP2PTag, the pair's control channel); the receiver compares the identities and replies.
// Both ranks then create the communicator, non-blocking (ncclConfig_t.blocking = 0), so that no
// rank ever waits inside NCCL for the other: transfers queued meanwhile wait in the transport.
// Where the two share one GPU (NCCL refuses that) the receiver declines, and both stage the pair's
// transfers through the host group (Note [Staging device tensors]) from then on, in order.
//
// Order. Before each ncclSend the sender announces it on the control channel: sequence number,
// tag, dtype, shape. MPI keeps one channel's messages in order, and the receiver posts an ncclRecv
// for every announcement in that order: into the tensor of the oldest irecv waiting for that tag,
// or, when none waits yet, into a buffer of its own, kept until an irecv with the tag takes it (a
// copy on the compute stream). The irecv's dtype and element count must be the announced ones;
// otherwise it fails with a DistributedError naming both ranks, the tag, and both shapes and
// dtypes (the transfer stays for a later irecv). On a rank's own pair there is no channel: the
// announcement is queued in memory, and the send is issued with its receive in one NCCL group
// (a send to self before its receive would wait for it forever on one stream).
//
// Progress. Every call and every wait advances the transport (reads the channels, answers setups,
// posts announced receives, issues the sends a pair's setup held back), and so does a thread of
// its own, so that a rank blocked in something else (an MPI wait for its peer's reply) still lets
// its peer's transfers through. The thread also watches each pair's communicator for NCCL's
// asynchronous errors.
//
// Streams. As for the NCCL group's collectives (Note [The NCCL group]): the pair's stream waits for
// an event of the compute stream recorded when isend or irecv was called, so that a send reads
// what the program wrote and a receive's memory, reused in the compute stream's order, is free;
// the transfer's completion is another event, which Work::wait() waits for, and the tensors are
// kept alive until it has completed. A send's tensor must not be changed until its work is done.
// A wait past BRAID_TIMEOUT fails the transport, aborts its communicators, and raises a
// DistributedError naming the rank, the peer, the tag and the sequence number.

constexpr int kMaxDims = 8;
enum Kind : int32_t { kSetup = 1, kReply = 2, kAnnounce = 3 };

/// One message of a pair's control channel (fixed size: the receiver posts its buffer in advance).
struct Msg {
  int32_t kind = 0;
  int32_t tag = 0;
  int32_t dtype = 0;
  int32_t ndim = 0;  // more than kMaxDims: shape[0] holds the element count
  int64_t seq = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int32_t accept = 0;
  char gpu[124] = {};
  ncclUniqueId id{};
};

Msg announcement(const Tensor& t, int tag, int64_t seq) {
  Msg m;
  m.kind = kAnnounce;
  m.tag = tag;
  m.dtype = static_cast<int32_t>(t.dtype());
  m.ndim = static_cast<int32_t>(t.dim());
  m.seq = seq;
  m.numel = t.numel();
  if (t.dim() <= kMaxDims)
    for (int64_t i = 0; i < t.dim(); ++i) m.shape[i] = t.shape()[static_cast<size_t>(i)];
  else m.shape[0] = t.numel();
  return m;
}

Shape shape_of(const Msg& m) {
  if (m.ndim > kMaxDims) return {m.shape[0]};
  return Shape(m.shape, m.shape + m.ndim);
}

std::string describe(const Msg& m) { return cat(dtype_name(static_cast<DType>(m.dtype)), " ", shape_str(shape_of(m))); }

void* ptr(const Tensor& t) { return reinterpret_cast<void*>(t.data_ptr()); }
size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel() * t.element_size()); }

/// One isend or irecv.
struct Op {
  bool send = false;
  int peer = 0, tag = 0;
  Tensor t;
  std::string what;                // "send of float32 [2, 3] to rank 1 (tag 4)"
  std::shared_ptr<Event> ready;    // the compute stream when it was called
  std::shared_ptr<Event> done;     // set once the transfer is queued on a stream
  WorkPtr staged;                  // set where the pair is staged
  std::string error;               // the announced transfer did not match
};

/// A transfer received before any irecv asked for it.
struct Early {
  Msg msg;
  Tensor buf;
  std::shared_ptr<Event> done;
};

struct PairComm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

enum State { kNone, kAsked, kInit, kReady, kStaged };

struct Peer {
  State out = kNone, in = kNone;  // me -> peer, peer -> me
  PairComm out_comm, in_comm;     // the same one on a rank's own pair
  ncclUniqueId out_id{};
  int64_t out_seq = 0;
  std::deque<std::shared_ptr<Op>> unsent;                 // isends waiting for the pair's setup
  std::deque<Msg> announced;                              // read, not yet received
  std::map<int, std::deque<std::shared_ptr<Op>>> wanted;  // irecvs waiting for their transfer, by tag
  std::map<int, std::deque<Early>> early;                 // transfers waiting for their irecv, by tag
  std::map<int64_t, std::shared_ptr<Op>> self_sends;      // own pair: sends by sequence number
  Tensor inbox;                                           // the control channel's next message
  WorkPtr inbox_work;
};

struct Keep {
  std::shared_ptr<Event> done;
  std::vector<Tensor> tensors;
};

class NcclP2P;

class P2PWork final : public Work {
 public:
  P2PWork(std::shared_ptr<NcclP2P> p2p, std::shared_ptr<Op> op) : p2p_(std::move(p2p)), op_(std::move(op)) {}
  void wait() override;
  bool is_completed() override;

 private:
  std::shared_ptr<NcclP2P> p2p_;
  std::shared_ptr<Op> op_;
};

class NcclP2P final : public DeviceP2P, public std::enable_shared_from_this<NcclP2P> {
 public:
  NcclP2P(ProcessGroupPtr host, Device device) : host_(std::move(host)), device_(device) {
    where_ = cat("braid: rank ", host_->world_rank(host_->rank()), " (NCCL point-to-point on ", device_.str(), ")");
    thread_ = std::thread([this] { run(); });
  }

  ~NcclP2P() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    cuda::DeviceGuard guard(device_.index);
    for (auto& [r, p] : peers_) {
      if (failed_.empty()) {
        for (PairComm* c : {&p.out_comm, &p.in_comm})
          if (c->stream) cudaStreamSynchronize(c->stream);
      }
      for (auto& [tag, works] : p.wanted) works.clear();
      destroy(p.out_comm);
      if (r != rank()) destroy(p.in_comm);
    }
  }

  WorkPtr isend(const Tensor& t, int dst, int tag) override {
    check_peer(dst, host_->size(), "isend");
    auto op = make_op(true, t, dst, tag);
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_failed();
    Peer& p = peers_[dst];
    if (dst == rank()) {
      setup_self(p);
      const int64_t seq = ++p.out_seq;
      p.self_sends[seq] = op;
      p.announced.push_back(announcement(t, tag, seq));
    } else if (p.out == kStaged) {
      op->staged = staged_isend(*host_, t, dst, tag);
    } else {
      p.unsent.push_back(op);
      if (p.out == kNone) ask(p, dst);
    }
    progress();
    return std::make_shared<P2PWork>(shared_from_this(), op);
  }

  WorkPtr irecv(Tensor t, int src, int tag) override {
    check_peer(src, host_->size(), "irecv");
    auto op = make_op(false, t, src, tag);
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_failed();
    Peer& p = peers_[src];
    if (src == rank()) setup_self(p);
    else listen(p, src);
    progress();
    if (p.in == kStaged) {
      op->staged = staged_irecv(*host_, std::move(t), src, tag);
    } else if (auto it = p.early.find(tag); it != p.early.end() && !it->second.empty()) {
      const std::string mismatch = check_match(it->second.front().msg, *op);
      if (!mismatch.empty()) throw DistributedError(mismatch);
      Early e = std::move(it->second.front());
      it->second.pop_front();
      hand_over(e, *op);
    } else {
      p.wanted[tag].push_back(op);
    }
    return std::make_shared<P2PWork>(shared_from_this(), op);
  }

  /// Whether op has completed; throws its error or the transport's failure.
  bool completed(Op& op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.empty()) throw DistributedError(failed_);
    progress();
    if (!op.error.empty()) throw DistributedError(op.error);
    if (op.staged) return true;  // P2PWork waits for it
    return op.done && op.done->done();
  }

  /// Fails the transport (a wait's deadline passed, or NCCL reported an error) and throws.
  [[noreturn]] void fail_with(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fail(message);
    }
    throw DistributedError(failed_);
  }

  const std::string& where() const { return where_; }

 private:
  int rank() const { return host_->rank(); }
  int world(int r) const { return host_->world_rank(r); }

  std::shared_ptr<Op> make_op(bool send, const Tensor& t, int peer, int tag) {
    BRAID_CHECK(t.device() == device_, send ? "isend" : "irecv", ": a tensor on ", t.device().str(),
                " given to NCCL's point-to-point transport of ", device_.str());
    auto op = std::make_shared<Op>();
    op->send = send;
    op->peer = peer;
    op->tag = tag;
    op->t = t;
    op->what = cat(send ? "send of " : "recv of ", dtype_name(t.dtype()), " ", shape_str(t.shape()),
                   send ? " to rank " : " from rank ", world(peer), " (tag ", tag, ")");
    cuda::DeviceGuard guard(device_.index);
    op->ready = std::make_shared<Event>(device_.index);
    op->ready->record(cuda::stream(device_.index));
    return op;
  }

  void throw_if_failed() const {
    if (!failed_.empty()) throw DistributedError(failed_);
  }

  void fail(const std::string& message) {
    if (!failed_.empty()) return;
    failed_ = message;
    for (auto& [r, p] : peers_)
      for (PairComm* c : {&p.out_comm, &p.in_comm})
        if (c->comm) ncclCommAbort(c->comm);
    aborted_ = true;
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }

  void destroy(PairComm& c) {
    if (c.comm && !aborted_) {
      ncclCommFinalize(c.comm);
      ncclResult_t st = ncclInProgress;
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (ncclCommGetAsyncError(c.comm, &st) == ncclSuccess && st == ncclInProgress && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommDestroy(c.comm);
    }
    if (c.stream) cudaStreamDestroy(c.stream);
    c = PairComm{};
  }

  /// Starts creating a communicator (non-blocking) and its stream.
  void create(PairComm& c, int nranks, const ncclUniqueId& id, int comm_rank, const std::string& what) {
    cuda::DeviceGuard guard(device_.index);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&c.comm, nranks, id, comm_rank, &config), where_, what.c_str());
    int lo = 0, hi = 0;
    cuda::check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "nccl", "cudaDeviceGetStreamPriorityRange");
    cuda::check(cudaStreamCreateWithPriority(&c.stream, cudaStreamNonBlocking, hi), "nccl",
                "cudaStreamCreateWithPriority");
  }

  /// Whether the communicator has finished its last call; an error fails the transport.
  bool settled(const PairComm& c, const std::string& what) {
    ncclResult_t st = ncclInProgress;
    check_nccl(ncclCommGetAsyncError(c.comm, &st), where_, "ncclCommGetAsyncError");
    if (st == ncclInProgress) return false;
    if (st != ncclSuccess) {
      fail(cat(where_, ": ", what, ": NCCL reported ", ncclGetErrorString(st), " (", ncclGetLastError(c.comm), ")"));
      throw DistributedError(failed_);
    }
    return true;
  }

  /// Waits for the call just made on c to be queued (a non-blocking communicator may return before).
  void settle(const PairComm& c, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(settings().timeout_seconds));
    while (!settled(c, what)) {
      if (Clock::now() > deadline) {
        fail(cat(where_, ": ", what, " was not queued within ", settings().timeout_seconds,
                 " s; the peer is dead or hung. (BRAID_TIMEOUT sets the limit.)"));
        throw DistributedError(failed_);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void setup_self(Peer& p) {
    if (p.out != kNone) return;
    ncclUniqueId id;
    check_nccl(ncclGetUniqueId(&id), where_, "ncclGetUniqueId");
    create(p.out_comm, 1, id, 0, "creating the communicator of a rank's own pair");
    p.in_comm = p.out_comm;
    p.out = p.in = kInit;
  }

  void post_control(int peer, const Msg& m) {
    Tensor bytes = empty({static_cast<int64_t>(sizeof m)}, kUInt8, Device::cpu());
    std::memcpy(bytes.raw_data(), &m, sizeof m);
    outbox_.push_back(host_->isend(bytes, peer, kDeviceP2PTag));
  }

  /// Posts the receive of peer's next control message, once per peer.
  void listen(Peer& p, int peer) {
    if (p.inbox_work) return;
    p.inbox = empty({static_cast<int64_t>(sizeof(Msg))}, kUInt8, Device::cpu());
    p.inbox_work = host_->irecv(p.inbox, peer, kDeviceP2PTag);
  }

  /// The sender's side of a pair's setup: the id and this GPU's identity go to the receiver.
  void ask(Peer& p, int peer) {
    Msg m;
    m.kind = kSetup;
    check_nccl(ncclGetUniqueId(&m.id), where_, "ncclGetUniqueId");
    const std::string gpu = gpu_identity(device_);
    std::memcpy(m.gpu, gpu.data(), std::min(gpu.size(), sizeof m.gpu - 1));
    p.out_id = m.id;
    post_control(peer, m);
    listen(p, peer);
    p.out = kAsked;
  }

  void on_message(Peer& p, int peer, const Msg& m) {
    if (m.kind == kAnnounce) {
      p.announced.push_back(m);
    } else if (m.kind == kSetup) {
      const std::string gpu = gpu_identity(device_);
      Msg reply;
      reply.kind = kReply;
      reply.accept = std::strncmp(m.gpu, gpu.c_str(), sizeof m.gpu - 1) != 0;  // as ask() truncated it
      post_control(peer, reply);
      if (!reply.accept) {
        std::fprintf(stderr, "%s: rank %d shares GPU %s; its CUDA tensors travel to this rank through MPI, staged "
                     "in host memory\n", where_.c_str(), world(peer), gpu.c_str());
        p.in = kStaged;
        for (auto& [tag, ops] : p.wanted)
          for (auto& op : ops) op->staged = staged_irecv(*host_, op->t, peer, tag);
        p.wanted.clear();
        return;
      }
      create(p.in_comm, 2, m.id, 1, cat("creating the communicator of rank ", world(peer), " -> this rank"));
      p.in = kInit;
    } else if (m.kind == kReply && m.accept) {
      create(p.out_comm, 2, p.out_id, 0, cat("creating the communicator of this rank -> rank ", world(peer)));
      p.out = kInit;
    } else if (m.kind == kReply) {
      p.out = kStaged;
      for (auto& op : p.unsent) op->staged = staged_isend(*host_, op->t, peer, op->tag);
      p.unsent.clear();
    }
  }

  /// Announces op and queues its ncclSend on the pair's stream.
  void issue_send(Peer& p, int peer, const std::shared_ptr<Op>& op) {
    post_control(peer, announcement(op->t, op->tag, ++p.out_seq));
    cuda::DeviceGuard guard(device_.index);
    const std::string what = cat(op->what, " #", p.out_seq);
    cuda::check(cudaStreamWaitEvent(p.out_comm.stream, op->ready->event, 0), "nccl", "cudaStreamWaitEvent");
    check_nccl(ncclSend(ptr(op->t), nbytes(op->t), ncclUint8, 1, p.out_comm.comm, p.out_comm.stream), where_,
               what.c_str());
    settle(p.out_comm, what);
    op->done = std::make_shared<Event>(device_.index);
    op->done->record(p.out_comm.stream);
    keep_.push_back(Keep{op->done, {op->t}});
  }

  std::string check_match(const Msg& m, const Op& op) const {
    if (m.dtype == static_cast<int32_t>(op.t.dtype()) && m.numel == op.t.numel()) return "";
    return cat(where_, ": irecv from rank ", world(op.peer), " (tag ", op.tag, ") of ", dtype_name(op.t.dtype()),
               " ", shape_str(op.t.shape()), " does not match the transfer that rank ", world(op.peer),
               " sent with tag ", m.tag, " (#", m.seq, "): ", describe(m),
               "; sender and receiver disagree on shape or dtype");
  }

  /// Posts the receive of announcement m (and, on the own pair, its send, in one NCCL group).
  void receive(Peer& p, int peer, const Msg& m) {
    std::shared_ptr<Op> target;
    if (auto it = p.wanted.find(m.tag); it != p.wanted.end() && !it->second.empty()) {
      target = it->second.front();
      it->second.pop_front();
      target->error = check_match(m, *target);
      if (!target->error.empty()) target = nullptr;
    }
    cuda::DeviceGuard guard(device_.index);
    const cudaStream_t s = p.in_comm.stream;
    Early early;
    if (!target) {
      early.msg = m;
      early.buf = empty(shape_of(m), static_cast<DType>(m.dtype), device_);
      auto ready = std::make_shared<Event>(device_.index);  // the buffer's memory is free on the compute stream
      ready->record(cuda::stream(device_.index));
      cuda::check(cudaStreamWaitEvent(s, ready->event, 0), "nccl", "cudaStreamWaitEvent");
    } else {
      cuda::check(cudaStreamWaitEvent(s, target->ready->event, 0), "nccl", "cudaStreamWaitEvent");
    }
    const Tensor& into = target ? target->t : early.buf;
    const std::string what = cat(target ? target->what : cat("recv of ", describe(m), " from rank ", world(peer),
                                                             " (tag ", m.tag, ")"), " #", m.seq);
    std::shared_ptr<Op> send;
    if (peer == rank()) {
      send = p.self_sends.at(m.seq);
      p.self_sends.erase(m.seq);
      cuda::check(cudaStreamWaitEvent(s, send->ready->event, 0), "nccl", "cudaStreamWaitEvent");
      check_nccl(ncclGroupStart(), where_, "ncclGroupStart");
      check_nccl(ncclSend(ptr(send->t), nbytes(send->t), ncclUint8, 0, p.in_comm.comm, s), where_, what.c_str());
    }
    check_nccl(ncclRecv(ptr(into), nbytes(into), ncclUint8, 0, p.in_comm.comm, s), where_,
               what.c_str());
    if (send) check_nccl(ncclGroupEnd(), where_, "ncclGroupEnd");
    settle(p.in_comm, what);
    auto done = std::make_shared<Event>(device_.index);
    done->record(s);
    keep_.push_back(Keep{done, {into}});
    if (send) {
      send->done = done;
      keep_.back().tensors.push_back(send->t);
    }
    if (target) {
      target->done = done;
    } else {
      early.done = done;
      p.early[m.tag].push_back(std::move(early));
    }
  }

  /// An early transfer into op's tensor: a copy on the compute stream after the receive.
  void hand_over(const Early& e, Op& op) {
    cuda::DeviceGuard guard(device_.index);
    const cudaStream_t compute = cuda::stream(device_.index);
    cuda::check(cudaStreamWaitEvent(compute, e.done->event, 0), "nccl", "cudaStreamWaitEvent");
    {
      NoGradGuard no_grad;
      op.t.copy_(e.buf.reshape(op.t.shape()));
    }
    op.done = std::make_shared<Event>(device_.index);
    op.done->record(compute);
  }

  /// Advances every pair; called with mu_ held.
  void progress() {
    if (!failed_.empty()) return;
    while (!outbox_.empty() && outbox_.front()->is_completed()) {
      outbox_.front()->wait();
      outbox_.pop_front();
    }
    for (auto& [r, p] : peers_) {
      while (p.inbox_work && p.inbox_work->is_completed()) {
        p.inbox_work->wait();
        Msg m;
        std::memcpy(&m, p.inbox.raw_data(), sizeof m);
        p.inbox_work = nullptr;
        listen(p, r);
        on_message(p, r, m);
      }
      if (p.out == kInit && settled(p.out_comm, "creating a pair's communicator")) p.out = kReady;
      if (p.in == kInit && (r == rank() ? p.out == kReady : settled(p.in_comm, "creating a pair's communicator")))
        p.in = kReady;
      if (p.out == kReady && r != rank()) {
        while (!p.unsent.empty()) {
          issue_send(p, r, p.unsent.front());
          p.unsent.pop_front();
        }
      }
      if (p.in == kReady) {
        while (!p.announced.empty()) {
          const Msg m = p.announced.front();
          p.announced.pop_front();
          receive(p, r, m);
        }
      }
    }
    while (!keep_.empty() && keep_.front().done->done()) keep_.pop_front();
  }

  /// The transport's thread: progress while the program is elsewhere, and NCCL's asynchronous errors.
  void run() {
    cuda::DeviceGuard guard(device_.index);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const bool busy = !outbox_.empty() || !keep_.empty() || !peers_.empty();
      cv_.wait_for(lock, busy ? std::chrono::microseconds(200) : std::chrono::milliseconds(20));
      if (stop_ || !failed_.empty()) continue;
      try {
        progress();
        for (auto& [r, p] : peers_)
          for (auto [c, state] : {std::pair{&p.out_comm, p.out}, std::pair{&p.in_comm, p.in}})
            if (state == kReady) settled(*c, cat("a transfer with rank ", world(r)));
      } catch (const std::exception& e) {
        fail(e.what());  // the program sees it at its next call or wait
      }
    }
  }

  ProcessGroupPtr host_;
  Device device_;
  std::string where_;
  std::mutex mu_;  // guards everything below, and every NCCL call
  std::condition_variable cv_;
  std::map<int, Peer> peers_;
  std::deque<WorkPtr> outbox_;  // control messages in flight
  std::deque<Keep> keep_;       // tensors of queued transfers, until their event
  std::string failed_;
  bool aborted_ = false;
  bool stop_ = false;
  std::thread thread_;
};

bool P2PWork::is_completed() {
  if (!p2p_->completed(*op_)) return false;
  return !op_->staged || op_->staged->is_completed();
}

void P2PWork::wait() {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(settings().timeout_seconds));
  while (!p2p_->completed(*op_)) {
    const auto now = Clock::now();
    if (now > deadline)
      p2p_->fail_with(cat(p2p_->where(), ": ", op_->what, " did not complete within ", settings().timeout_seconds,
                          " s; the peer is dead, hung, or its schedule differs. (BRAID_TIMEOUT sets the limit.)"));
    if (now - start < std::chrono::milliseconds(1)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (op_->staged) op_->staged->wait();
}

std::mutex g_registry_mu;
std::map<std::pair<const ProcessGroup*, int>, std::weak_ptr<NcclP2P>> g_registry;

}  // namespace

std::shared_ptr<DeviceP2P> make_nccl_p2p(const ProcessGroupPtr& host, const Device& device) {
  if (!braid::detail::knob_flag("BRAID_NCCL") || !braid::detail::knob_flag("BRAID_NCCL_P2P")) return nullptr;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto& slot = g_registry[{host.get(), device.index}];
  if (auto p = slot.lock()) return p;
  auto p = std::make_shared<NcclP2P>(host, device);
  slot = p;
  return p;
}

}  // namespace braid::distributed::detail
