// The oneDNN plumbing that the CPU backend's primitives through it share (convolutions in conv.cpp,
// products in matmul_weight.cpp and matmul_int8.cpp): the engine, caches of built primitives,
// scratch memory from the block cache, sets of memory objects kept with a primitive and lent to one
// call at a time (Note [Memory objects kept with the plan], below), and running a primitive on
// an argument array. Internal to the CPU backend; included only where BRAID_HAVE_DNNL is defined.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "braid/error.h"
#include "braid/tensor.h"

namespace braid::detail {

/// The CPU engine that every primitive of the backend is built for and runs on.
dnnl::engine& engine();

/// A cache of built primitives (plans) by key, shared by every thread: get() builds a key's plan on
/// first use with build(), which returns null where oneDNN has no kernel (or throws dnnl::error,
/// taken as the same), and remembers that too, so that the caller's fallback serves the key from
/// then on without asking again. It holds at most kMaxPlans keys (a model whose input sizes vary
/// from call to call would otherwise grow it without end): past that it starts afresh; a plan in
/// use stays alive through its shared_ptr while the cache lets go of it.
template <typename Key, typename Plan, typename Map = std::map<Key, std::shared_ptr<const Plan>>>
class PlanCache {
 public:
  static constexpr size_t kMaxPlans = 1024;

  template <typename Build>
  std::shared_ptr<const Plan> get(const Key& key, const Build& build) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    std::shared_ptr<const Plan> made;
    try {
      made = build();
    } catch (const dnnl::error&) {  // no kernel for this key: the caller's fallback serves it
    }
    if (plans_.size() >= kMaxPlans) plans_.clear();
    plans_.emplace(key, made);
    return made;
  }

 private:
  std::mutex mu_;
  Map plans_;
};

