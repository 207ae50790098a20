// init(), the world and the settings; the parts of the runtime that do not depend on MPI. Whether
// MPI is started is decided by how the program was launched: a plain run is a world of one and
// never touches MPI, so tests and notebooks need no launcher.
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <unistd.h>

#include "braid/ops.h"
#include "distributed/internal.h"
#include "distributed/mpi_runtime.h"
#include "optim/rank_agreement.h"
#include "core/knob_read.h"

namespace braid::distributed {

namespace detail {

Settings& settings() {
  static Settings s;
  return s;
}

namespace {
std::mutex g_registry_mu;
std::vector<GroupProgress*> g_registry;
}  // namespace

void register_group(GroupProgress* g) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_registry.push_back(g);
}

void unregister_group(GroupProgress* g) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  std::erase(g_registry, g);
}

ProgressReport group_progress(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  ProgressReport r;
  for (GroupProgress* g : g_registry) {
    std::lock_guard<std::mutex> g_lock(g->mu);
    if (g->id == id) {
      r.called = g->called.load();
      r.completed = g->completed.load();
      r.latest = g->latest;
    }
    if (g->running[0] != 0 && g->describe)
      r.now += ::braid::detail::cat(r.now.empty() ? "" : "; ", "#", g->running_seq, " ", g->describe(g->running),
                                    " on group '", g->name, "'");
  }
  return r;
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

void check_collective_tensor(const Tensor& t, const char* op) {
  BRAID_CHECK(t.defined(), op, ": the tensor is undefined");
  BRAID_CHECK(t.is_contiguous(), op, ": the tensor (shape ", shape_str(t.shape()),
              ") must be contiguous; call .contiguous() first");
}

void check_peer(int peer, int size, const char* op) {
  BRAID_CHECK_T(IndexError, peer >= 0 && peer < size, op, ": rank ", peer, " is not in the group (ranks 0..", size - 1,
                ")");
}

void check_all_reduce(const Tensor& t, ReduceOp op, const AllReduceOptions& options) {
  check_collective_tensor(t, "all_reduce");
  const bool floating = is_floating(t.dtype());
  BRAID_CHECK_T(TypeError, floating || op != ReduceOp::Average, "all_reduce: average of a ", dtype_name(t.dtype()),
                " tensor; use sum, or cast to a floating dtype");
  BRAID_CHECK_T(TypeError, floating || options.wire_dtype == WireDType::Native,
                "all_reduce: a compressed wire dtype needs floating-point data, got ", dtype_name(t.dtype()));
  const bool half = t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16;
  BRAID_CHECK_T(TypeError, !half || op == ReduceOp::Sum || op == ReduceOp::Average, "all_reduce: ",
                reduce_op_name(op), " of ", dtype_name(t.dtype()), " is not supported; cast to float32");
}

std::string describe_op(const char* op, const Tensor& t, const std::string& extra) {
  std::ostringstream os;
  os << op << "(" << extra << (extra.empty() ? "" : ", ") << t.numel() << " " << dtype_name(t.dtype()) << ")";
  return os.str();
}

}  // namespace detail

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Average: return "average";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

namespace {

struct Runtime {
  bool initialized = false;
  bool uses_mpi = false;
  WorldInfo info;
  ProcessGroupPtr world;
  std::string table;
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

std::mutex g_init_mu;

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

const WorldInfo& init(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_init_mu);
  Runtime& rt = runtime();
  if (rt.initialized) return rt.info;
  auto& s = detail::settings();
  s.timeout_seconds = options.timeout_seconds > 0 ? options.timeout_seconds : braid::detail::knob_number("BRAID_TIMEOUT");
  s.debug = options.debug >= 0 ? options.debug > 0 : braid::detail::knob_flag("BRAID_DISTRIBUTED_DEBUG");
  const detail::Launch launch = detail::detect_launch();
  rt.info.host = hostname();
  if (launch.kind == "none") {
    rt.info.launcher = "none";
    rt.world = detail::make_local_group();
    rt.table = "rank 0 = pid " + std::to_string(getpid()) + " on " + rt.info.host;
  } else {
#ifdef BRAID_DISTRIBUTED_MPI
    detail::mpi_start(launch, options.handle_failures, rt.info, rt.table);
    rt.uses_mpi = true;
    rt.world = detail::stage_device_tensors(detail::make_mpi_world());
#else
    throw DistributedError(::braid::detail::cat(
        "braid: this process was started by ", launch.kind, " as one of several ranks, but braid was built "
        "without MPI; rebuild with MPICH (apt-get install libmpich-dev; meson setup -Dmpi=enabled)"));
#endif
  }
  rt.initialized = true;
  // Note [Skipping a step on every rank] in src/optim/grad_scaler.cpp: GradScalers agree on the world.
  optim::detail::set_any_rank_hook([](bool local) {
    Tensor flag = full({1}, local ? 1.0 : 0.0, kInt32);
    world()->all_reduce(flag, ReduceOp::Max);
    return flag.item() > 0;
  });
  std::atexit([] { finalize(); });
  return rt.info;
}

bool is_initialized() { return runtime().initialized; }

void finalize() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  Runtime& rt = runtime();
  if (!rt.initialized) return;
  rt.initialized = false;
  optim::detail::set_any_rank_hook(nullptr);
  rt.world.reset();
#ifdef BRAID_DISTRIBUTED_MPI
  if (rt.uses_mpi) {
    detail::stop_mpi_groups();
    detail::mpi_stop();
  }
#endif
}

void set_timeout(double seconds) {
  BRAID_CHECK(seconds > 0, "set_timeout: expected a positive number of seconds, got ", seconds);
  detail::settings().timeout_seconds = seconds;
}

void set_debug(bool on) { detail::settings().debug = on; }

const WorldInfo& world_info() {
  if (!is_initialized()) init();
  return runtime().info;
}

std::string rank_table() {
  if (!is_initialized()) init();
  return runtime().table;
}

ProcessGroupPtr world() {
  if (!is_initialized()) init();
  return runtime().world;
}

int get_rank(const ProcessGroupPtr& group) {
  if (group) return group->rank();
  return is_initialized() ? world_info().rank : 0;
}

int get_world_size(const ProcessGroupPtr& group) {
  if (group) return group->size();
  return is_initialized() ? world_info().size : 1;
}

Tensor all_reduce(Tensor tensor, ReduceOp op, const ProcessGroupPtr& group) {
  (group ? group : world())->all_reduce(tensor, op);
  return tensor;
}

Tensor broadcast(Tensor tensor, int src, const ProcessGroupPtr& group) {
  (group ? group : world())->broadcast(tensor, src);
  return tensor;
}

Tensor all_gather(const Tensor& tensor, const ProcessGroupPtr& group) {
  return (group ? group : world())->all_gather(tensor);
}

void barrier(const ProcessGroupPtr& group) { (group ? group : world())->barrier(); }

void abort_job(const std::string& message, int code) {
#ifdef BRAID_DISTRIBUTED_MPI
  if (runtime().uses_mpi) detail::mpi_abort(message, code);
#endif
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace braid::distributed
