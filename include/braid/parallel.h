// The thread count of CPU kernels and of OpenBLAS, set by one knob.
#pragma once

namespace braid {

/// Threads used by braid's CPU kernels and by OpenBLAS. The default is BRAID_NUM_THREADS when set,
/// else the machine's cores divided by the MPI ranks on this node (so that `mpiexec -n 2` on two
/// cores does not oversubscribe), at least 1.
int get_num_threads();
void set_num_threads(int n);

}  // namespace braid
