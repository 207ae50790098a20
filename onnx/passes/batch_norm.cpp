// The batch_norm pass: an inference BatchNormalization that no Conv folds and no chain takes, as
// one braid::channel_affine of its folded scale and shift; its fold is also the chains' step.
// Internal to onnx/.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes.h"

namespace braid::onnx {

// A BatchNormalization that no Conv folds (its input quantised, say) in inference: its scale and
// shift, gamma / sqrt(var + eps) and beta - mean * scale (Note [BatchNorm as scale and shift] in
// layers/normalization.cpp), kept as folded weights are, then one pass over the activations
// (braid::channel_affine) instead of half a dozen small ops and two passes on every run.
bool Executor::batch_norm_affine(const Node& bn, const Scope& scope, const ExecPlan& plan, size_t node,
                                 int64_t channels, Tensor& scale, Tensor& shift) {
  if (!bn.domain.empty() || bn.inputs.size() < 5 || bn.outputs.size() != 1) return false;
  auto tm = bn.attributes.find("training_mode");
  if (tm != bn.attributes.end() && tm->second.i != 0) return false;
  std::vector<Tensor> sources;
  for (size_t k = 1; k < 5; ++k) {
    const Tensor* t = scope.find(bn.inputs[k]);
    if (t == nullptr || !t->defined() || t->dtype() != kFloat32 || t->device() != device_ || t->dim() != 1 ||
        t->numel() != channels)
      return false;
    sources.push_back(*t);
  }
  auto eps_it = bn.attributes.find("epsilon");
  const double eps = eps_it == bn.attributes.end() ? 1e-5 : eps_it->second.f;
  if (!plan.folded.find(node, sources, {eps}, scale, shift)) {
    const auto versions = versions_of(sources);
    scale = rsqrt(sources[3] + eps) * sources[0];
    shift = sources[1] - sources[2] * scale;
    plan.folded.keep(node, sources, versions, {eps}, scale, shift);
  }
  return true;
}

bool Executor::run_batch_norm(const Node& bn, Scope& scope, const ExecPlan& plan, size_t node) {
  const Tensor* x = bn.inputs.empty() ? nullptr : scope.find(bn.inputs[0]);
  if (x == nullptr || !x->defined() || x->dtype() != kFloat32 || x->device() != device_ || x->dim() < 2) return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  Tensor scale, shift;
  if (!batch_norm_affine(bn, scope, plan, node, x->size(1), scale, shift)) return false;
  scope.at(bn.outputs[0]) = channel_affine(*x, scale, shift);
  add_time(start, "BatchNormalization");
  return true;
}

namespace {

bool inference_batch_norm(const Node& n) {
  if (n.op_type != "BatchNormalization" || !n.domain.empty() || n.inputs.size() < 5 || n.outputs.size() != 1)
    return false;
  auto tm = n.attributes.find("training_mode");
  return tm == n.attributes.end() || tm->second.i == 0;
}

// Every inference BatchNormalization that no earlier pass took (a Conv's fold, a chain's step).
void match_batch_norms(MatchContext&) {}

std::vector<FusedGroup> batch_norm_groups(const Graph& g, const ExecPlan& plan) {
  std::set<size_t> taken;
  for (const auto& [conv, bn] : plan.conv_bn) taken.insert(bn);
  for (const auto& [at, chain] : plan.chains) taken.insert(chain.nodes.begin(), chain.nodes.end());
  std::vector<FusedGroup> out;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (inference_batch_norm(g.nodes[i]) && taken.count(i) == 0) out.push_back({0, i, {i}, {}});
  return out;
}

bool run_batch_norm_group(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan) {
  return ex.run_batch_norm(g.nodes[at], scope, plan, at);
}

}  // namespace

Pass batch_norm_pass() {
  return {"batch_norm", "ChannelAffine", "an inference BatchNormalization as one scale and shift per channel",
          match_batch_norms, batch_norm_groups, run_batch_norm_group};
}

}  // namespace braid::onnx
