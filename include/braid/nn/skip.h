// Skip connections that may cross a pipeline cut (torchgpipe's stash and pop). A Sequential lists
// its layers in order; a long skip is written as two layers: SkipStash("a") hands its input on
// unchanged and keeps it under the name "a", and a later SkipAdd("a") (or SkipConcat) adds it back.
// On one process that is an ordinary residual connection. When a pipeline cuts the model between
// the two, the stage that stashed sends the kept tensor to the next stage along with the
// activation (and receives its gradient back), so the model code stays the same.
//
// Stashed tensors live in the innermost SkipScope of the running thread. The outermost
// Sequential::forward opens one when none is open and fails if it ends with a tensor stashed but
// never used; a pipeline stage opens one per micro-batch, pre-filled with what the previous stage
// carried, and carries on what is left.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "braid/nn/module.h"

namespace braid::nn {

class SkipScope {
 public:
  explicit SkipScope(std::map<std::string, Tensor> initial = {});
  ~SkipScope();
  SkipScope(const SkipScope&) = delete;
  SkipScope& operator=(const SkipScope&) = delete;
  /// The tensors stashed and not yet used, by name.
  std::map<std::string, Tensor>& tensors() { return tensors_; }
  /// The innermost open scope of this thread, or nullptr.
  static SkipScope* current();

 private:
  std::map<std::string, Tensor> tensors_;
  SkipScope* outer_;
};

/// Runs body in a fresh scope unless one is open, and then fails if anything stashed in it was
/// never used (Sequential::forward's outermost call).
Tensor run_in_skip_scope(const Module& owner, const std::function<Tensor()>& body);

/// Identity that keeps its input under name for a later SkipAdd / SkipConcat.
class SkipStash : public Module {
 public:
  explicit SkipStash(std::string name);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

/// x + the tensor stashed under name (which is used up).
class SkipAdd : public Module {
 public:
  explicit SkipAdd(std::string name);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

struct SkipConcatConfig {
  std::string name;
  int64_t dim;
};

/// cat([x, stashed], dim), as U-Net's decoder joins encoder features.
class SkipConcat : public Module {
 public:
  SkipConcat(std::string name, int64_t dim = 1);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  SkipConcatConfig config() const { return {name_, dim_}; }

 private:
  std::string name_;
  int64_t dim_;
};

}  // namespace braid::nn
