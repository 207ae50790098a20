// Host memory for CPU tensors: 64-byte aligned blocks (a cache line, and what AVX-512 loads like)
// with a cache of large freed blocks, and the byte copies that move tensors to and from devices.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

namespace {

// Note [Block cache]
// Large blocks come from mmap, so every fresh one costs a page fault per 4 KiB on first touch; in a
// training loop or an inference server the same sizes are freed and asked for again each step, and
// the faults cost a convolution more than its arithmetic (measured: benchmarks/README.md, What
// changed what, the block cache). Freed
// blocks of at least kCacheMin bytes (glibc's initial mmap threshold) are kept and handed out again,
// as PyTorch's caching allocators and onnxruntime's arena do: a request takes the smallest cached
// block of its size class (block_size) up to twice its size. What the cache holds is resident
// memory no tensor uses, so it is bounded by the working set: at most three times the peak of live
// tensor bytes (max_memory_allocated, at least kCacheFloor; oneDNN's scratch buffers come from here
// too and are not live tensors), the least recently freed blocks unmapped first. Unbounded, it grew
// to 4x the live peak in PP-OCR's detector (a block per size of every activation ever freed); at
// twice the peak the detector's cyclic order of sizes evicted blocks just before their reuse, so
// the bound is three times (measured: benchmarks/README.md, Peak memory). Sanitizer builds skip
// the cache so that use-after-free is caught.
constexpr int64_t kCacheMin = 1 << 17;
constexpr int64_t kCacheFloor = int64_t{64} << 20;
constexpr size_t kAlignment = 64;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUseCache = false;
#else
constexpr bool kUseCache = true;
#endif

// Blocks of kCacheMin bytes and more are mapped and unmapped directly, not taken from malloc: glibc
// raises its mmap threshold after the first large free and then serves such sizes from its heap,
// which fragments and never shrinks (PP-OCR's detector's resident peak was four times its live
// tensors that way, half that with the blocks mapped: benchmarks/README.md, What changed what, the
// block cache), and braid's large blocks stay out of the way of whatever else the process allocates.
void* map_block(int64_t bytes) {
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
void unmap_block(void* p, int64_t bytes) { munmap(p, static_cast<size_t>(bytes)); }

class BlockCache {
 public:
  /// A cached block of at least bytes and at most twice that (the smallest such), or null; its
  /// size in *got.
  void* take(int64_t bytes, int64_t* got) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_size_.lower_bound(bytes);
    if (it == by_size_.end() || it->first > 2 * bytes) return nullptr;
    void* p = it->second->p;
    *got = it->first;
    lru_.erase(it->second);
    by_size_.erase(it);
    cached_ -= *got;
    return p;
  }
  /// Keeps p, then frees the least recently given blocks until the cache is within limit.
  void give(void* p, int64_t bytes, int64_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    lru_.push_back({bytes, p});
    by_size_.emplace(bytes, std::prev(lru_.end()));
    cached_ += bytes;
    while (cached_ > limit && !lru_.empty()) {
      const Block& old = lru_.front();
      auto range = by_size_.equal_range(old.bytes);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second == lru_.begin()) {
          by_size_.erase(it);
          break;
        }
      unmap_block(old.p, old.bytes);
      cached_ -= old.bytes;
      lru_.pop_front();
    }
  }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Block& b : lru_) unmap_block(b.p, b.bytes);
    lru_.clear();
    by_size_.clear();
    cached_ = 0;
  }
  ~BlockCache() { clear(); }

 private:
  struct Block {
    int64_t bytes;
    void* p;
  };
  std::mutex mu_;
  std::list<Block> lru_;  // least recently given first
  std::multimap<int64_t, std::list<Block>::iterator> by_size_;
  int64_t cached_ = 0;
};

// The size of the block that holds n bytes: n itself below kCacheMin; above, n rounded up to the
// next of four size classes per power of two (2^k times 1, 1.25, 1.5 or 1.75), so that a freed
// block serves any request of its class and the cache holds one block per class in use, not one
// per size ever freed (at most 25% of a block unused).
int64_t block_size(int64_t n) {
  if (n < kCacheMin) return n;
  int64_t p = kCacheMin;
  while (p * 2 <= n) p *= 2;
  const int64_t quarter = p / 4;
  return (n + quarter - 1) / quarter * quarter;
}

BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // outlives static tensors freed at exit
  return *c;
}

// Note [Small block cache]
// Blocks under kCacheMin come from the C heap, whose aligned allocation takes its slow path on every
// call (a small op's output at batch 1: a 64-byte tensor for 16 values). Freed small blocks are kept
// in free lists by size class (multiples of 64 bytes up to 4 KiB, then four classes per power of
// two) and handed out again, most recently freed first, up to kSmallCacheMax bytes in all; past
// that they go back to the heap. A model's small values are the same sizes run after run, so the
// lists stay short and the cache holds about one run's worth of them.
constexpr int64_t kSmallCacheMax = int64_t{16} << 20;
constexpr int64_t kSmallLinear = 4096;                 // 64-byte classes below this
constexpr int kSmallClasses = kSmallLinear / 64 + 4 * 5;  // then 4 per power of two up to kCacheMin (2^17)

