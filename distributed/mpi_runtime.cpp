// Launch detection, MPI start and stop, failure handlers and the control thread.
//
// Note [Failing ranks end the job]
// MPI gives a survivor no way out of a collective whose peer has died: it stays blocked. braid
// therefore (1) never blocks inside MPI: every operation is non-blocking and polled against a
// deadline (see mpi_group.cpp), so a stuck collective becomes a DistributedError naming the op, its
// number and the ranks that did not arrive; (2) installs, on worlds of more than one rank, a
// terminate handler and fatal-signal handlers that print which rank failed and why and then call
// MPI_Abort, which Hydra's mpiexec (and srun -K) turn into the end of every rank. A rank killed
// with SIGKILL cannot speak for itself, so (3) a monitor thread watches the other ranks on the same
// node through pidfds, and when one ends before finalize() it names it (rank, pid, host) and ends
// the job. This races with Hydra's own clean-up, which kills the survivors at once and prints only a
// pid (sometimes a survivor's); on this 2-core machine the monitor's line gets out in about three
// runs of four. Peers on other nodes that die are caught by the collective deadline ("no answer:
// dead or hung").
#include "distributed/mpi_runtime.h"

#include <mpi.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>

#include "distributed/internal.h"

namespace braid::distributed::detail {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name) {
  const char* v = env(name);
  return v ? std::atoi(v) : 0;
}

}  // namespace

// Note [Launch detection]
// Hydra (mpiexec) gives its ranks PMI_RANK/PMI_SIZE and MPI_LOCALNRANKS; srun --mpi=pmi2 gives
// PMI_* and SLURM_*; srun --mpi=none gives SLURM_* only. Inside a Slurm allocation Hydra starts its
// proxies with srun, so its ranks also carry the proxy step's SLURM_* (one task per node): PMI_SIZE,
// when present, is therefore the size the launcher promised, and SLURM_STEP_NUM_TASKS only counts
// when no PMI is there at all (the tasks were not wired together).
Launch detect_launch() {
  Launch l;
  const bool slurm_task = env("SLURM_PROCID") && env("SLURM_STEP_ID");
  const bool pmi = env("PMI_RANK") || env("PMI_FD") || env("PMI_SIZE");
  if (env("HYDI_CONTROL_FD") || env("MPI_LOCALNRANKS")) {
    l.kind = "mpiexec";
  } else if (pmi) {
    l.kind = slurm_task ? "srun" : "mpi";
  } else if (env("PMIX_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    l.kind = "mpi";
  } else if (slurm_task) {
    l.kind = "srun";
  } else {
    return l;
  }
  l.expected_size = 0;
  if (env("PMI_SIZE")) {
    l.expected_size = env_int("PMI_SIZE");
    l.expected_from = "PMI_SIZE";
  } else if (l.kind == "srun") {
    for (const char* v : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}) {
      if (env(v)) {
        l.expected_size = env_int(v);
        l.expected_from = v;
        break;
      }
    }
  }
  return l;
}

#ifdef BRAID_DISTRIBUTED_MPI

namespace {

constexpr int kQueryTag = 7001;
constexpr int kReplyTag = 7002;

/// A rank's answer to "how far have you got on group g?" (every rank runs the same binary).
struct ProgressReply {
  int64_t called, completed;
  CallSig latest;
  char now[448];  // the collectives it is executing, on any group
};

MPI_Comm g_control = MPI_COMM_NULL;
std::thread g_control_thread;
std::thread g_monitor_thread;
std::atomic<bool> g_finishing{false};
int g_monitor_wake[2] = {-1, -1};  // a pipe that stops the monitor's poll
std::atomic<bool> g_stop{false};
std::mutex g_ask_mu;
int g_world_rank = 0;
int g_world_size = 1;
char g_prefix[512];  // "braid: rank 1 of 4 (pid 123 on node1)", for the handlers

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  throw DistributedError(::braid::detail::cat("braid: ", what, " failed: ", std::string(msg, static_cast<size_t>(len))));
}

