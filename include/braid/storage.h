// Reference-counted, 64-byte aligned memory shared by a tensor and all of its views. A storage may
// also wrap a user's buffer without owning it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "braid/dtype.h"

namespace braid {

/// A block of memory on one device. Views of a tensor hold the same Storage.
class Storage {
 public:
  /// Allocates nbytes (rounded up to 64) of 64-byte aligned memory on device.
  static std::shared_ptr<Storage> allocate(int64_t nbytes, Device device = cpu());
  /// Wraps memory the caller owns and keeps alive for the storage's lifetime; nothing is freed.
  /// release, when given, runs once the storage's last user is gone (the Python bindings drop their
  /// reference to a NumPy array there, or call a DLPack producer's deleter).
  static std::shared_ptr<Storage> wrap(void* data, int64_t nbytes, Device device = cpu(),
                                       std::function<void()> release = nullptr);

  /// Storage's own key for its constructor (allocate and wrap make the storage and its count in
  /// one block with std::make_shared, which needs a public constructor).
  class Key {
    friend class Storage;
    explicit Key() = default;
  };
  Storage(Key, void* data, int64_t nbytes, Device device, bool owned, std::function<void()> release)
      : data_(data), nbytes_(nbytes), device_(device), owned_(owned), release_(std::move(release)) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool owns_memory() const { return owned_; }

  /// Bytes currently held by all owning storages on the CPU (for memory tests and benchmarks).
  static int64_t live_bytes();
  /// Returns the blocks kept for reuse (Note [Block cache] in src/backend/cpu/memory.cpp) to the system.
  static void empty_cache();

 private:
  void* data_;
  int64_t nbytes_;
  Device device_;
  bool owned_;
  std::function<void()> release_;
};

}  // namespace braid
