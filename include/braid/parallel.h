// The thread count of CPU kernels and of OpenBLAS, set by one knob.
#pragma once

namespace braid {

/// Threads used by braid's CPU kernels and by OpenBLAS. The default is BRAID_NUM_THREADS when set,
/// else the machine's cores divided by the MPI ranks on this node (so that `mpiexec -n 2` on two
/// cores does not oversubscribe), at least 1.
int get_num_threads();
void set_num_threads(int n);

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