void control_loop() {
  while (!g_stop.load()) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, g_control, &flag, &st) != MPI_SUCCESS) return;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    int64_t q[2];
    MPI_Recv(q, 2, MPI_INT64_T, st.MPI_SOURCE, kQueryTag, g_control, MPI_STATUS_IGNORE);
    const ProgressReport p = group_progress(static_cast<uint64_t>(q[0]));
    ProgressReply reply{};
    reply.called = p.called;
    reply.completed = p.completed;
    reply.latest = p.latest;
    std::snprintf(reply.now, sizeof reply.now, "%s", p.now.c_str());
    MPI_Send(&reply, sizeof reply, MPI_BYTE, st.MPI_SOURCE, kReplyTag, g_control);
  }
}

// Gives the launcher a moment to forward what this rank just printed before it tears the job down.
void let_output_drain() {
  timespec ts{0, 300 * 1000 * 1000};
  nanosleep(&ts, nullptr);
}

// Watches same-node peers: a pidfd becomes readable when its process ends.
void monitor_loop(std::vector<std::pair<int, int64_t>> peers, std::string host) {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, int64_t>> watched;
  for (auto [rank, pid] : peers) {
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    if (fd < 0) continue;  // an older kernel: the launcher alone reports
    fds.push_back({fd, POLLIN, 0});
    watched.emplace_back(rank, pid);
  }
  fds.push_back({g_monitor_wake[0], POLLIN, 0});
  while (!g_stop.load()) {
    if (poll(fds.data(), fds.size(), -1) <= 0) continue;
    if (fds.back().revents) break;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (!fds[i].revents || fds[i].fd < 0) continue;
      if (!g_finishing.load()) {
        std::fprintf(stderr, "%s: rank %d (pid %lld on %s) ended before the job finished; ending the job\n",
                     g_prefix, watched[i].first, static_cast<long long>(watched[i].second), host.c_str());
        std::fflush(stderr);
        let_output_drain();
        if (!g_finishing.load()) MPI_Abort(MPI_COMM_WORLD, 1);
      }
      close(fds[i].fd);
      fds[i].fd = -1;  // poll ignores negative descriptors
    }
  }
  for (size_t i = 0; i + 1 < fds.size(); ++i)
    if (fds[i].fd >= 0) close(fds[i].fd);
}

void write_str(const char* s) {
  ssize_t ignored = write(2, s, std::strlen(s));
  (void)ignored;
}

