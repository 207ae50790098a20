// The graph passes of ONNX inference (Note [Graph passes] in passes.cpp): the list, in the order
// they run, and what each pass provides: a matcher over the model's graph, the patterns it found,
// and the run of one pattern as the node of braid's domain that replaces it. One file per pass
// (qdq.cpp, gelu.cpp, conv.cpp, gate.cpp, chain.cpp, batch_norm.cpp). Internal to onnx/.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "../executor.h"

namespace braid::onnx {

/// What a pass's matcher reads: the model's top-level graph and what make_plan knows of it. A
/// matcher writes its patterns into its map of plan (conv_bn ... chains), where the passes after it
/// see them (the chains take in QDQ pairs and GELUs; the gates take over their Convs' activations).
struct MatchContext {
  const Graph& g;
  const std::map<std::string, size_t>& uses;  // value -> how many nodes read it
  const std::set<std::string>& keep;          // the graph's outputs
  const std::map<std::string, Tensor>& weights;
  const std::map<std::string, size_t>& producer;  // value -> the node that makes it
  ExecPlan& plan;
};

struct Pass {
  const char* name;     // what OnnxOptions::disabled_passes and BRAID_ONNX_PASSES_OFF name
  const char* op_type;  // the kFusedDomain node it writes
  const char* what;     // one line, for braid-onnx
  void (*match)(MatchContext& m);
  /// Its patterns after every pass matched: the node each is keyed by and the nodes it runs.
  std::vector<FusedGroup> (*groups)(const Graph& g, const ExecPlan& plan);
  /// Runs the pattern keyed by node `at` (Executor's runs' contract: false, nothing written, where
  /// it does not apply in this run).
  bool (*run)(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan);
};

/// The groups of a pass whose patterns live in one of ExecPlan's maps, keyed by the node each runs
/// at; nodes(at, pattern) lists the nodes it runs.
template <typename Pattern, typename Nodes>
std::vector<FusedGroup> groups_of(const std::map<size_t, Pattern>& patterns, Nodes nodes) {
  std::vector<FusedGroup> out;
  for (const auto& [at, p] : patterns) out.push_back({0, at, nodes(at, p), {}});
  return out;
}

/// Every pass, in the order they match.
const std::vector<Pass>& passes();

/// Matches every pass but those in `off` on g (the model's graph) into plan, and sets plan.graph
/// to g with each pattern replaced by its fused node (plan.fused), in a topological order that
/// keeps g's wherever it can. Throws ValueError naming an unknown pass in `off`.
void apply_passes(const Graph& g, const std::map<std::string, Tensor>& weights, const std::set<std::string>& off,
                  ExecPlan& plan);

// The passes (one file each).
Pass qdq_pass();
Pass gelu_pass();
Pass conv_pass();
Pass gate_pass();
Pass chain_pass();
Pass batch_norm_pass();

/// Whether value v can be had before node `first` runs: made before it, or by Constant and static
/// nodes (of weights and constants only) that can run early (chain.cpp; the gates use it too).
bool available_early(const Graph& g, const std::map<std::string, size_t>& producer, const std::set<std::string>& keep,
                     const ExecPlan& plan, const std::string& v, size_t first, std::set<size_t>& early);

}  // namespace braid::onnx
