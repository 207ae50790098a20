// Signals around oneDNN's kernels (Note [Signals and oneDNN's kernels]).
#include <omp.h>
#include <pthread.h>

#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

#ifdef BRAID_HAVE_DNNL

// Note [Signals and oneDNN's kernels]
// oneDNN 2.6's generated float32 GEMM kernels (behind dnnl_sgemm, and so behind braid's float32
// matmuls and oneDNN's gemm-based convolutions) point the stack pointer at a heap workspace while
// they run (oneDNN fixed this in 3.11). A signal handled on a thread inside such a kernel has its
// frame written there, over whatever the heap holds: a preempted Slurm job's SIGUSR1 caught by
// braid-train corrupted glibc's heap this way (about one run in twenty of the preemption test),
// and Python's SIGINT or a sampling profiler's SIGPROF would do the same. So asynchronous signals
// are blocked on every thread that runs oneDNN's kernels: on the calling thread for the duration of
// the call (a signal that arrives meanwhile is handled when the call returns, microseconds later),
// on the OpenMP workers for good (a signal sent to the process goes to a thread that does not block
// it, such as the caller between calls). Synchronous signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGTRAP, SIGSYS) and SIGABRT stay open, so that a crash inside a kernel still reports itself.
// The cost is two rt_sigprocmask calls per outermost guard, as much as a small product takes: a
// guard inside another on the same thread, or on a worker that blocks them for good, makes no call,
// so a batch of small products takes one guard around the batch (measured: benchmarks/README.md,
// What changed what, the signal guard).
namespace {

// Guards alive on this thread, counting a worker's blocking for good as one that never ends.
thread_local int t_depth = 0;

const sigset_t& asynchronous_signals() {
  static const sigset_t set = [] {
    sigset_t s;
    sigfillset(&s);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&s, sig);
    return s;
  }();
  return set;
}

}  // namespace

OneDnnSignalGuard::OneDnnSignalGuard() {
  if (t_depth++ > 0) return;
  pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), &old_);
  // OpenMP's workers belong to the thread that starts a parallel region; workers created while
  // this thread blocks the signals inherit its mask, the others block them here, once per team
  // size this thread has asked for.
  thread_local int workers_blocked = 1;
  const int team = omp_get_max_threads();
  if (team > workers_blocked) {
#pragma omp parallel num_threads(team)
    if (omp_get_thread_num() != 0 && t_depth == 0) {
      t_depth = 1;
      pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), nullptr);
    }
    workers_blocked = team;
  }
}

OneDnnSignalGuard::~OneDnnSignalGuard() {
  if (--t_depth == 0) pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

#endif

}  // namespace braid::detail