void on_signal(int sig) {
  char num[16];
  int n = 0;
  char rev[16];
  int v = sig;
  do {
    rev[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v && n < 15);
  for (int i = 0; i < n; ++i) num[i] = rev[n - 1 - i];
  num[n] = '\0';
  const char* name = sig == SIGSEGV ? " (segmentation fault)"
                     : sig == SIGBUS ? " (bus error)"
                     : sig == SIGFPE ? " (floating-point exception)"
                     : sig == SIGILL ? " (illegal instruction)"
                     : sig == SIGTERM ? " (terminated)"
                     : sig == SIGABRT ? " (aborted)"
                                      : "";
  write_str(g_prefix);
  write_str(": killed by signal ");
  write_str(num);
  write_str(name);
  write_str("; the launcher ends the other ranks\n");
  let_output_drain();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void on_terminate() {
  std::string what = "std::terminate was called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
      what = "an exception that is not a std::exception";
    }
  }
  std::fprintf(stderr, "%s failed: %s\nbraid: ending the job because rank %d failed (MPI_Abort)\n", g_prefix,
               what.c_str(), g_world_rank);
  std::fflush(stderr);
  let_output_drain();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace

// Whether braid called MPI_Init_thread: it finalises only an MPI that it initialised itself, so a
// program (or a Python script using mpi4py) that brought its own MPI keeps it.
static bool g_initialized_mpi = false;

void mpi_start(const Launch& launch, bool handle_failures, WorldInfo& info, std::string& table) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    g_initialized_mpi = true;
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (launch.expected_size > 0 && size != launch.expected_size) {
    std::ostringstream os;
    os << "braid: the launcher (" << launch.kind << ") started " << launch.expected_size << " tasks ("
       << launch.expected_from << "=" << launch.expected_size << "), but MPI connected a world of " << size
       << ": the tasks were started without MPI's process manager wiring them together";
    if (launch.kind == "srun")
      os << " (srun --mpi=none, or an MPI plugin that does not match MPICH). Launch with `srun --mpi=pmi2 ...`"
            " (MPICH's PMI-2), or inside the allocation with `mpiexec -n "
         << launch.expected_size << " ...`";
    else
      os << ". Launch with `mpiexec -n " << launch.expected_size << " ...`";
    MPI_Finalize();
    throw DistributedError(os.str());
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw DistributedError(::braid::detail::cat(
        "braid: the MPI library provides thread level ", provided, ", but braid needs MPI_THREAD_MULTIPLE (",
        MPI_THREAD_MULTIPLE, ") for its communication and control threads"));
  }
  g_world_rank = rank;
  g_world_size = size;
  info.rank = rank;
  info.size = size;
  info.launcher = launch.kind;
  MPI_Comm local;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &info.local_rank);
  MPI_Comm_size(local, &info.local_size);
  MPI_Comm_free(&local);

  // The rank table: pid and host of every rank, so that a launcher's "pid 123 died" names a rank.
  struct Entry {
    int64_t pid;
    char host[56];
  } mine{};
  mine.pid = getpid();
  std::snprintf(mine.host, sizeof mine.host, "%s", info.host.c_str());
  std::vector<Entry> all(static_cast<size_t>(size));
  check_mpi(MPI_Allgather(&mine, sizeof(Entry), MPI_BYTE, all.data(), sizeof(Entry), MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgather (rank table)");
  std::ostringstream os;
  for (int r = 0; r < size; ++r)
    os << (r ? ", " : "") << "rank " << r << " = pid " << all[static_cast<size_t>(r)].pid << " on "
       << all[static_cast<size_t>(r)].host;
  table = os.str();
  std::snprintf(g_prefix, sizeof g_prefix, "braid: rank %d of %d (pid %lld on %s)", rank, size,
                static_cast<long long>(mine.pid), mine.host);

  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &g_control), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(g_control, MPI_ERRORS_RETURN);
  g_stop = false;
  g_finishing = false;
  g_control_thread = std::thread(control_loop);
  std::vector<std::pair<int, int64_t>> peers;
  for (int r = 0; r < size; ++r)
    if (r != rank && std::strcmp(all[static_cast<size_t>(r)].host, mine.host) == 0)
      peers.emplace_back(r, all[static_cast<size_t>(r)].pid);
  if (!peers.empty() && pipe(g_monitor_wake) == 0) g_monitor_thread = std::thread(monitor_loop, peers, info.host);
  if (handle_failures && size > 1) {
    std::set_terminate(on_terminate);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_signal);
    // SIGTERM only while nobody catches it: a program that catches it already (Note [Preemption],
    // caught from a training program's first moments) keeps its handler.
    struct sigaction term {};
    if (::sigaction(SIGTERM, nullptr, &term) == 0 && term.sa_handler == SIG_DFL) std::signal(SIGTERM, on_signal);
    // A write to a dead peer's socket must come back as an error for the monitor or the deadline
    // to report, not kill this rank silently.
    std::signal(SIGPIPE, SIG_IGN);
  }
}

void mpi_stop() {
  g_stop = true;
  if (g_control_thread.joinable()) g_control_thread.join();
  // Every rank must stop answering before any frees the control communicator; once all have
  // arrived here, a peer that exits is finishing, not failing.
  MPI_Barrier(MPI_COMM_WORLD);
  g_finishing = true;
  if (g_monitor_thread.joinable()) {
    char c = 0;
    ssize_t ignored = write(g_monitor_wake[1], &c, 1);
    (void)ignored;
    g_monitor_thread.join();
    close(g_monitor_wake[0]);
    close(g_monitor_wake[1]);
  }
  if (g_control != MPI_COMM_NULL) MPI_Comm_free(&g_control);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && g_initialized_mpi) MPI_Finalize();
}

