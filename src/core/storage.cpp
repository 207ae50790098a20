// Storage allocation: 64-byte aligned (a cache line, and what AVX-512 loads like), with a
// process-wide count of live bytes that memory tests and benchmarks read.
#include "braid/storage.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "braid/error.h"

namespace braid {

namespace {
std::atomic<int64_t> g_live_bytes{0};
constexpr int64_t kAlignment = 64;
}  // namespace

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  BRAID_CHECK_T(NotImplementedError, device.type == DeviceType::CPU, "Storage::allocate: device ",
                device.str(), " is not compiled into this build of braid");
  BRAID_CHECK(nbytes >= 0, "Storage::allocate: negative size ", nbytes);
  int64_t rounded = (std::max<int64_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
  if (!p) throw Error(detail::cat("out of memory allocating ", nbytes, " bytes on ", device.str()));
  g_live_bytes += rounded;
  return std::shared_ptr<Storage>(new Storage(p, rounded, device, true));
}

std::shared_ptr<Storage> Storage::wrap(void* data, int64_t nbytes, Device device) {
  BRAID_CHECK(data != nullptr || nbytes == 0, "Storage::wrap: null pointer for ", nbytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, false));
}

Storage::~Storage() {
  if (owned_) {
    std::free(data_);
    g_live_bytes -= nbytes_;
  }
}

int64_t Storage::live_bytes() { return g_live_bytes.load(); }

}  // namespace braid
