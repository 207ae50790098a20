// The CPU backend's single instance. A function-local static, so that it exists before first use
// whatever the order of static initialisation, and the registry (backend/registry.cpp) reaches it
// through cpu_backend() rather than through a self-registering global. With oneDNN built in, also
// the switch that every path into it asks first (Note [oneDNN's team size]).
#include "backend/cpu/cpu_backend.h"

#ifdef BRAID_HAVE_DNNL
#include <omp.h>

#include "braid/parallel.h"
#include "core/knob_read.h"
#endif

namespace braid::detail {

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

#ifdef BRAID_HAVE_DNNL
// Note [oneDNN's team size]
// oneDNN sizes its parallel regions by omp_get_max_threads() on the calling thread, read when a
// primitive is made (a brgemm kernel plans its blocks for that many threads, and keeps the count)
// and when it runs. That count is per thread: braid applies BRAID_NUM_THREADS (or set_num_threads)
// on the thread that first asks for it, so a program whose first braid work is a oneDNN product
// (Python loading an ONNX model made of MatMuls), or any other thread (a data loader, a Python
// thread), gave oneDNN every core whatever braid was told. Every path into oneDNN asks
// onednn_enabled() first, which sets the calling thread's count to braid's (two loads when they
// agree already).
bool onednn_enabled() {
  static const bool on = detail::knob_flag("BRAID_ONEDNN");
  if (on && !omp_in_parallel()) {
    const int n = get_num_threads();
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
  }
  return on;
}
#endif

}  // namespace braid::detail
