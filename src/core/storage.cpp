// Storage allocation through the device's backend, and the per-device memory statistics that
// memory tests, benchmarks and users (memory_allocated, max_memory_allocated) read.
#include "braid/storage.h"

#include <array>
#include <atomic>
#include <mutex>

#include "backend/backend.h"
#include "braid/error.h"
#include "core/knob_read.h"

namespace braid {

namespace {

// Note [Device memory]
// Every device's memory comes from its backend's allocate/deallocate, which may cache blocks (the
// CPU keeps large freed blocks, Note [Block cache]; a GPU backend keeps a stream-ordered pool). The
// statistics are counted here, once for every backend: live bytes per device and their peak since
// the last reset, in 64-byte-rounded sizes as the allocators hand them out.
constexpr int64_t kAlignment = 64;
constexpr int kMaxIndex = 16;

struct Counter {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
};

Counter& counter(Device d) {
  static std::array<std::array<Counter, kMaxIndex>, 3> counters;
  BRAID_CHECK(d.index >= 0 && d.index < kMaxIndex, "device index ", d.index, " out of range [0, ", kMaxIndex, ")");
  return counters[static_cast<size_t>(d.type)][static_cast<size_t>(d.index)];
}

// BRAID_MEMORY_LIMIT: an allocation that would take a device's live bytes past it is an error
// before anything is allocated (the statistics above are what it compares).
void check_limit(Device d, int64_t bytes) {
  static const int64_t limit = detail::knob_bytes("BRAID_MEMORY_LIMIT");
  if (limit <= 0) return;
  const int64_t live = counter(d).live.load();
  BRAID_CHECK_T(Error, live + bytes <= limit, "out of memory on ", d.str(), ": ", bytes, " more bytes with ", live,
                " in use would pass BRAID_MEMORY_LIMIT (", limit, " bytes per process); use smaller batches, or "
                "shard the model (ShardedDataParallel, stage 3)");
}

void count(Device d, int64_t bytes) {
  Counter& c = counter(d);
  const int64_t now = c.live += bytes;
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  BRAID_CHECK(nbytes >= 0, "Storage::allocate: negative size ", nbytes);
  detail::Backend& backend = detail::backend_for(device);
  const int64_t rounded = (std::max<int64_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  check_limit(device, rounded);
  void* p = backend.allocate(device, rounded);
  count(device, rounded);
  return std::make_shared<Storage>(Key(), p, rounded, device, true, nullptr);
}

std::shared_ptr<Storage> Storage::wrap(void* data, int64_t nbytes, Device device, std::function<void()> release) {
  BRAID_CHECK(data != nullptr || nbytes == 0, "Storage::wrap: null pointer for ", nbytes, " bytes");
  return std::make_shared<Storage>(Key(), data, nbytes, device, false, std::move(release));
}

void Storage::resize(int64_t nbytes) {
  BRAID_CHECK(owned_, "Storage::resize: this storage wraps memory it does not own");
  BRAID_CHECK(nbytes >= 0, "Storage::resize: negative size ", nbytes);
  detail::Backend& backend = detail::backend_for(device_);
  const int64_t rounded = nbytes == 0 ? 0 : (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == nbytes_) return;
  if (nbytes_ > 0) {
    count(device_, -nbytes_);
    backend.deallocate(device_, data_, nbytes_);
  }
  data_ = nullptr;
  nbytes_ = 0;
  if (rounded > 0) {
    check_limit(device_, rounded);
    data_ = backend.allocate(device_, rounded);
    count(device_, rounded);
    nbytes_ = rounded;
  }
  bump_version();
}

Storage::~Storage() {
  if (!owned_) {
    if (release_) release_();
    return;
  }
  if (nbytes_ == 0 && data_ == nullptr) return;  // resized to nothing
  count(device_, -nbytes_);
  detail::backend_for(device_).deallocate(device_, data_, nbytes_);
}

namespace {
std::mutex& derived_mu() {
  static std::mutex* m = new std::mutex();  // outlives static tensors freed at exit
  return *m;
}
}  // namespace

std::shared_ptr<void> Storage::derived(const std::string& key) const {
  std::lock_guard<std::mutex> lock(derived_mu());
  for (const Derived& d : derived_)
    if (d.key == key) return d.version == version() ? d.value : nullptr;
  return nullptr;
}

void Storage::set_derived(const std::string& key, std::shared_ptr<void> value) {
  std::shared_ptr<void> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(derived_mu());
  for (Derived& d : derived_)
    if (d.key == key) {
      dropped = std::move(d.value);
      d.value = std::move(value);
      d.version = version();
      return;
    }
  if (derived_.size() >= 4) {
    dropped = std::move(derived_.front().value);
    derived_.erase(derived_.begin());
  }
  derived_.push_back({key, version(), std::move(value)});
}

int64_t Storage::live_bytes() { return counter(cpu()).live.load(); }

void Storage::empty_cache() { braid::empty_cache(cpu()); }

int64_t memory_allocated(Device device) { return counter(device).live.load(); }
int64_t max_memory_allocated(Device device) { return counter(device).peak.load(); }
int64_t memory_cached(Device device) { return detail::backend_for(device).cached_bytes(device); }
void reset_peak_memory_stats(Device device) {
  Counter& c = counter(device);
  c.peak.store(c.live.load());
}
void empty_cache(Device device) { detail::backend_for(device).empty_cache(device); }
void synchronize(Device device) { detail::backend_for(device).synchronize(device); }

}  // namespace braid