// The class of a small block of n bytes (0 < n < kCacheMin) and the size it holds.
int small_class(int64_t n, int64_t* size) {
  if (n <= kSmallLinear) {
    const int64_t c = (n + 63) / 64;
    *size = c * 64;
    return static_cast<int>(c - 1);
  }
  int k = 0;
  int64_t p = kSmallLinear;
  while (p * 2 <= n) p *= 2, ++k;
  const int64_t quarter = p / 4, q = (n + quarter - 1) / quarter;  // 4 to 8 quarters
  *size = q * quarter;
  return static_cast<int>(kSmallLinear / 64 + 4 * k + (q - 4));  // n = 2p exactly: q = 4, the class of q = 8 below
}

class SmallCache {
 public:
  void* take(int cls) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*>& list = free_[cls];
    if (list.empty()) return nullptr;
    void* p = list.back();
    list.pop_back();
    cached_ -= sizes_[cls];
    return p;
  }
  /// Keeps p unless the cache is full; false when it is (the caller frees p).
  bool give(int cls, int64_t size, void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + size > kSmallCacheMax) return false;
    free_[cls].push_back(p);
    sizes_[cls] = size;
    cached_ += size;
    return true;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& list : free_) {
      for (void* p : list) std::free(p);
      list.clear();
    }
    cached_ = 0;
  }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  std::mutex mu_;
  std::vector<void*> free_[kSmallClasses + 1];
  int64_t sizes_[kSmallClasses + 1] = {};
  int64_t cached_ = 0;
};

SmallCache& small_cache() {
  static SmallCache* c = new SmallCache();  // outlives static tensors freed at exit
  return *c;
}

}  // namespace

// The size of each mapped block, by address: a block taken from the cache may be larger than the
// request it serves, and goes back to the cache (or is unmapped) whole.
std::mutex& sizes_mu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::unordered_map<void*, int64_t>& block_sizes() {
  static auto* m = new std::unordered_map<void*, int64_t>();
  return *m;
}

void* CpuBackend::allocate(Device device, int64_t nbytes_in) {
  int64_t nbytes = kUseCache ? block_size(nbytes_in) : nbytes_in;
  const bool big = kUseCache && nbytes >= kCacheMin;
  if (!big) {
    int64_t size = nbytes;
    if (kUseCache && nbytes > 0) {
      if (void* p = small_cache().take(small_class(nbytes, &size))) return p;  // Note [Small block cache]
    }
    if (void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(size))) return p;
    cache().clear();
    small_cache().clear();
    if (void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(size))) return p;
    throw Error(cat("out of memory allocating ", nbytes, " bytes on ", device.str()));
  }
  void* p = cache().take(nbytes, &nbytes);
  if (!p) p = map_block(nbytes);
  if (!p) {
    const int64_t cached = cache().cached();
    cache().clear();  // free the cache and retry once
    p = map_block(nbytes);
    if (!p) throw Error(cat("out of memory allocating ", nbytes, " bytes on ", device.str(), " (", cached,
                            " bytes were cached and have been freed)"));
  }
  std::lock_guard<std::mutex> lock(sizes_mu());
  block_sizes()[p] = nbytes;
  return p;
}

void CpuBackend::deallocate(Device, void* p, int64_t nbytes_in) {
  if (!kUseCache) return std::free(p);
  if (block_size(nbytes_in) < kCacheMin) {
    int64_t size = 0;
    const int cls = nbytes_in > 0 ? small_class(nbytes_in, &size) : -1;
    if (cls < 0 || !small_cache().give(cls, size, p)) std::free(p);
    return;
  }
  int64_t nbytes = 0;
  {
    std::lock_guard<std::mutex> lock(sizes_mu());
    auto it = block_sizes().find(p);
    BRAID_ASSERT(it != block_sizes().end(), "deallocate: a block the CPU backend did not map");
    nbytes = it->second;
    block_sizes().erase(it);
  }
  cache().give(p, nbytes, std::max(kCacheFloor, 3 * max_memory_allocated(Device::cpu())));
}

int64_t CpuBackend::cached_bytes(Device) { return cache().cached() + small_cache().cached(); }
void CpuBackend::empty_cache(Device) {
  cache().clear();
  small_cache().clear();
}

void CpuBackend::copy_from_host(Device, const void* host, void* dev, int64_t nbytes) {
  if (nbytes > 0) std::memcpy(dev, host, static_cast<size_t>(nbytes));
}
void CpuBackend::copy_to_host(Device, const void* dev, void* host, int64_t nbytes) {
  if (nbytes > 0) std::memcpy(host, dev, static_cast<size_t>(nbytes));
}

}  // namespace braid::detail
