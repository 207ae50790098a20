// The list of graph passes, the rewrite they share, and the run of a fused node. Internal to onnx/.
//
// Note [Graph passes]
// Every inference fusion of an imported graph is a pass: a matcher that finds its pattern of nodes
// in the model's top-level graph (passes/<name>.cpp, with the pattern's Note) and a run of one
// pattern as one braid op. make_plan runs the matchers in the order of passes() (later ones see
// what earlier ones found: a chain takes in QDQ pairs and GELUs, a gate takes over its Convs'
// activations), then replaces each pattern by one node of domain "braid" (kFusedDomain, op type
// the pass's) that reads every value its nodes read from outside and makes every value of theirs
// that is read outside. A pattern inside a later pass's is dropped (the later one runs it). The
// graph is put back into a topological order that keeps the model's wherever it can (a pattern's
// node goes where its first node was, after the Constant and static nodes it reads that came later).
// The executor then runs that graph as it runs any: its loop is the plain loop over nodes, and a
// fused node runs through the op registry. Its run (run_fused) asks the pass first; where the
// pattern does not apply in this run (a number it needs is not the expected one, an operand of
// another dtype or device), the replaced nodes run as written, in a scope of their own: the nodes
// are each pattern's definition, and its fallback.
// Training, and every run that records gradients, uses a plan made without passes: the graph as
// written. A pass can be switched off by name (OnnxOptions::disabled_passes, BRAID_ONNX_PASSES_OFF:
// to find which pass a wrong result comes from); OnnxModule::fired_passes() and `braid-onnx
// inspect` list which passes replaced which nodes.
#include "passes.h"

#include <algorithm>
#include <queue>

#include "braid/knobs.h"

