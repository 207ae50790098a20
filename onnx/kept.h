// What the top-level graph keeps between inference runs (Note [Executing an ONNX graph] in
// module.cpp): folded convolution weights, the values of Constant nodes, and the outputs of nodes
// that read only weights and constants. Each is used again only while what it was made from is
// unchanged (Note [Storage versions]). Internal to onnx/.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "braid/device.h"
#include "braid/tensor.h"

namespace braid::onnx {

/// The versions of ts' storages now (0 for an undefined tensor).
inline std::vector<uint64_t> versions_of(const std::vector<Tensor>& ts) {
  std::vector<uint64_t> v;
  for (const Tensor& t : ts) v.push_back(t.defined() ? t.storage()->version() : 0);
  return v;
}

/// Whether now is, tensor by tensor, the same view of the same storage as kept, at the version
/// recorded when it was kept.
inline bool unchanged(const std::vector<Tensor>& kept, const std::vector<uint64_t>& versions,
                      const std::vector<Tensor>& now) {
  if (kept.size() != now.size()) return false;
  for (size_t i = 0; i < kept.size(); ++i) {
    const Tensor &a = kept[i], &t = now[i];
    if (a.defined() != t.defined()) return false;
    if (!a.defined()) continue;
    if (a.storage() != t.storage() || a.offset() != t.offset() || a.shape() != t.shape() ||
        a.strides() != t.strides() || a.dtype() != t.dtype() || t.storage()->version() != versions[i])
      return false;
  }
  return true;
}

// Note [Folded weights kept]
// In inference a folded convolution's weight and bias (Note [Folding BatchNormalization into Conv],
// Note [Folding a scalar affine into Conv]) are kept with the plan and used again while every
// tensor they were made from is the same view of the same storage at the same version (Note
// [Storage versions]): fine-tuning, load_state_dict and any in-place update bump a version, and the
// next run folds afresh. Kept, the folded weight is also what oneDNN's reordered copy stays with
// (Note [Reordered weights kept]), so a run reads each weight once, in the kernel's layout, instead
// of folding and reordering all of them.
class FoldedWeights {
 public:
  /// The weight and bias folded from sources (and numbers) when none of them changed since, or
  /// false.
  bool find(size_t node, const std::vector<Tensor>& sources, const std::vector<double>& numbers, Tensor& w,
            Tensor& b) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find(node);
    if (it == kept_.end() || it->second.sources.size() != sources.size() || it->second.numbers != numbers) return false;
    const Entry& e = it->second;
    if (!unchanged(e.sources, e.versions, sources)) return false;
    w = e.w;
    b = e.b;
    return true;
  }
  /// Keeps w and b as folded from sources at their versions before the fold (versions).
  void keep(size_t node, std::vector<Tensor> sources, std::vector<uint64_t> versions, std::vector<double> numbers,
            Tensor w, Tensor b) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_[node] = Entry{std::move(sources), std::move(versions), std::move(numbers), std::move(w), std::move(b)};
  }

 private:
  struct Entry {
    std::vector<Tensor> sources;
    std::vector<uint64_t> versions;
    std::vector<double> numbers;
    Tensor w, b;
  };
  mutable std::mutex mu_;
  std::unordered_map<size_t, Entry> kept_;
};

// Note [Constants evaluated once]
// A Constant node's value depends on nothing but its attribute, so the top-level graph evaluates
// each one once per device and binds the kept tensor on later runs (a transformer's Constants were
// a few percent of its inference when they ran every time (measured: benchmarks/README.md, "What
// changed what", run K). Nothing in the executor writes a value in place; a Constant that is itself
// a graph output is not kept, since the caller may write to what it is
// given.
class ConstantCache {
 public:
  bool find(size_t node, Device d, Tensor& out) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find(key(node, d));
    if (it == kept_.end()) return false;
    out = it->second;
    return true;
  }
  void keep(size_t node, Device d, Tensor t) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_[key(node, d)] = std::move(t);
  }

 private:
  // The node and the device (its type and index) it was evaluated for.
  using Key = std::tuple<size_t, int, int>;
  static Key key(size_t node, Device d) { return {node, static_cast<int>(d.type), d.index}; }
  mutable std::mutex mu_;
  std::map<Key, Tensor> kept_;
};

