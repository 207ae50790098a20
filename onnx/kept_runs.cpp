// The executor's runs of kept values (onnx/kept.h): static nodes, small values and Constant
// nodes, each bound from what it gave before where that still holds. Internal to onnx/.
#include <string>
#include <vector>

#include "executor.h"

namespace braid::onnx {

/// Runs a node of weights and constants, or binds what it gave last time (Note [Static nodes
/// evaluated once]).
void Executor::run_static(const Node& n, Scope& scope, const ExecPlan& plan, size_t node) {
  std::vector<Tensor> inputs, outputs;
  for (const std::string& name : n.inputs) {
    const Tensor* t = name.empty() ? nullptr : scope.find(name);
    inputs.push_back(t != nullptr ? *t : Tensor());
  }
  if (plan.static_outputs.find(node, inputs, outputs)) {
    for (size_t k = 0; k < n.outputs.size() && k < outputs.size(); ++k)
      if (!n.outputs[k].empty()) scope.at(n.outputs[k]) = outputs[k];
    return;
  }
  const std::vector<uint64_t> versions = versions_of(inputs);
  run_node(n, scope);
  for (const std::string& name : n.outputs) {
    const Tensor* t = name.empty() ? nullptr : scope.find(name);
    outputs.push_back(t != nullptr ? *t : Tensor());
  }
  plan.static_outputs.keep(node, std::move(inputs), versions, std::move(outputs));
}

/// Runs a node of small values, or binds what it gave for the same values last time (Note [Small
/// values evaluated once per value]); false when its inputs are not all small.
bool Executor::run_small(const Node& n, Scope& scope, const ExecPlan& plan, size_t node) {
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  std::vector<Tensor> inputs, outputs;
  inputs.reserve(n.inputs.size());
  for (const std::string& name : n.inputs) {
    const Tensor* t = name.empty() ? nullptr : scope.find(name);
    if (t == nullptr && !name.empty()) return false;  // run_node names what is missing
    inputs.push_back(t != nullptr ? *t : Tensor());
  }
  std::string key;
  if (!SmallValues::key_of(inputs, n.op_type == "Shape" || n.op_type == "Size", key)) return false;
  if (plan.small_values.find(node, key, outputs)) {
    for (size_t k = 0; k < n.outputs.size() && k < outputs.size(); ++k)
      if (!n.outputs[k].empty()) scope.at(n.outputs[k]) = outputs[k];
    add_time(start, n.op_type);
    return true;
  }
  run_node(n, scope);
  for (const std::string& name : n.outputs) {
    const Tensor* t = name.empty() ? nullptr : scope.find(name);
    Tensor o = t != nullptr ? *t : Tensor();
    // A view of an input (Unsqueeze, Reshape) is kept as a copy: the input's memory may be
    // rewritten by its owner before a later run brings equal values in another tensor.
    for (const Tensor& in : inputs)
      if (o.defined() && in.defined() && o.storage() == in.storage()) {
        o = o.clone();
        break;
      }
    outputs.push_back(o);
  }
  plan.small_values.keep(node, std::move(key), std::move(outputs));
  return true;
}

/// Runs a Constant node, or binds the value it gave last time (Note [Constants evaluated once]).
void Executor::run_constant(const Node& n, Scope& scope, const ExecPlan& plan, size_t node) {
  Tensor& v = scope.at(n.outputs[0]);
  if (!plan.constant_values.find(node, device_, v)) {
    run_node(n, scope);
    plan.constant_values.keep(node, device_, v);
  }
}

}  // namespace braid::onnx