namespace braid::onnx {

const std::vector<Pass>& passes() {
  static const std::vector<Pass> list = {qdq_pass(),  gelu_pass(),  conv_pass(),
                                         gate_pass(), chain_pass(), batch_norm_pass()};
  return list;
}


void apply_passes(const Graph& g, const std::map<std::string, Tensor>& weights, const std::set<std::string>& off,
                  ExecPlan& plan) {
  for (const std::string& name : off) {
    if (name == "all") continue;
    bool known = false;
    std::string names;
    for (const Pass& p : passes()) {
      known = known || name == p.name;
      names += names.empty() ? p.name : std::string(", ") + p.name;
    }
    BRAID_CHECK(known, "unknown ONNX pass '", name, "' to switch off (passes: ", names, ", or all)");
  }
  const size_t n = g.nodes.size();
  std::set<std::string> keep;
  for (const auto& o : g.outputs) keep.insert(o.name);
  std::map<std::string, size_t> uses, producer;
  std::vector<std::set<std::string>> reads(n);
  for (size_t i = 0; i < n; ++i) {
    collect_reads(g.nodes[i], reads[i]);
    for (const auto& r : reads[i]) uses[r]++;
    for (const auto& o : g.nodes[i].outputs) producer[o] = i;
  }
  MatchContext m{g, uses, keep, weights, producer, plan};
  std::vector<FusedGroup> groups;
  for (size_t p = 0; p < passes().size(); ++p) {
    if (off.count("all") != 0 || off.count(passes()[p].name) != 0) continue;
    passes()[p].match(m);
  }
  for (size_t p = 0; p < passes().size(); ++p) {
    if (off.count("all") != 0 || off.count(passes()[p].name) != 0) continue;
    for (FusedGroup f : passes()[p].groups(g, plan)) {
      f.pass = p;
      std::sort(f.nodes.begin(), f.nodes.end());
      groups.push_back(std::move(f));
    }
  }
  // Later passes first: a pattern with a node that one of them took is dropped.
  std::vector<int> owner(n, -1);
  for (size_t k = groups.size(); k-- > 0;) {
    bool free = true;
    for (size_t i : groups[k].nodes) free = free && owner[i] < 0;
    if (!free) continue;
    for (size_t i : groups[k].nodes) owner[i] = static_cast<int>(k);
  }
  // The rewritten graph's items: the nodes no pattern took, and one fused node per live pattern.
  std::vector<Node> items;
  std::vector<size_t> priority;
  std::vector<std::set<std::string>> item_reads;
  for (size_t i = 0; i < n; ++i) {
    if (owner[i] >= 0) {
      const size_t k = static_cast<size_t>(owner[i]);
      if (groups[k].nodes.front() != i) continue;
      FusedGroup& f = groups[k];
      const std::set<size_t> inside(f.nodes.begin(), f.nodes.end());
      Node fused;
      fused.name = g.nodes[f.at].name;
      fused.op_type = passes()[f.pass].op_type;
      fused.domain = kFusedDomain;
      std::set<std::string> made, seen;
      for (size_t j : f.nodes)
        for (const auto& o : g.nodes[j].outputs)
          if (!o.empty()) made.insert(o);
      for (size_t j : f.nodes)
        for (const auto& r : reads[j])
          if (made.count(r) == 0 && seen.insert(r).second) fused.inputs.push_back(r);
      for (size_t j : f.nodes)
        for (const auto& o : g.nodes[j].outputs) {
          if (o.empty()) continue;
          size_t inner = 0;
          for (size_t q : f.nodes) inner += reads[q].count(o);
          auto u = uses.find(o);
          if (keep.count(o) != 0 || (u != uses.end() && u->second > inner)) fused.outputs.push_back(o);
        }
      f.outputs = fused.outputs;
      Attribute index;
      index.kind = Attribute::Kind::Int;
      index.i = static_cast<int64_t>(plan.fused.size());
      fused.attributes["fusion"] = index;
      plan.fused.push_back(f);
      item_reads.emplace_back(fused.inputs.begin(), fused.inputs.end());
      items.push_back(std::move(fused));
      priority.push_back(i);
      continue;
    }
    items.push_back(g.nodes[i]);
    item_reads.push_back(reads[i]);
    priority.push_back(i);
  }
  // Kahn's order, the smallest original position first among the ready.
  const size_t m_items = items.size();
  std::map<std::string, size_t> made_by;
  for (size_t k = 0; k < m_items; ++k)
    for (const auto& o : items[k].outputs)
      if (!o.empty()) made_by[o] = k;
  std::vector<std::vector<size_t>> after(m_items);
  std::vector<size_t> waiting(m_items, 0);
  for (size_t k = 0; k < m_items; ++k) {
    std::set<size_t> from;
    for (const auto& r : item_reads[k]) {
      auto it = made_by.find(r);
      if (it != made_by.end() && it->second != k) from.insert(it->second);
    }
    for (size_t f : from) after[f].push_back(k);
    waiting[k] = from.size();
  }
  using Ready = std::pair<size_t, size_t>;  // (original position, item)
  std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>> ready;
  for (size_t k = 0; k < m_items; ++k)
    if (waiting[k] == 0) ready.push({priority[k], k});
  auto out = std::make_shared<Graph>();
  out->name = g.name;
  out->inputs = g.inputs;
  out->outputs = g.outputs;
  out->value_info = g.value_info;
  out->initializers = g.initializers;
  out->nodes.reserve(m_items);
  while (!ready.empty()) {
    const size_t k = ready.top().second;
    ready.pop();
    for (size_t next : after[k])
      if (--waiting[next] == 0) ready.push({priority[next], next});
    out->nodes.push_back(std::move(items[k]));
  }
  if (out->nodes.size() != m_items)
    throw Error(detail::cat("ONNX graph passes: the rewritten graph '", g.name,
                            "' has a cycle (a pass matched a pattern that reads its own output)"));
  plan.graph = std::move(out);
}

std::vector<Tensor> Executor::run_fused(const Node& n) {
  BRAID_ASSERT(plan_ != nullptr && plan_scope_ != nullptr);
  auto it = n.attributes.find("fusion");
  BRAID_ASSERT(it != n.attributes.end() && it->second.i >= 0 &&
               static_cast<size_t>(it->second.i) < plan_->fused.size());
  const FusedGroup& f = plan_->fused[static_cast<size_t>(it->second.i)];
  Scope& scope = *plan_scope_;
  const Graph& g = model_.graph;
  std::vector<Tensor> out;
  if (passes()[f.pass].run(*this, g, f.at, scope, *plan_)) {
    for (const std::string& o : f.outputs) {
      const Tensor* t = scope.find(o);
      BRAID_ASSERT(t != nullptr);
      out.push_back(*t);
    }
    return out;
  }
  // The pattern's definition: its nodes as written, their values in a scope of their own.
  Scope own;
  own.parent = &scope;
  for (size_t j : f.nodes) run_node(g.nodes[j], own);
  for (const std::string& o : f.outputs) {
    auto v = own.values.find(o);
    BRAID_ASSERT(v != own.values.end());
    out.push_back(v->second);
  }
  return out;
}

void register_fused_ops(OpRegistry& r) {
  for (const Pass& p : passes()) {
    OpSchema s;
    s.domain = kFusedDomain;
    s.op_type = p.op_type;
    s.attributes = {"fusion"};
    s.storage_via_compute = false;
    s.run = [](OpContext& ctx) -> std::vector<Tensor> {
      BRAID_CHECK(ctx.executor() != nullptr, ctx.node().label(),
                  ": braid's fused nodes run only inside the plan of the OnnxModule that made them");
      return ctx.executor()->run_fused(ctx.node());
    };
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx
