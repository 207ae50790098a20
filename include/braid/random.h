// Counter-based random numbers (Philox-4x32-10). Element i of a draw depends only on the seed, the
// generator's offset and i, never on the thread that computes it, so the same seed gives the same
// numbers at any thread count and on every rank.
#pragma once

#include <cstdint>

namespace braid {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  /// Philox blocks consumed so far; with the seed it is the whole state.
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  /// Reserves n blocks of four 32-bit numbers and returns the first block's counter.
  uint64_t advance(uint64_t blocks) {
    uint64_t start = offset_;
    offset_ += blocks;
    return start;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The process-wide generator that creation ops use when none is passed.
Generator& default_generator();
/// Seeds the default generator.
void manual_seed(uint64_t seed);

}  // namespace braid