void mpi_abort(const std::string& message, int code) {
  std::fprintf(stderr, "%s: %s\n", g_prefix, message.c_str());
  std::fflush(stderr);
  let_output_drain();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::string who_did_not_arrive(uint64_t group_id, int64_t seq, const CallSig& mine, const std::vector<int>& world_ranks,
                               std::string (*describe)(const CallSig&)) {
  std::lock_guard<std::mutex> lock(g_ask_mu);
  struct Ask {
    int world_rank;
    int64_t query[2];
    ProgressReply reply;
    MPI_Request send = MPI_REQUEST_NULL, recv = MPI_REQUEST_NULL;
    bool answered = false;
  };
  std::vector<Ask> asks;
  asks.reserve(world_ranks.size());
  for (int w : world_ranks) {
    if (w == g_world_rank) continue;
    Ask& a = asks.emplace_back();
    a.world_rank = w;
    a.query[0] = static_cast<int64_t>(group_id);
    a.query[1] = seq;
  }
  for (Ask& a : asks) {
    MPI_Irecv(&a.reply, sizeof a.reply, MPI_BYTE, a.world_rank, kReplyTag, g_control, &a.recv);
    MPI_Isend(a.query, 2, MPI_INT64_T, a.world_rank, kQueryTag, g_control, &a.send);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  size_t pending = asks.size();
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    for (Ask& a : asks) {
      if (a.answered) continue;
      int flag = 0;
      MPI_Test(&a.recv, &flag, MPI_STATUS_IGNORE);
      if (flag) {
        a.answered = true;
        --pending;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // Note [What a late rank is doing]
  // A rank behind on this group is named with its latest call here (and whether that call has
  // finished) and with whatever collective it is executing now on any group, so a deadlock across
  // groups or a rank stuck in its own code shows as such. A rank at the same call number but in a
  // different collective (one rank skipped a call, or called another) is named with its call: MPI
  // may hang on such a pairing, and this is then the only report (BRAID_DISTRIBUTED_DEBUG=1 catches
  // it at the call itself).
  std::ostringstream late, other;
  int n_late = 0, n_other = 0;
  for (Ask& a : asks) {
    const ProgressReply& r = a.reply;
    if (!a.answered) {
      MPI_Cancel(&a.recv);
      MPI_Request_free(&a.recv);
      late << (n_late++ ? ", " : "") << a.world_rank << " (no answer: dead or hung)";
    } else if (r.called < 0) {
      late << (n_late++ ? ", " : "") << a.world_rank << " (has not created this group)";
    } else if (r.called < seq) {
      late << (n_late++ ? ", " : "") << a.world_rank << " (its latest call on this group is #" << r.called;
      if (r.called > 0) late << " " << describe(r.latest) << (r.completed >= r.called ? ", finished" : ", unfinished");
      late << "; now " << (r.now[0] ? std::string("in ") + r.now : std::string("in no collective")) << ")";
    } else if (r.called == seq && r.latest != mine) {
      other << (n_other++ ? ", " : "") << a.world_rank << " called " << describe(r.latest) << " as #" << seq;
    }
    if (a.send != MPI_REQUEST_NULL) MPI_Request_free(&a.send);
  }
  std::string out;
  if (n_late > 0) out = "ranks that did not arrive: " + late.str();
  if (n_other > 0)
    out += ::braid::detail::cat(out.empty() ? "" : "; ", "ranks in a different collective: ", other.str(),
                                " (BRAID_DISTRIBUTED_DEBUG=1 reports a mismatch at the call)");
  if (out.empty()) return "every rank has called it, so the transfer itself is stuck";
  return out;
}

#endif  // BRAID_DISTRIBUTED_MPI

}  // namespace braid::distributed::detail
