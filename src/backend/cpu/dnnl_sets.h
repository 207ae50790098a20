// Sets of oneDNN memory objects kept with a primitive and lent to one call at a time (Note [Memory
// objects kept with the plan] in conv.cpp), and running a primitive on an argument array.
// Internal to the CPU backend.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <sstream>
#include <string>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "braid/error.h"

namespace braid::detail {

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

}  // namespace braid::detail
