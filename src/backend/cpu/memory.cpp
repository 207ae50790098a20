// Host memory for CPU tensors: 64-byte aligned blocks (a cache line, and what AVX-512 loads like)
// with a cache of large freed blocks, and the byte copies that move tensors to and from devices.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

namespace {

// Note [Block cache]
// Large blocks come from mmap, so every fresh one costs a page fault per 4 KiB on first touch; in a
// training loop the same sizes are freed and asked for again each step. Freed blocks of at least
// kCacheMin bytes are kept, by exact size, up to kCacheMax bytes in all, and handed out again, as
// PyTorch's caching allocators do. Sanitizer builds skip the cache so that use-after-free is caught.
constexpr int64_t kCacheMin = 1 << 20;
constexpr int64_t kCacheMax = int64_t{1} << 30;
constexpr size_t kAlignment = 64;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUseCache = false;
#else
constexpr bool kUseCache = true;
#endif

class BlockCache {
 public:
  void* take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(bytes);
    if (it == blocks_.end()) return nullptr;
    void* p = it->second;
    blocks_.erase(it);
    cached_ -= bytes;
    return p;
  }
  bool give(void* p, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + bytes > kCacheMax) return false;
    blocks_.emplace(bytes, p);
    cached_ += bytes;
    return true;
  }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [bytes, p] : blocks_) std::free(p);
    blocks_.clear();
    cached_ = 0;
  }
  ~BlockCache() { clear(); }

 private:
  std::mutex mu_;
  std::multimap<int64_t, void*> blocks_;
  int64_t cached_ = 0;
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // outlives static tensors freed at exit
  return *c;
}

}  // namespace

void* CpuBackend::allocate(Device device, int64_t nbytes) {
  void* p = kUseCache && nbytes >= kCacheMin ? cache().take(nbytes) : nullptr;
  if (!p) p = std::aligned_alloc(kAlignment, static_cast<size_t>(nbytes));
  if (!p) {
    const int64_t cached = cache().cached();
    cache().clear();  // free the cache and retry once
    p = std::aligned_alloc(kAlignment, static_cast<size_t>(nbytes));
    if (!p) throw Error(cat("out of memory allocating ", nbytes, " bytes on ", device.str(), " (", cached,
                            " bytes were cached and have been freed)"));
  }
  return p;
}

void CpuBackend::deallocate(Device, void* p, int64_t nbytes) {
  if (!(kUseCache && nbytes >= kCacheMin && cache().give(p, nbytes))) std::free(p);
}

int64_t CpuBackend::cached_bytes(Device) { return cache().cached(); }
void CpuBackend::empty_cache(Device) { cache().clear(); }

void CpuBackend::copy_from_host(Device, const void* host, void* dev, int64_t nbytes) {
  if (nbytes > 0) std::memcpy(dev, host, static_cast<size_t>(nbytes));
}
void CpuBackend::copy_to_host(Device, const void* dev, void* host, int64_t nbytes) {
  if (nbytes > 0) std::memcpy(host, dev, static_cast<size_t>(nbytes));
}

}  // namespace braid::detail
