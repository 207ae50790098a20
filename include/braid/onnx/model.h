// ONNX models as braid sees them: a checked, protobuf-free copy of an ONNX ModelProto. load_model
// parses a file with the ONNX project's own protobuf classes and validates everything braid will
// rely on before allocating any tensor (Note [Loading untrusted models] in onnx/loader.cpp): sizes
// with checked arithmetic, data lengths against shapes, external-data paths kept inside the
// model's folder, opset versions, nesting depth, and that the graph is acyclic with every input
// produced. Every problem is a braid::Error that names the file, and the node or tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "braid/tensor.h"

namespace braid::onnx {

struct Graph;

/// One node attribute. `kind` says which field holds the value.
struct Attribute {
  enum class Kind { Float, Int, String, Tensor, Graph, Floats, Ints, Strings, Tensors, Graphs };
  Kind kind = Kind::Int;
  double f = 0;
  int64_t i = 0;
  std::string s;
  braid::Tensor t;
  std::shared_ptr<onnx::Graph> g;
  std::vector<double> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<braid::Tensor> tensors;
  std::vector<std::shared_ptr<onnx::Graph>> graphs;
};

struct Node {
  std::string name, op_type, domain;
  /// Value names; "" marks an omitted optional input or output.
  std::vector<std::string> inputs, outputs;
  std::map<std::string, Attribute> attributes;
  /// "Conv 'conv1'" (or "Conv #3" for an unnamed node), for messages.
  std::string label() const;
};

/// A dimension: a size, or a symbol ("batch") for a dynamic one, or unknown (size -1, no symbol).
struct Dim {
  int64_t size = -1;
  std::string symbol;
};

struct ValueInfo {
  std::string name;
  /// Whether the file gave a tensor type (dtype is then meaningful); untyped values are allowed
  /// where ONNX allows them (value_info, subgraph outputs).
  bool has_type = false;
  /// The element type; tensors braid cannot hold (strings, complex) are rejected at load.
  DType dtype = kFloat32;
  bool has_shape = false;
  std::vector<Dim> shape;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;  ///< in a topological order (checked)
  std::map<std::string, braid::Tensor> initializers;
  std::vector<ValueInfo> inputs, outputs, value_info;
};

struct Model {
  std::string path;  ///< the file it came from, for messages
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opsets;  ///< domain ("" for ai.onnx) -> version
  std::string producer_name, producer_version;
  Graph graph;
  /// The opset the model imports for domain ("" or "ai.onnx" for the default one), 1 when none.
  int64_t opset(const std::string& domain = "") const {
    auto it = opsets.find(domain == "ai.onnx" ? std::string() : domain);
    return it == opsets.end() ? 1 : it->second;
  }
};

struct LoadOptions {
  int64_t max_file_bytes = 2147483648;  ///< 2 GiB, protobuf's own limit
  int64_t max_tensor_bytes = 4294967296;  ///< 4 GiB, any one tensor, inline or external
  int max_graph_depth = 8;                      ///< If/Loop/Scan bodies inside bodies
  int max_proto_nesting = 100;                  ///< protobuf message nesting (nesting bombs)
};

// Note [Opsets after 21]
// Opsets 22 to 28 (ONNX 1.17 to 1.23) mostly widen ops' type lists (bfloat16, float8, 4-bit types)
// and add ops; types braid does not hold are refused by the loader by name, and new attributes by
// the preflight, which checks every attribute against the op's list. Where a newer opset changed
// what an op computes for inputs braid accepts, the op's OpSchema::until_opset says up to which
// opset braid's implementation is right, and the preflight refuses the node beyond it (BitShift at
// 28). PyPI's backend node suite (scripts/write_onnx_node_suite.py, the onnx_conformance_pypi test)
// runs every opset up to 28 in CI.

/// The newest ai.onnx opset braid accepts; models that import a newer one are refused.
constexpr int64_t kMaxOpset = 28;
/// The newest IR version braid reads: ONNX 1.23's (newer IRs add element types, which the loader
/// refuses by name where a file uses them, and fields that older readers skip).
constexpr int64_t kMaxIrVersion = 14;

/// Reads, parses and validates path. Throws braid::Error naming path and the first problem.
Model load_model(const std::string& path, const LoadOptions& options = {});
/// The same from bytes in memory; base_dir resolves external data ("" forbids it). For fuzzing.
Model parse_model(const void* data, size_t size, const std::string& name, const std::string& base_dir = "",
                  const LoadOptions& options = {});
/// A serialized TensorProto (the test suite's input_0.pb and output_0.pb files).
braid::Tensor load_tensor(const std::string& path, const LoadOptions& options = {});

}  // namespace braid::onnx