// Note [Static nodes evaluated once]
// In inference, a node of the top-level graph whose every input is a weight, a constant or the
// output of such a node (a QDQ model's quantisation and dequantisation of its weights, a
// transposed or reshaped weight, arithmetic on constants) gives the same outputs on every run while
// its inputs stand. Its outputs are kept and bound again while each input is the same view of the
// same storage at the same version, as the folded weights are; a changed weight makes its node run
// again, and the new output, a different storage, makes every node after it run again too. Random
// ops, nodes with subgraphs, ops of other domains than ai.onnx (a custom op may be anything) and
// nodes writing a graph output are never kept. Training runs every node, so that autograd reaches
// the weights through them.
class StaticOutputs {
 public:
  bool find(size_t node, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find(node);
    if (it == kept_.end() || !unchanged(it->second.inputs, it->second.versions, inputs)) return false;
    outputs = it->second.outputs;
    return true;
  }
  void keep(size_t node, std::vector<Tensor> inputs, std::vector<uint64_t> versions, std::vector<Tensor> outputs) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_[node] = Entry{std::move(inputs), std::move(versions), std::move(outputs)};
  }

 private:
  struct Entry {
    std::vector<Tensor> inputs;
    std::vector<uint64_t> versions;
    std::vector<Tensor> outputs;
  };
  mutable std::mutex mu_;
  std::unordered_map<size_t, Entry> kept_;
};


// Note [Small values evaluated once per value]
// Exporters compute shapes inside the graph: MiniLM's 150 Shape, Gather, Unsqueeze, Concat, Reshape,
// Equal and Where nodes on one-to-four-element integer tensors cost as much in dispatch and
// allocation as its layer normalisations (measured: benchmarks/README.md, "What changed what", run
// L). In inference, a node of a pure op whose inputs are all small (at most kSmallValue elements,
// on the CPU, contiguous) is a function of their values: its
// outputs are kept with a copy of those values and bound again, without running it, while the
// values (bit for bit, with their types and shapes) are the same. Shape and Size read only their
// input's type and shape, so their input may be of any size. Nodes writing a graph output are not
// kept, as for Constants.
class SmallValues {
 public:
  static constexpr int64_t kSmallValue = 1024;  // elements

  /// The pure ops that shape computations use (a node of one is kept per value when its inputs are
  /// small). Shape and Size read only their input's type and shape.
  static bool pure_op(const std::string& op_type) {
    static const std::set<std::string> kOps = {
        "Shape",          "Size",     "Gather",  "Unsqueeze", "Squeeze", "Concat", "Reshape", "Slice",
        "Cast",           "Add",      "Sub",     "Mul",       "Div",     "Mod",    "Neg",     "Abs",
        "Floor",          "Ceil",     "Min",     "Max",       "Equal",   "Less",   "Greater", "LessOrEqual",
        "GreaterOrEqual", "Not",      "And",     "Or",        "Where",   "Range",  "Expand",  "ConstantOfShape",
        "ReduceProd",     "Identity", "Flatten", "Transpose"};
    return kOps.count(op_type) != 0;
  }
  static constexpr int64_t kLargestKept = 1 << 16;  // elements of an output worth keeping

  /// The key of inputs (every value copied), or false when one of them is not small;
  /// shape_only: the first input's dtype and shape are all that matter (Shape, Size).
  static bool key_of(const std::vector<Tensor>& inputs, bool shape_only, std::string& key) {
    key.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      key.push_back(t.defined() ? 'v' : '-');
      if (!t.defined()) continue;
      const int64_t numel = t.numel();
      const int64_t dims[2] = {static_cast<int64_t>(t.dtype()), t.dim()};
      key.append(reinterpret_cast<const char*>(dims), sizeof dims);
      key.append(reinterpret_cast<const char*>(t.shape().data()), t.shape().size() * sizeof(int64_t));
      if (shape_only && i == 0) continue;
      if (numel > kSmallValue || !t.device().is_cpu() || !t.is_contiguous()) return false;
      key.append(reinterpret_cast<const char*>(t.data_ptr()), static_cast<size_t>(numel * t.element_size()));
    }
    return true;
  }
  bool find(size_t node, const std::string& key, std::vector<Tensor>& outputs) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find(node);
    if (it == kept_.end() || it->second.first != key) return false;
    outputs = it->second.second;
    return true;
  }
  void keep(size_t node, std::string key, std::vector<Tensor> outputs) {
    for (const Tensor& t : outputs)
      if (t.defined() && t.numel() > kLargestKept) return;
    std::lock_guard<std::mutex> lock(mu_);
    kept_[node] = {std::move(key), std::move(outputs)};
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::pair<std::string, std::vector<Tensor>>> kept_;
};

}  // namespace braid::onnx