/// A hash of a fixed-length key of integers, for a PlanCache on an unordered_map.
struct ArrayHash {
  template <size_t N>
  size_t operator()(const std::array<int64_t, N>& k) const {
    size_t h = 0;
    for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

/// Scratch memory from the CPU backend's block cache, for an operand in a kernel's layout.
class Scratch {
 public:
  explicit Scratch(size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  int64_t bytes_;
  void* p_ = nullptr;
};

/// A float32 memory descriptor of dims in the layout the primitive chooses.
inline dnnl::memory::desc any_desc(const dnnl::memory::dims& dims) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

/// Reorders the buffer at from (layout from_desc) into the one at to (layout to_desc) and waits: a
/// weight put once into the layout a kernel chose, to be kept with its storage.
void reorder_now(const dnnl::memory::desc& from_desc, const void* from, const dnnl::memory::desc& to_desc, void* to,
                 dnnl::stream& stream);

/// The free sets of one primitive; a call takes one (or makes one with make()) and gives it back.
template <typename Set>
class SetPool {
 public:
  template <typename Make>
  std::unique_ptr<Set> take(const Make& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        std::unique_ptr<Set> s = std::move(free_.back());
        free_.pop_back();
        return s;
      }
    }
    return make();
  }
  void give(std::unique_ptr<Set> s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(s));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<Set>> free_;
};

/// A set taken from a pool for the lifetime of a call.
template <typename Set>
class Lease {
 public:
  template <typename Make>
  Lease(SetPool<Set>& pool, const Make& make) : pool_(pool), set_(pool.take(make)) {}
  ~Lease() { pool_.give(std::move(set_)); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Set& operator*() const { return *set_; }

 private:
  SetPool<Set>& pool_;
  std::unique_ptr<Set> set_;
};

/// A memory object of desc with no buffer yet.
inline dnnl::memory unbound(const dnnl::memory::desc& desc, const dnnl::engine& engine) {
  return dnnl::memory(desc, engine, DNNL_MEMORY_NONE);
}

/// m pointed at the buffer at ptr; its C handle, for an argument array.
inline dnnl_memory_t point(const dnnl::memory& m, const void* ptr) {
  m.set_data_handle(const_cast<void*>(ptr));
  return m.get();
}

/// The message of a failed run: what, oneDNN's status and the shape of each argument ("2x3x4").
[[gnu::cold]] inline std::string run_failure(const char* what, dnnl_status_t status, const dnnl_exec_arg_t* args,
                                             int n) {
  std::ostringstream out;
  out << what << ": oneDNN could not run the primitive ("
      << (status == dnnl_out_of_memory       ? "out of memory"
          : status == dnnl_invalid_arguments ? "invalid arguments"
          : status == dnnl_unimplemented     ? "no implementation"
                                             : "runtime error")
      << ", status " << static_cast<int>(status) << ") on";
  for (int i = 0; i < n; ++i) {
    const int a = args[i].arg;
    out << (i ? ", " : " ");
    if (a == DNNL_ARG_SRC)
      out << "src";
    else if (a == DNNL_ARG_WEIGHTS)
      out << "weights";
    else if (a == DNNL_ARG_BIAS)
      out << "bias";
    else if (a == DNNL_ARG_DST)
      out << "dst";
    else if (a == DNNL_ARG_SCRATCHPAD)
      out << "scratchpad";
    else
      out << "argument " << a;
    const dnnl_memory_desc_t* md = nullptr;
    if (dnnl_memory_get_memory_desc(args[i].memory, &md) != dnnl_success || md == nullptr) {
      out << " ?";
      continue;
    }
    for (int d = 0; d < md->ndims; ++d) out << (d ? "x" : " ") << md->dims[d];
  }
  return out.str();
}

/// An epilogue step (FusedKernels::EpilogueStep) as a oneDNN binary post-op on an (M, N) product: its
/// algorithm, and its operand's dims, {1, 1} for a number, {1, N} for one value per column, {M, N}
/// for one per element; false where the operand is none of those (not float32, not contiguous,
/// another count).
inline bool binary_post_op(const FusedKernels::EpilogueStep& s, int64_t m, int64_t n, dnnl::algorithm& alg,
                           dnnl::memory::dims& dims) {
  const int64_t count = s.operand.defined() ? s.operand.numel() : 1;
  if (s.operand.defined() &&
      (s.operand.dtype() != kFloat32 || !s.operand.is_contiguous() || (count != 1 && count != n && count != m * n)))
    return false;
  alg = s.kind == ChainStep::Kind::Add   ? dnnl::algorithm::binary_add
        : s.kind == ChainStep::Kind::Sub ? dnnl::algorithm::binary_sub
        : s.kind == ChainStep::Kind::Mul ? dnnl::algorithm::binary_mul
                                         : dnnl::algorithm::binary_div;
  dims = {count == m * n ? m : 1, count == 1 ? 1 : n};  // M * N = N only when M = 1
  return true;
}

/// Runs prim on n arguments through oneDNN's C entry point (no argument map to build). A failure (in
/// practice, memory for the primitive's scratchpad) throws braid::Error naming what ran ("conv2d",
/// "matmul") and the shape of every argument.
inline void run_primitive(const dnnl::primitive& prim, dnnl::stream& stream, const dnnl_exec_arg_t* args, int n,
                          const char* what) {
  const dnnl_status_t status = dnnl_primitive_execute(prim.get(), stream.get(), n, args);
  if (status != dnnl_success) throw Error(run_failure(what, status, args, n));
}

/// Whether every defined tensor of ts is float32 and contiguous.
inline bool float32s(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && (t->dtype() != kFloat32 || !t->is_contiguous())) return false;
  return true;
}

/// A float32 number as its bits (the precision oneDNN takes post-ops' numbers in), for a cache key;
/// and back.
inline int64_t float_bits(double v) {
  const float f = static_cast<float>(v);
  int32_t out;
  std::memcpy(&out, &f, sizeof f);
  return static_cast<int64_t>(out);
}
inline float from_float_bits(int64_t bits) {
  const int32_t v = static_cast<int32_t>(bits);
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}

/// Appends an epilogue's activation and its affine (Backend::Epilogue: kind, a, b, scale, shift) to
/// ops as eltwise post-ops: HardSigmoid as a linear map and a clip; the affine after the activation
/// as one more linear map.
void append_epilogue(dnnl::post_ops& ops, Epilogue::Kind kind, float a, float b, float scale, float shift);

/// A weight reordered into a kernel's layout, kept with the weight's storage.
struct KeptLayout {
  dnnl::memory::desc desc;
  Scratch data;
  explicit KeptLayout(const dnnl::memory::desc& d) : desc(d), data(d.get_size()) {}
};

/// w (plain layout `plain`) in the layout `chosen`, kept with w's storage under `name` and w's
/// offset (Note [Reordered weights kept]).
std::shared_ptr<KeptLayout> kept_layout(const char* name, const dnnl::memory::desc& plain,
                                        const dnnl::memory::desc& chosen, const Tensor& w, dnnl::stream& stream);

/// A built primitive of two inputs and an output (with a bias and a scratchpad where it takes them),
/// the layouts it reads and writes, and the plain ones of braid's tensors: run_reordered() runs it
/// on plain buffers.
struct ReorderedPrimitive {
  dnnl::primitive prim;
  std::array<int, 3> args{};                        // oneDNN's argument ids: two inputs, then the output
  std::array<dnnl::memory::desc, 3> plain, chosen;  // braid's layout and the kernel's, per argument
  // Where the layouts differ: the reorder into the kernel's (inputs) or out of it (the output),
  // made once with the plan rather than on every call (a primitive-cache lookup and a dozen
  // allocations each time).
  std::array<std::optional<dnnl::reorder>, 3> reorders;
  // An output that starts as a residual (a sum post-op's, Note [Residual as a post-op] in
  // conv.cpp), from its plain layout into the kernel's, where make_reorders was asked for it.
  std::optional<dnnl::reorder> residual_in;
  // The kernel's scratch memory where the plan takes it from braid's block cache for each call (a
  // Winograd convolution's transformed tiles), rather than oneDNN keeping it with the primitive.
  std::optional<dnnl::memory::desc> scratchpad;
  // Note [Memory objects kept with the plan]
  // A call hands oneDNN its buffers as memory objects: braid's operands, the scratch in the
  // kernel's layouts, the bias, the scratchpad. Made afresh on each call they and their argument
  // map were half a small 1x1 convolution's time (measured: benchmarks/README.md, What changed
  // what, ONNX inference, run X). A plan therefore keeps sets of them
  // (Bound), made on first use with no buffer; a call takes one, points its objects at the call's
  // buffers (set_data_handle) and gives it back, so calls on several threads at once each have
  // their own. The primitives run through oneDNN's C entry point on an array of arguments.
  struct Bound {
    std::array<dnnl::memory, 3> user, inner;  // per argument: braid's layout, the kernel's where it differs
    dnnl::memory bias, pad, residual;
  };
  std::unique_ptr<SetPool<Bound>> pool = std::make_unique<SetPool<Bound>>();

  /// Makes the reorders where chosen and plain differ, and residual_in where residual is set and
  /// the output's differ.
  void make_reorders(bool residual);
};

/// Runs p on plain buffers: inputs reordered into the kernel's layouts where they differ, the
/// output computed in its layout and reordered back. bias is always plain. weight, when given, is
/// in1's tensor, whose reordered copy is kept (Note [Reordered weights kept]); residual, when given,
/// is what the output starts as (a sum post-op). what names the op in errors ("convolution") and
/// its kept weights.
void run_reordered(const ReorderedPrimitive& p, const char* what, const void* in0, const void* in1, const void* bias,
                   void* out, const Tensor* weight = nullptr, const void* residual = nullptr);

}  // namespace braid::detail
