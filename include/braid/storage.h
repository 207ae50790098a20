// Reference-counted, 64-byte aligned memory shared by a tensor and all of its views. A storage may
// also wrap a user's buffer without owning it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
  /// Frees this storage's memory (nbytes 0) or allocates nbytes again, while every tensor that
  /// refers to it keeps referring to it, as PyTorch's storage.resize_: sharded data parallelism
  /// (stage 3) frees a layer's gathered parameters between their uses this way. Owned storage
  /// only; the contents are undefined after it (the caller fills them).
  void resize(int64_t nbytes);

  // Note [Storage versions]
  // A count of the in-place writes to this memory: the in-place methods (fill_, zero_, copy_, add_,
  // mul_) and the optimizers' fused steps bump it, as PyTorch's version counter does. What is
  // derived from a tensor and kept (the ONNX executor's folded convolution weights, oneDNN's
  // reordered weights) records the versions it was made from and is made again when one moved.
  // Writes through a raw pointer (data<T>(), a NumPy or DLPack view) are not counted.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  void bump_version() { version_.fetch_add(1, std::memory_order_acq_rel); }
  /// A value derived from this memory and kept with it, freed with it (a backend's reordered copy
  /// of a weight): the one stored under key at the current version, or null.
  std::shared_ptr<void> derived(const std::string& key) const;
  /// Keeps value under key for the current version (at most four keys; the oldest goes first).
  void set_derived(const std::string& key, std::shared_ptr<void> value);

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
  std::atomic<uint64_t> version_{0};
  struct Derived {
    std::string key;
    uint64_t version;
    std::shared_ptr<void> value;
  };
  std::vector<Derived> derived_;  // guarded by one process-wide mutex (storage.cpp)
};

}  // namespace braid
