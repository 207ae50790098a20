// Sets of oneDNN memory objects kept with a primitive and lent to one call at a time (Note [Memory
// objects kept with the plan] in conv_dnnl.cpp), and running a primitive on an argument array.
// Internal to the CPU backend.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

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

/// Runs prim on n arguments through oneDNN's C entry point (no argument map to build).
inline void run_primitive(const dnnl::primitive& prim, dnnl::stream& stream, const dnnl_exec_arg_t* args, int n,
                          const char* what) {
  dnnl::error::wrap_c_api(dnnl_primitive_execute(prim.get(), stream.get(), n, args), what);
}

}  // namespace braid::detail
