// Shape computations evaluated once per shape (Note [Shape computations evaluated once per shape]):
// finding them in the top-level graph, and binding or collecting their values. Internal to onnx/.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "executor.h"

namespace braid::onnx {

// Note [Shape computations evaluated once per shape]
// Exported transformers compute every Reshape's target from the activations' shapes: per attention
// projection a Shape node or two, Gathers of their entries, Unsqueezes and a Concat, about 130 nodes
// for MiniLM's three layers. Each is kept per value (Note [Small values evaluated once per value]),
// but still visited, looked up and bound, run after run (measured: benchmarks/README.md, "What
// changed what", run T). A group is the Shape nodes that read one value (its root) and every later
// node of a pure shape op whose inputs are the
// group's values or Constant nodes' only: its values are a function of the root's dtype and shape.
// When the root's shape is the one the group last saw, the executor binds the values that nodes
// outside the group read (its exits) at the group's first node and skips the rest; otherwise the
// nodes run as usual and their exits are kept as they are made, for the next run.

namespace {

// A pure op (SmallValues::pure_op) whose outputs are functions of its inputs' values: not Shape or
// Size, which read their input's shape.
bool shape_op(const Node& n) {
  if (!n.domain.empty() || n.op_type == "Shape" || n.op_type == "Size" || !SmallValues::pure_op(n.op_type))
    return false;
  for (const auto& [name, a] : n.attributes)
    if (a.kind == Attribute::Kind::Graph || a.kind == Attribute::Kind::Graphs) return false;
  return true;
}

// A group's key: its root's dtype and shape.
std::string key_of(const Tensor& root) {
  std::string key(1, static_cast<char>(root.dtype()));
  key.append(reinterpret_cast<const char*>(root.shape().data()), root.shape().size() * sizeof(int64_t));
  return key;
}

}  // namespace

void find_shape_groups(const Graph& g, const std::vector<std::set<std::string>>& reads,
                       const std::set<std::string>& keep, ExecPlan& plan) {
  const size_t n = g.nodes.size();
  plan.shape_group_of.assign(n, -1);
  // The passes' patterns are fused nodes of their own domain here (Note [Graph passes]), which no
  // group takes: a group is of default-domain nodes only.
  std::set<std::string> constants;         // Constant nodes' values
  std::map<std::string, int> group_value;  // a value made inside a group -> the group
  std::map<std::string, int> root_group;
  std::vector<ShapeGroup> groups;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.op_type == "Constant" && node.domain.empty()) {
      constants.insert(node.outputs.begin(), node.outputs.end());
      continue;
    }
    if (plan.static_node[i]) continue;
    bool outputs_ok = !node.outputs.empty();
    for (const auto& o : node.outputs) outputs_ok = outputs_ok && !o.empty() && keep.count(o) == 0;
    if (!outputs_ok) continue;
    int group = -1;
    if (node.op_type == "Shape" && node.domain.empty() && node.inputs.size() == 1 && !node.inputs[0].empty()) {
      auto r = root_group.find(node.inputs[0]);
      if (r == root_group.end()) {
        r = root_group.emplace(node.inputs[0], static_cast<int>(groups.size())).first;
        groups.push_back(ShapeGroup{node.inputs[0], {}, {}, {}});
      }
      group = r->second;
    } else if (shape_op(node)) {
      bool ok = true;
      for (const auto& in : node.inputs) {
        if (in.empty() || constants.count(in) != 0) continue;
        auto v = group_value.find(in);
        if (v == group_value.end() || (group >= 0 && v->second != group)) {
          ok = false;
          break;
        }
        group = v->second;
      }
      if (!ok) group = -1;
    }
    if (group < 0) continue;
    groups[static_cast<size_t>(group)].nodes.push_back(i);
    plan.shape_group_of[i] = group;
    for (const auto& o : node.outputs) group_value[o] = group;
  }
  // The exits: values that a node outside the group reads (its subgraphs included).
  for (size_t i = 0; i < n; ++i)
    for (const std::string& r : reads[i]) {
      auto v = group_value.find(r);
      if (v == group_value.end() || plan.shape_group_of[i] == v->second) continue;
      ShapeGroup& sg = groups[static_cast<size_t>(v->second)];
      if (std::find(sg.exits.begin(), sg.exits.end(), r) == sg.exits.end()) sg.exits.push_back(r);
    }
  // Groups of one node gain nothing over the per-value cache; renumber the others.
  std::vector<int> renumber(groups.size(), -1);
  for (size_t k = 0; k < groups.size(); ++k) {
    ShapeGroup& sg = groups[k];
    if (sg.nodes.size() < 2 || sg.exits.empty()) continue;
    for (const std::string& e : sg.exits)
      for (size_t m : sg.nodes)
        if (std::find(g.nodes[m].outputs.begin(), g.nodes[m].outputs.end(), e) != g.nodes[m].outputs.end())
          sg.exit_of.push_back(m);
    renumber[k] = static_cast<int>(plan.shape_groups.size());
    plan.shape_groups.push_back(std::move(sg));
  }
  for (int& gi : plan.shape_group_of) gi = gi < 0 ? -1 : renumber[static_cast<size_t>(gi)];
}

bool Executor::bind_shapes(int group, Scope& scope, const ExecPlan& plan) {
  const ShapeGroup& sg = plan.shape_groups[static_cast<size_t>(group)];
  const Tensor* root = scope.find(sg.root);
  PendingShapes& p = shapes_[static_cast<size_t>(group)];
  p = PendingShapes();
  if (root == nullptr || !root->defined()) return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  std::string key = key_of(*root);
  std::vector<Tensor> exits;
  if (!plan.shape_kept.find(static_cast<size_t>(group), key, exits)) {
    p.collecting = true;  // the nodes run as usual; note_shapes keeps their exits
    p.key = std::move(key);
    p.exits.assign(sg.exits.size(), Tensor());
    return false;
  }
  for (size_t k = 0; k < sg.exits.size(); ++k) scope.at(sg.exits[k]) = exits[k];
  for (size_t m : sg.nodes) skip_[m] = 1;
  add_time(start, "shape computations");
  return true;
}

void Executor::note_shapes(size_t i, const Scope& scope, const ExecPlan& plan) {
  const int group = plan.shape_group_of[i];
  PendingShapes& p = shapes_[static_cast<size_t>(group)];
  if (!p.collecting) return;
  const ShapeGroup& sg = plan.shape_groups[static_cast<size_t>(group)];
  for (size_t k = 0; k < sg.exits.size(); ++k) {
    if (sg.exit_of[k] != i) continue;
    const Tensor* t = scope.find(sg.exits[k]);
    if (t == nullptr || !t->defined() || t->numel() > SmallValues::kLargestKept) {
      p.collecting = false;  // not worth keeping, or not made: the next run tries again
      return;
    }
    p.exits[k] = *t;
    ++p.made;
  }
  if (p.made == sg.exits.size()) {
    plan.shape_kept.keep(static_cast<size_t>(group), std::move(p.key), std::move(p.exits));
    p = PendingShapes();
  }
}

}  // namespace braid::onnx
