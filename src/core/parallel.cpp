// The one thread-count knob shared by braid's OpenMP kernels and OpenBLAS. The default is read
// lazily on first use, so that a program can still set BRAID_NUM_THREADS before touching a tensor,
// and so that OpenBLAS gets the same count before braid's first gemm.
#include "braid/parallel.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <mutex>

#include "braid/error.h"
#include "core/knob_read.h"

namespace braid {
namespace {

std::atomic<int> g_num_threads{1};
std::once_flag g_init;
thread_local int t_limit = 0;  // ThreadLimitGuard's cap on this thread, 0 for none

// The leading integer of an environment variable (SLURM writes values like "2(x3)"), or 0 when the
// variable is unset or does not start with a positive integer.
int env_count(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return 0;
  errno = 0;
  const long n = std::strtol(v, nullptr, 10);
  return errno == 0 && n > 0 ? static_cast<int>(std::min<long>(n, INT_MAX)) : 0;
}

// Note [Default thread count]
// Ranks of an MPI job that share a node would each start one thread per core and oversubscribe the
// node, so the cores are divided among the local ranks, as the launcher (MPICH Hydra, Open MPI,
// Slurm) reports them. omp_get_num_procs counts the cores this process may run on.
int default_num_threads() {
  if (const int64_t n = detail::knob_count("BRAID_NUM_THREADS"); n > 0) return static_cast<int>(std::min<int64_t>(n, INT_MAX));
  int ranks = env_count("MPI_LOCALNRANKS");
  if (ranks == 0) ranks = env_count("OMPI_COMM_WORLD_LOCAL_SIZE");
  // An srun step says it per step ("2" or "2(x3),1"); the allocation's value is the fallback.
  if (ranks == 0) ranks = env_count("SLURM_STEP_TASKS_PER_NODE");
  if (ranks == 0) ranks = env_count("SLURM_NTASKS_PER_NODE");
  return std::max(1, omp_get_num_procs() / std::max(1, ranks));
}

void apply(int n) {
  g_num_threads.store(n, std::memory_order_relaxed);
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
}

void ensure_initialised() {
  std::call_once(g_init, [] { apply(default_num_threads()); });
}

}  // namespace

int get_num_threads() {
  ensure_initialised();
  const int n = g_num_threads.load(std::memory_order_relaxed);
  return t_limit > 0 && t_limit < n ? t_limit : n;
}

void set_num_threads(int n) {
  BRAID_CHECK(n >= 1, "set_num_threads: expected a positive thread count, got ", n);
  ensure_initialised();
  apply(n);
}

std::string blas_threading_warning() {
  if (openblas_get_parallel() != 1) return "";  // 0: sequential, 2: OpenMP (braid's pool)
  return "braid: the OpenBLAS in use runs its own pthread pool (its pthread build was loaded first, e.g. by NumPy "
         "or PyTorch imported before braid, or no OpenMP build is installed), and its threads compete with braid's "
         "OpenMP threads: multi-threaded steps slow down. Load braid first (in Python: import braid before numpy and "
         "torch), install libopenblas0-openmp, or set OMP_WAIT_POLICY=passive.";
}

ThreadLimitGuard::ThreadLimitGuard(int n) : prev_(t_limit) {
  BRAID_CHECK(n >= 1, "ThreadLimitGuard: expected a positive thread count, got ", n);
  t_limit = n;
  omp_set_num_threads(get_num_threads());  // this thread's OpenMP default, which oneDNN reads
}

ThreadLimitGuard::~ThreadLimitGuard() {
  t_limit = prev_;
  omp_set_num_threads(get_num_threads());
}

}  // namespace braid
