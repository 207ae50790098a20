// Image transforms that a DataLoader applies to each batch's input (N, C, H, W) in its background
// thread. Random transforms draw per sample from a Generator the loader positions at the sample's
// place in the epoch (see Note [Transform randomness] in loader.cpp), so an image gets the same
// augmentation whatever the batch size, the number of shards or the prefetch depth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/random.h"
#include "braid/tensor.h"

namespace braid::data {

class Transform {
 public:
  virtual ~Transform() = default;
  /// The transformed batch. x is (N, C, H, W); a random transform draws draws_per_sample() uniforms
  /// per sample from gen, sample i's after sample i-1's, in one rand() call.
  virtual Tensor apply(const Tensor& x, Generator& gen) const = 0;
  /// How many uniforms apply() draws per sample (0 for a deterministic transform).
  virtual int64_t draws_per_sample() const { return 0; }
  /// "Normalize(mean=[0.5], std=[0.25])".
  virtual std::string describe() const = 0;
};

/// (x - mean[c]) / std[c] per channel c, as torchvision's Normalize. One value applies to every
/// channel; otherwise there must be one per channel of x.
class Normalize : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor apply(const Tensor& x, Generator& gen) const override;
  std::string describe() const override;

 private:
  std::vector<double> mean_, std_;
};

/// Pads each image by padding zeros on every side, then cuts a size x size window at a position
/// drawn uniformly for each sample (torchvision's RandomCrop(size, padding)). Draws 2 per sample:
/// the top offset floor(u0 * (H + 2 padding - size + 1)) and the left one from u1 likewise.
class RandomCrop : public Transform {
 public:
  explicit RandomCrop(int64_t size, int64_t padding = 0);
  Tensor apply(const Tensor& x, Generator& gen) const override;
  int64_t draws_per_sample() const override { return 2; }
  std::string describe() const override;

 private:
  int64_t size_, padding_;
};

/// Mirrors each image left-right with probability p (one draw per sample: flipped when u < p).
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor apply(const Tensor& x, Generator& gen) const override;
  int64_t draws_per_sample() const override { return 1; }
  std::string describe() const override;

 private:
  double p_;
};

}  // namespace braid::data
