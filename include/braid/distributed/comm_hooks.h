// Communication hooks of DistributedDataParallel (as PyTorch's register_comm_hook): what a gradient
// bucket turns into on the wire and back. The default is the all-reduce (in the native dtype, or
// float16/bfloat16 on the wire); the others compress for slow links: top-K sparsification with
// error feedback and Deep Gradient Compression's corrections (arXiv 1712.01887), and PowerSGD's
// low-rank approximation with error feedback (arXiv 1905.13727).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "braid/checkpoint.h"
#include "braid/distributed/process_group.h"

namespace braid::distributed {

/// One bucket of a backward pass, as a hook sees it.
struct GradBucket {
  /// Launch order: the same bucket index on every rank, every step.
  size_t index = 0;
  /// Flat: this rank's gradients going in; after CommHook::finish, the gradient every rank applies
  /// (the average over the group, or the hook's approximation of it), identical on every rank.
  Tensor buffer;
  /// The bucket's parameters, in buffer order, and where each one starts in buffer.
  std::vector<Tensor> parameters;
  std::vector<int64_t> offsets;
  /// Synchronised backward passes before this one (warm-up schedules count them).
  int64_t step = 0;
};

/// How a bucket is reduced. launch() is called as backward completes a bucket, in bucket order on
/// every rank (so collectives match across ranks), and should start the communication without
/// waiting for it; finish() is called once backward is done, in the same order, and completes it.
class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual void launch(const ProcessGroupPtr& group, GradBucket& bucket) = 0;
  virtual void finish(const ProcessGroupPtr& group, GradBucket& bucket) = 0;
  /// State that must survive a restart for the training to continue as it would have (error
  /// feedback's residuals, PowerSGD's Q): tensors and integers under prefix. Default: none.
  virtual void store(braid::Checkpoint& ckpt, const std::string& prefix) const;
  virtual void restore(const braid::Checkpoint& ckpt, const std::string& prefix);
};
using CommHookPtr = std::shared_ptr<CommHook>;

/// The all-reduce with ReduceOp::Average: DistributedDataParallel's default, made from its options'
/// wire_dtype and deterministic.
CommHookPtr allreduce_hook(const AllReduceOptions& options = {});

struct TopKOptions {
  /// The fraction of each bucket's elements every rank sends per step (values and int32 indices).
  double ratio = 0.001;
  /// DGC's momentum correction: the residual accumulates the velocity u = momentum u + g instead of
  /// g, and momentum factor masking zeroes u where sent. Use it with SGD without momentum (the
  /// momentum lives here); 0 is plain error feedback.
  double momentum = 0.0;
  /// DGC's local gradient clipping: each rank's bucket gradient is scaled to at most
  /// clip_norm / sqrt(N) in L2 norm before it is accumulated; 0 is off.
  double clip_norm = 0.0;
  /// DGC's warm-up: the sent fraction falls exponentially from 25% to ratio over this many steps.
  int64_t warmup_steps = 0;
};

/// Top-K sparsification with error feedback (Note [Top-K with error feedback] in
/// distributed/comm_hooks.cpp): each rank adds the bucket's gradient to its residual, sends the k
/// largest-magnitude entries of the residual and keeps the rest for later steps; every rank sums
/// what all sent and divides by N. When k is at least half the bucket, sending values and indices
/// would cost more than the dense all-reduce, so that step sends the whole residual in an all-reduce.
class TopKHook : public CommHook {
 public:
  explicit TopKHook(const TopKOptions& options = {});
  std::string name() const override;
  void launch(const ProcessGroupPtr& group, GradBucket& bucket) override;
  void finish(const ProcessGroupPtr& group, GradBucket& bucket) override;
  void store(braid::Checkpoint& ckpt, const std::string& prefix) const override;
  void restore(const braid::Checkpoint& ckpt, const std::string& prefix) override;
  /// The fraction sent at a step (the warm-up's schedule, then ratio).
  double ratio_at(int64_t step) const;
  /// What bucket b's residual holds now (undefined before its first step).
  const Tensor& residual(size_t b) const;

 private:
  struct State;
  TopKOptions options_;
  std::map<size_t, std::shared_ptr<State>> state_;
};

struct PowerSGDOptions {
  /// The rank r of the approximation P Q^T of each matrix gradient.
  int64_t rank = 2;
  /// Steps run with the plain all-reduce before compression starts (PyTorch's
  /// start_powerSGD_iter), so that early, fast-changing gradients are not approximated.
  int64_t start_step = 0;
  /// Add what the approximation missed to the next step's gradient.
  bool error_feedback = true;
  /// Start each step's power iteration from the previous step's Q.
  bool warm_start = true;
  /// Q's first draw (the same on every rank).
  uint64_t seed = 0;
  /// Compress a matrix only when n m >= min_compression_rate r (n + m) (PyTorch's rule); below
  /// that it goes whole. 0 compresses every matrix.
  double min_compression_rate = 2.0;
};

/// PowerSGD (Note [PowerSGD] in distributed/powersgd.cpp): each parameter of two or more dimensions,
/// viewed as an n x m matrix M (its first axis by the rest), is sent as P = M Q (n x r) and then
/// Q = M^T P (m x r) after P's columns are orthonormalised: two all-reduces of r (n + m) numbers
/// instead of n m. Vectors (biases, norms) and matrices too small to gain go whole with P's
/// all-reduce. Rank min(n, m) reproduces the average exactly, up to rounding.
class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(const PowerSGDOptions& options = {});
  std::string name() const override;
  void launch(const ProcessGroupPtr& group, GradBucket& bucket) override;
  void finish(const ProcessGroupPtr& group, GradBucket& bucket) override;
  void store(braid::Checkpoint& ckpt, const std::string& prefix) const override;
  void restore(const braid::Checkpoint& ckpt, const std::string& prefix) override;

 private:
  struct State;
  PowerSGDOptions options_;
  std::map<size_t, std::shared_ptr<State>> state_;
  std::map<std::string, Tensor> restored_;  // "<bucket>.<parameter>.q" / ".error", applied when planned
};

}  // namespace braid::distributed
