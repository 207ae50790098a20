// The thread count of CPU kernels and of OpenBLAS, set by one knob.
#pragma once

#include <string>

namespace braid {

/// Threads used by braid's CPU kernels and by OpenBLAS. The default is BRAID_NUM_THREADS when set,
/// else the machine's cores divided by the MPI ranks on this node (so that `mpiexec -n 2` on two
/// cores does not oversubscribe), at least 1.
int get_num_threads();
void set_num_threads(int n);

/// Empty when BLAS runs on braid's OpenMP pool; otherwise a warning that names the cause and the
/// fix: the OpenBLAS in use keeps a thread pool of its own (Note [One thread pool] in meson.build),
/// as when a program loaded Debian's pthread build first (Python: NumPy or PyTorch imported before
/// braid), whose threads compete with braid's.
std::string blas_threading_warning();

/// Caps the calling thread's own braid work at n threads (at most get_num_threads() of the rest of
/// the process) while alive, then restores the previous cap. The DataLoader's prefetch thread makes
/// its batches under ThreadLimitGuard(1), as PyTorch's loader workers run with one thread (Note [One
/// thread for the loader's worker] in src/data/loader.cpp).
class ThreadLimitGuard {
 public:
  explicit ThreadLimitGuard(int n);
  ~ThreadLimitGuard();
  ThreadLimitGuard(const ThreadLimitGuard&) = delete;
  ThreadLimitGuard& operator=(const ThreadLimitGuard&) = delete;

 private:
  int prev_;
};

}  // namespace braid
