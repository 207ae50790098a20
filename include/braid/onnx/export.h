// Exporting braid models to ONNX files.
//
// export_onnx writes any model built from braid's layers: each layer type has an exporter in an
// explicit registry (onnx/export.cpp) that emits the ONNX nodes of its forward. Exporters are run
// on an example input, so every value's shape is known; the graph's batch axis is symbolic
// ("batch") unless ExportOptions::dynamic_batch is off. Parameters and buffers become initialisers
// under their state_dict() names, so importing the file (OnnxModule) gives bitwise the same
// weights under the same names, and onnxruntime runs it. An imported OnnxModule exports its own
// graph with its current (e.g. fine-tuned) weights.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "braid/nn/module.h"
#include "braid/onnx/model.h"

namespace braid::onnx {

/// Serialises m to ONNX protobuf bytes.
std::string serialize_model(const Model& m);
/// Writes m to path (through "<path>.tmp" and a rename, so a crash never leaves half a file).
void save_model(const Model& m, const std::string& path);

/// Writes t as a serialised TensorProto (the format of the test suite's input_0.pb; load_tensor reads it).
void save_tensor(const Tensor& t, const std::string& path, const std::string& name = "");

struct ExportOptions {
  /// ai.onnx opset of the written file (17: the newest that Debian's ONNX 1.12 checker knows).
  int64_t opset = 17;
  std::string input_name = "input";
  std::string output_name = "output";
  /// Axis 0 of the input and output is the symbolic "batch" dimension.
  bool dynamic_batch = true;
};

/// A value in the graph being built: its name and the example tensor it holds during export.
struct Value {
  std::string name;
  Tensor example;
};

/// What layer exporters add nodes through.
class GraphBuilder {
 public:
  explicit GraphBuilder(int64_t opset) : opset_(opset) {}
  int64_t opset() const { return opset_; }
  /// A fresh value name starting with hint.
  std::string fresh(const std::string& hint);
  /// Adds a weight initialiser under its state_dict name; returns the name.
  std::string weight(const std::string& name, const Tensor& t);
  /// A constant int64 vector initialiser (shapes, axes).
  std::string ints(const std::vector<int64_t>& values);
  /// A constant scalar initialiser of dtype.
  std::string scalar(double value, DType dtype);
  /// Adds a node; returns its output names (n_outputs fresh names).
  std::vector<std::string> node(const std::string& op_type, const std::vector<std::string>& inputs,
                                std::map<std::string, Attribute> attributes = {}, int n_outputs = 1);
  /// The same with one output, paired with the example value the node computes.
  Value node1(const std::string& op_type, const std::vector<std::string>& inputs, const Tensor& example,
              std::map<std::string, Attribute> attributes = {});
  Graph& graph() { return graph_; }
  /// Skip tensors stashed by SkipStash, by name.
  std::map<std::string, Value>& skips() { return skips_; }

 private:
  int64_t opset_;
  Graph graph_;
  int counter_ = 0;
  std::map<std::string, Value> skips_;
};

Attribute attr_int(int64_t v);
Attribute attr_float(double v);
Attribute attr_ints(std::vector<int64_t> v);
Attribute attr_string(std::string v);

/// Exports one module given its input; prefix is the module's state_dict path ("" or "features.").
using LayerExporter = std::function<Value(GraphBuilder&, nn::Module&, const std::string& prefix, const Value& x)>;
/// Adds or replaces the exporter for a module type name ("Linear"); user layers register here.
void register_layer_exporter(const std::string& type_name, LayerExporter fn);
/// Runs the registered exporter for m (throws NotImplementedError naming the layer's path and type).
Value export_layer(GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x);

/// The ONNX model of module m for inputs like example (run once, in eval mode, without gradients).
Model export_model(nn::Module& model, const Tensor& example, const ExportOptions& options = {});
/// Writes model to path as ONNX: export_model (tracing a forward on example), then save_model. Python:
/// braid.onnx.export(model, example, path, opset=17, input_name=..., output_name=..., dynamic_batch=True).
void export_onnx(nn::Module& model, const Tensor& example, const std::string& path,
                 const ExportOptions& options = {});

}  // namespace braid::onnx
