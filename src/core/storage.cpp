// Storage allocation: 64-byte aligned (a cache line, and what AVX-512 loads like), with a
// process-wide count of live bytes that memory tests and benchmarks read.
#include "braid/storage.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "braid/error.h"

namespace braid {

namespace {

std::atomic<int64_t> g_live_bytes{0};
constexpr int64_t kAlignment = 64;

// Note [Block cache]
// Large blocks come from mmap, so every fresh one costs a page fault per 4 KiB on first touch; in a
// training loop the same sizes are freed and asked for again each step. Freed blocks of at least
// kCacheMin bytes are kept, by exact size, up to kCacheMax bytes in all, and handed out again, as
// PyTorch's caching allocators do. Sanitizer builds skip the cache so that use-after-free is caught.
constexpr int64_t kCacheMin = 1 << 20;
constexpr int64_t kCacheMax = int64_t{1} << 30;

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

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  BRAID_CHECK_T(NotImplementedError, device.type == DeviceType::CPU, "Storage::allocate: device ",
                device.str(), " is not compiled into this build of braid");
  BRAID_CHECK(nbytes >= 0, "Storage::allocate: negative size ", nbytes);
  int64_t rounded = (std::max<int64_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = kUseCache && rounded >= kCacheMin ? cache().take(rounded) : nullptr;
  if (!p) p = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
  if (!p) throw Error(detail::cat("out of memory allocating ", nbytes, " bytes on ", device.str()));
  g_live_bytes += rounded;
  return std::shared_ptr<Storage>(new Storage(p, rounded, device, true));
}

std::shared_ptr<Storage> Storage::wrap(void* data, int64_t nbytes, Device device) {
  BRAID_CHECK(data != nullptr || nbytes == 0, "Storage::wrap: null pointer for ", nbytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, false));
}

Storage::~Storage() {
  if (!owned_) return;
  g_live_bytes -= nbytes_;
  if (!(kUseCache && nbytes_ >= kCacheMin && cache().give(data_, nbytes_))) std::free(data_);
}

int64_t Storage::live_bytes() { return g_live_bytes.load(); }

void Storage::empty_cache() { cache().clear(); }

}  // namespace braid
