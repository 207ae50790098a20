// Reading ONNX files into braid's checked copy (braid/onnx/model.h).
//
// Note [Loading untrusted models]
// An ONNX file is untrusted input: the ONNX library's checker accepts negative and overflowing
// dimensions, raw data shorter than the shape needs, external-data paths outside the model's
// folder, unknown opsets and cycles, and nothing stops a protobuf nesting bomb but protobuf's own
// recursion limit. So braid checks everything itself, in this order, before it allocates a tensor:
//   1. the file size against LoadOptions::max_file_bytes; protobuf parses with a recursion limit;
//   2. IR version and opset imports (ai.onnx 1..kMaxOpset);
//   3. every tensor: a known element type, dimensions >= 0, element count and byte size computed
//      with overflow checks and bounded by max_tensor_bytes, the data (inline fields, raw bytes or
//      an external file) exactly as long as the shape needs; external paths must be relative and
//      resolve, symbolic links followed, inside the model's folder;
//   4. the graph: unique value names, every node input produced by a graph input, an initializer,
//      an outer scope or another node, no cycles (nodes are put in a topological order), every
//      graph output produced; subgraphs (If, Loop, Scan bodies) to max_graph_depth.
// Each failure throws ValueError naming the file and the node or tensor.
#include <onnx/onnx_pb.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "braid/error.h"
#include "braid/onnx/model.h"
#include "braid/ops.h"

namespace braid::onnx {

namespace fs = std::filesystem;

namespace {

struct Ctx {
  std::string file;      // for messages
  std::string base_dir;  // external data is resolved here; "" forbids it
  const LoadOptions& options;
};

[[noreturn]] void fail(const Ctx& c, const std::string& what) {
  throw ValueError("ONNX model '" + c.file + "': " + what);
}

// ONNX TensorProto.DataType -> (braid dtype, bytes per element in the file).
struct TypeInfo {
  DType dtype;
  int64_t file_bytes;
  const char* name;
};

bool type_info(int32_t t, TypeInfo& out) {
  using TP = ::onnx::TensorProto;
  switch (t) {
    case TP::FLOAT: out = {kFloat32, 4, "float"}; return true;
    case TP::DOUBLE: out = {kFloat64, 8, "double"}; return true;
    case TP::FLOAT16: out = {kFloat16, 2, "float16"}; return true;
    case TP::BFLOAT16: out = {kBFloat16, 2, "bfloat16"}; return true;
    case TP::INT64: out = {kInt64, 8, "int64"}; return true;
    case TP::INT32: out = {kInt32, 4, "int32"}; return true;
    // int16/uint16 widen to int32 (values kept), uint32 to int64; int8/uint8 stay (quantised values).
    case TP::INT16: out = {kInt32, 2, "int16"}; return true;
    case TP::UINT16: out = {kInt32, 2, "uint16"}; return true;
    case TP::INT8:
      out = {kInt8, 1, "int8"};
      return true;
    case TP::UINT8:
      out = {kUInt8, 1, "uint8"};
      return true;
    case TP::UINT32: out = {kInt64, 4, "uint32"}; return true;
    case TP::BOOL: out = {kBool, 1, "bool"}; return true;
    default: return false;
  }
}

std::string type_name(int32_t t) {
  if (::onnx::TensorProto::DataType_IsValid(t)) return ::onnx::TensorProto::DataType_Name(static_cast<::onnx::TensorProto::DataType>(t));
  std::ostringstream s;
  s << "unknown type " << t;
  return s.str();
}

DType checked_dtype(const Ctx& c, int32_t t, const std::string& where) {
  TypeInfo info{};
  if (!type_info(t, info)) fail(c, where + " has element type " + type_name(t) + ", which braid does not support");
  return info.dtype;
}

int64_t checked_mul(const Ctx& c, int64_t a, int64_t b, const std::string& where) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(c, where + ": its size overflows 64 bits");
  return r;
}

// Bytes [offset, offset + length) of an external file, after checking that the file lies inside
// the model's folder.
std::string read_external(const Ctx& c, const ::onnx::TensorProto& t, const std::string& where, int64_t want) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    const std::string& k = kv.key();
    try {
      if (k == "location") location = kv.value();
      else if (k == "offset") offset = std::stoll(kv.value());
      else if (k == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      fail(c, where + ": external data field '" + k + "' is not a number: '" + kv.value() + "'");
    }
  }
  if (c.base_dir.empty()) fail(c, where + " keeps its data in an external file, which this source cannot have");
  if (location.empty()) fail(c, where + " keeps its data externally but names no location");
  const fs::path rel(location);
  if (rel.is_absolute()) fail(c, where + ": external data path '" + location + "' is absolute; it must be relative to the model's folder");
  for (const auto& part : rel)
    if (part == "..") fail(c, where + ": external data path '" + location + "' leaves the model's folder");
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::path(c.base_dir), ec);
  const fs::path full = fs::weakly_canonical(fs::path(c.base_dir) / rel, ec);
  if (ec) fail(c, where + ": cannot resolve external data path '" + location + "': " + ec.message());
  const auto [b_end, f_it] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (b_end != base.end()) fail(c, where + ": external data path '" + location + "' resolves to '" + full.string() + "', outside the model's folder");
  if (!fs::is_regular_file(full, ec)) fail(c, where + ": external data file '" + location + "' does not exist or is not a file");
  const auto size = static_cast<int64_t>(fs::file_size(full, ec));
  if (length < 0) length = want;
  if (offset < 0 || length != want || offset > size || length > size - offset) {
    std::ostringstream s;
    s << where << ": external data '" << location << "' offset " << offset << " length " << length << " does not fit: "
      << "the shape needs " << want << " bytes and the file has " << size;
    fail(c, s.str());
  }
  std::ifstream in(full, std::ios::binary);
  std::string bytes(static_cast<size_t>(want), '\0');
  in.seekg(offset);
  in.read(bytes.data(), want);
  if (!in) fail(c, where + ": reading external data '" + location + "' failed");
  return bytes;
}

template <typename From, typename To>
void convert(const From* src, To* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

Tensor to_tensor(const Ctx& c, const ::onnx::TensorProto& t, const std::string& where_in) {
  const std::string where = where_in.empty() ? "tensor '" + t.name() + "'" : where_in;
  TypeInfo info{};
  if (!t.has_data_type() || !type_info(t.data_type(), info))
    fail(c, where + " has element type " + type_name(t.data_type()) + ", which braid does not support");
  Shape shape;
  int64_t numel = 1;
  for (int i = 0; i < t.dims_size(); ++i) {
    const int64_t d = t.dims(i);
    if (d < 0) {
      std::ostringstream s;
      s << where << " has a negative dimension " << d << " (axis " << i << ")";
      fail(c, s.str());
    }
    shape.push_back(d);
    numel = checked_mul(c, numel, d, where);
  }
  const int64_t file_bytes = checked_mul(c, numel, info.file_bytes, where);
  const int64_t mem_bytes = checked_mul(c, numel, dtype_size(info.dtype), where);
  if (std::max(file_bytes, mem_bytes) > c.options.max_tensor_bytes) {
    std::ostringstream s;
    s << where << " of shape " << shape_str(shape) << " needs " << std::max(file_bytes, mem_bytes)
      << " bytes, more than the limit of " << c.options.max_tensor_bytes;
    fail(c, s.str());
  }
  if (t.has_segment()) fail(c, where + " is segmented, which ONNX models do not use");
  std::string external;
  const std::string* raw = nullptr;
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    external = read_external(c, t, where, file_bytes);
    raw = &external;
  } else if (t.has_raw_data()) {
    raw = &t.raw_data();
    if (static_cast<int64_t>(raw->size()) != file_bytes) {
      std::ostringstream s;
      s << where << " of shape " << shape_str(shape) << " and type " << info.name << " needs " << file_bytes
        << " bytes of raw data, the file has " << raw->size();
      fail(c, s.str());
    }
  }
  Tensor out = empty(shape, info.dtype);
  using TP = ::onnx::TensorProto;
  const int32_t dt = t.data_type();
  if (raw) {
    const char* p = raw->data();
    switch (dt) {
      case TP::INT16: convert(reinterpret_cast<const int16_t*>(p), out.data<int32_t>(), numel); break;
      case TP::UINT16:
        convert(reinterpret_cast<const uint16_t*>(p), out.data<int32_t>(), numel);
        break;
      case TP::UINT32: convert(reinterpret_cast<const uint32_t*>(p), out.data<int64_t>(), numel); break;
      case TP::BOOL: {
        auto* b = static_cast<uint8_t*>(out.raw_data());
        for (int64_t i = 0; i < numel; ++i) b[i] = p[i] != 0;
        break;
      }
      default: if (file_bytes > 0) std::memcpy(out.raw_data(), p, static_cast<size_t>(file_bytes));
    }
    return out;
  }
  // Typed fields: each must hold exactly numel values.
  auto check_count = [&](int64_t have, const char* field) {
    if (have != numel) {
      std::ostringstream s;
      s << where << " of shape " << shape_str(shape) << " needs " << numel << " values, its " << field << " has " << have;
      fail(c, s.str());
    }
  };
  switch (dt) {
    case TP::FLOAT:
      check_count(t.float_data_size(), "float_data");
      if (numel) std::memcpy(out.raw_data(), t.float_data().data(), static_cast<size_t>(numel) * 4);
      break;
    case TP::DOUBLE:
      check_count(t.double_data_size(), "double_data");
      if (numel) std::memcpy(out.raw_data(), t.double_data().data(), static_cast<size_t>(numel) * 8);
      break;
    case TP::INT64:
      check_count(t.int64_data_size(), "int64_data");
      if (numel) std::memcpy(out.raw_data(), t.int64_data().data(), static_cast<size_t>(numel) * 8);
      break;
    case TP::UINT32:
      check_count(t.uint64_data_size(), "uint64_data");
      convert(t.uint64_data().data(), out.data<int64_t>(), numel);
      break;
    case TP::FLOAT16:
    case TP::BFLOAT16: {
      check_count(t.int32_data_size(), "int32_data");
      auto* h = static_cast<uint16_t*>(out.raw_data());
      for (int64_t i = 0; i < numel; ++i) h[i] = static_cast<uint16_t>(t.int32_data(static_cast<int>(i)));
      break;
    }
    case TP::BOOL: {
      check_count(t.int32_data_size(), "int32_data");
      auto* b = static_cast<uint8_t*>(out.raw_data());
      for (int64_t i = 0; i < numel; ++i) b[i] = t.int32_data(static_cast<int>(i)) != 0;
      break;
    }
    case TP::INT8:
      check_count(t.int32_data_size(), "int32_data");
      convert(t.int32_data().data(), out.data<int8_t>(), numel);
      break;
    case TP::UINT8:
      check_count(t.int32_data_size(), "int32_data");
      convert(t.int32_data().data(), out.data<uint8_t>(), numel);
      break;
    default:  // INT32, INT16 and UINT16
      check_count(t.int32_data_size(), "int32_data");
      convert(t.int32_data().data(), out.data<int32_t>(), numel);
  }
  return out;
}

ValueInfo to_value_info(const Ctx& c, const ::onnx::ValueInfoProto& v, const std::string& role) {
  ValueInfo out;
  out.name = v.name();
  const std::string where = role + " '" + v.name() + "'";
  // Untyped values are allowed in value_info and nested graphs; a TypeProto with nothing set (what
  // some exporters write for If/Loop/Scan body outputs) is untyped too, and the value's type is
  // what the node that makes it gives at run time, as in onnxruntime.
  if (!v.has_type() || v.type().value_case() == ::onnx::TypeProto::VALUE_NOT_SET) return out;
  out.has_type = true;
  if (!v.type().has_tensor_type())
    fail(c, where + " is not a tensor (sequences, maps and optionals are not supported)");
  const auto& tt = v.type().tensor_type();
  if (tt.has_elem_type()) out.dtype = checked_dtype(c, tt.elem_type(), where);
  if (tt.has_shape()) {
    out.has_shape = true;
    for (const auto& d : tt.shape().dim()) {
      Dim dim;
      if (d.has_dim_value()) {
        // Some exporters (PaddlePaddle's) write -1 for a dynamic size; onnxruntime reads it as
        // unknown, and so does braid. Other negative sizes are refused.
        if (d.dim_value() == -1) {
          out.shape.push_back(dim);
          continue;
        }
        if (d.dim_value() < 0) {
          std::ostringstream s;
          s << where << " has a negative dimension " << d.dim_value();
          fail(c, s.str());
        }
        dim.size = d.dim_value();
      } else if (d.has_dim_param()) {
        dim.symbol = d.dim_param();
      }
      out.shape.push_back(dim);
    }
  }
  return out;
}

Graph to_graph(const Ctx& c, const ::onnx::GraphProto& g, const std::set<std::string>& outer, int depth,
               ::onnx::GraphProto* consume = nullptr);

Attribute to_attribute(const Ctx& c, const ::onnx::AttributeProto& a, const std::string& where,
                       const std::set<std::string>& scope, int depth) {
  using AP = ::onnx::AttributeProto;
  Attribute out;
  AP::AttributeType type = a.type();
  if (type == AP::UNDEFINED) {  // IR < 3 files leave the type out: infer it from the field set
    if (a.has_f()) type = AP::FLOAT;
    else if (a.has_i()) type = AP::INT;
    else if (a.has_s()) type = AP::STRING;
    else if (a.has_t()) type = AP::TENSOR;
    else if (a.has_g()) type = AP::GRAPH;
    else if (a.floats_size()) type = AP::FLOATS;
    else if (a.ints_size()) type = AP::INTS;
    else if (a.strings_size()) type = AP::STRINGS;
    else fail(c, where + ": attribute '" + a.name() + "' has no type and no value");
  }
  const std::string what = where + " attribute '" + a.name() + "'";
  switch (type) {
    case AP::FLOAT: out.kind = Attribute::Kind::Float; out.f = a.f(); break;
    case AP::INT: out.kind = Attribute::Kind::Int; out.i = a.i(); break;
    case AP::STRING: out.kind = Attribute::Kind::String; out.s = a.s(); break;
    case AP::TENSOR: out.kind = Attribute::Kind::Tensor; out.t = to_tensor(c, a.t(), what); break;
    case AP::GRAPH:
      out.kind = Attribute::Kind::Graph;
      out.g = std::make_shared<Graph>(to_graph(c, a.g(), scope, depth + 1));
      break;
    case AP::FLOATS:
      out.kind = Attribute::Kind::Floats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case AP::INTS:
      out.kind = Attribute::Kind::Ints;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case AP::STRINGS:
      out.kind = Attribute::Kind::Strings;
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case AP::TENSORS:
      out.kind = Attribute::Kind::Tensors;
      for (const auto& t : a.tensors()) out.tensors.push_back(to_tensor(c, t, what));
      break;
    case AP::GRAPHS:
      out.kind = Attribute::Kind::Graphs;
      for (const auto& sg : a.graphs()) out.graphs.push_back(std::make_shared<Graph>(to_graph(c, sg, scope, depth + 1)));
      break;
    default: fail(c, what + " has an attribute type braid does not support (" + AP::AttributeType_Name(type) + ")");
  }
  return out;
}

// consume: g itself, mutable, when its initialisers' bytes may be released as they are converted
// (the top-level graph of a model parsed for this load), so that a model's weights are not held
// twice at the peak of loading.
Graph to_graph(const Ctx& c, const ::onnx::GraphProto& g, const std::set<std::string>& outer, int depth,
               ::onnx::GraphProto* consume) {
  if (depth > c.options.max_graph_depth) {
    std::ostringstream s;
    s << "graph '" << g.name() << "' is nested " << depth << " levels deep in subgraphs, more than the limit of "
      << c.options.max_graph_depth;
    fail(c, s.str());
  }
  Graph out;
  out.name = g.name();
  std::set<std::string> known = outer;  // names visible to this graph's nodes
  for (int i = 0; i < g.initializer_size(); ++i) {
    const ::onnx::TensorProto& t = g.initializer(i);
    if (out.initializers.count(t.name())) fail(c, "initializer '" + t.name() + "' appears twice");
    out.initializers[t.name()] = to_tensor(c, t, "initializer '" + t.name() + "'");
    known.insert(t.name());
    if (consume != nullptr) {
      ::onnx::TensorProto* mine = consume->mutable_initializer(i);
      std::string().swap(*mine->mutable_raw_data());
      ::google::protobuf::RepeatedField<float>().Swap(mine->mutable_float_data());
    }
  }
  if (g.sparse_initializer_size()) fail(c, "graph '" + g.name() + "' has sparse initializers, which braid does not support");
  for (const auto& v : g.input()) {
    out.inputs.push_back(to_value_info(c, v, "graph input"));
    known.insert(v.name());
  }
  for (const auto& v : g.value_info()) out.value_info.push_back(to_value_info(c, v, "value"));
  // Nodes: converted in file order, then put in a topological order (Kahn), which also finds
  // cycles and inputs that nothing produces.
  const int n = g.node_size();
  std::vector<Node> nodes(static_cast<size_t>(n));
  std::map<std::string, int> producer;
  for (int i = 0; i < n; ++i) {
    const auto& p = g.node(i);
    Node& node = nodes[static_cast<size_t>(i)];
    node.name = p.name();
    node.op_type = p.op_type();
    node.domain = p.domain() == "ai.onnx" ? "" : p.domain();
    if (node.op_type.empty()) {
      std::ostringstream s;
      s << "node #" << i << " has no op_type";
      fail(c, s.str());
    }
    node.inputs.assign(p.input().begin(), p.input().end());
    node.outputs.assign(p.output().begin(), p.output().end());
    for (const std::string& o : node.outputs) {
      if (o.empty()) continue;
      if (producer.count(o) || (known.count(o) && !outer.count(o)))
        fail(c, "node " + node.label() + " produces '" + o + "', which is already defined (values are assigned once)");
      producer[o] = i;
    }
  }
  // Nodes whose subgraphs refer to outer values depend on those values' producers too; the
  // attributes are converted once the node's place is known (scope = everything defined so far).
  auto implicit_inputs = [&](const ::onnx::NodeProto& p) {
    std::vector<std::string> names;
    std::vector<const ::onnx::GraphProto*> stack;
    for (const auto& a : p.attribute()) {
      if (a.has_g()) stack.push_back(&a.g());
      for (const auto& sg : a.graphs()) stack.push_back(&sg);
    }
    for (size_t k = 0; k < stack.size() && k < 10000; ++k)
      for (const auto& sn : stack[k]->node()) {
        for (const auto& in : sn.input()) names.push_back(in);
        for (const auto& a : sn.attribute()) {
          if (a.has_g()) stack.push_back(&a.g());
          for (const auto& sg : a.graphs()) stack.push_back(&sg);
        }
      }
    return names;
  };
  std::vector<int> pending(static_cast<size_t>(n), 0);
  std::vector<std::vector<int>> users(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Node& node = nodes[static_cast<size_t>(i)];
    std::set<int> deps;
    for (const std::string& in : node.inputs) {
      if (in.empty() || (known.count(in) && !producer.count(in))) continue;
      auto it = producer.find(in);
      if (it == producer.end())
        fail(c, "node " + node.label() + " reads '" + in + "', which no node, graph input or initializer produces");
      deps.insert(it->second);
    }
    for (const std::string& in : implicit_inputs(g.node(i))) {
      auto it = producer.find(in);
      if (it != producer.end() && it->second != i) deps.insert(it->second);
    }
    for (int d : deps) users[static_cast<size_t>(d)].push_back(i);
    pending[static_cast<size_t>(i)] = static_cast<int>(deps.size());
  }
  std::vector<int> order, ready;
  for (int i = n - 1; i >= 0; --i)
    if (pending[static_cast<size_t>(i)] == 0) ready.push_back(i);
  while (!ready.empty()) {
    // Smallest index first, so a sorted file keeps its order.
    auto it = std::min_element(ready.begin(), ready.end());
    const int i = *it;
    ready.erase(it);
    order.push_back(i);
    for (int u : users[static_cast<size_t>(i)])
      if (--pending[static_cast<size_t>(u)] == 0) ready.push_back(u);
  }
  if (static_cast<int>(order.size()) != n) {
    std::string names;
    int listed = 0;
    for (int i = 0; i < n && listed < 5; ++i)
      if (pending[static_cast<size_t>(i)] > 0) {
        if (listed++) names += ", ";
        names += nodes[static_cast<size_t>(i)].label();
      }
    fail(c, "the graph has a cycle through nodes " + names);
  }
  for (int i : order) {
    Node node = std::move(nodes[static_cast<size_t>(i)]);
    for (const auto& a : g.node(i).attribute()) {
      if (node.attributes.count(a.name())) fail(c, "node " + node.label() + " has attribute '" + a.name() + "' twice");
      node.attributes[a.name()] = to_attribute(c, a, "node " + node.label(), known, depth);
    }
    for (const std::string& o : node.outputs)
      if (!o.empty()) known.insert(o);
    out.nodes.push_back(std::move(node));
  }
  for (const auto& v : g.output()) {
    if (!known.count(v.name())) fail(c, "graph output '" + v.name() + "' is produced by no node, input or initializer");
    out.outputs.push_back(to_value_info(c, v, "graph output"));
  }
  return out;
}

Model to_model(const Ctx& c, ::onnx::ModelProto& m) {
  Model out;
  out.path = c.file;
  out.ir_version = m.ir_version();
  if (out.ir_version < 3 || out.ir_version > kMaxIrVersion) {
    std::ostringstream s;
    s << "IR version " << out.ir_version << " is not one braid reads (3 to " << kMaxIrVersion << ")";
    fail(c, s.str());
  }
  out.producer_name = m.producer_name();
  out.producer_version = m.producer_version();
  for (const auto& op : m.opset_import()) {
    const std::string domain = op.domain() == "ai.onnx" ? "" : op.domain();
    const int64_t v = op.version();
    if (auto it = out.opsets.find(domain); it != out.opsets.end()) {  // merging scripts repeat one at one version
      if (it->second != v)
        fail(c, detail::cat("opset domain '", domain.empty() ? "ai.onnx" : domain, "' is imported twice, at versions ",
                            it->second, " and ", v));
      continue;
    }
    if (domain.empty() && (v < 1 || v > kMaxOpset))
      fail(c, detail::cat("it imports ai.onnx opset ", v, "; braid supports opsets 1 to ", kMaxOpset));
    if (v < 1) fail(c, "opset domain '" + domain + "' has version " + std::to_string(v));
    out.opsets[domain] = v;
  }
  if (!m.has_graph()) fail(c, "it has no graph");
  out.graph = to_graph(c, m.graph(), {}, 0, m.mutable_graph());
  for (const Node& n : out.graph.nodes)
    if (!out.opsets.count(n.domain))
      fail(c, "node " + n.label() + " is in domain '" + (n.domain.empty() ? std::string("ai.onnx") : n.domain) +
                  "', which the model does not import an opset of");
  return out;
}

template <typename Message>
void parse_bytes(const Ctx& c, const void* data, size_t size, Message& msg, const char* what) {
  if (static_cast<int64_t>(size) > c.options.max_file_bytes || size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    std::ostringstream s;
    s << "the file is " << size << " bytes, more than the limit of " << c.options.max_file_bytes;
    fail(c, s.str());
  }
  google::protobuf::io::CodedInputStream in(static_cast<const uint8_t*>(data), static_cast<int>(size));
  in.SetRecursionLimit(c.options.max_proto_nesting);
  if (!msg.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    std::ostringstream s;
    s << "it is not a valid " << what << " (" << size << " bytes: truncated, corrupt, or messages nested deeper than "
      << c.options.max_proto_nesting << " levels)";
    fail(c, s.str());
  }
}

std::string read_file(const Ctx& c, const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(c, "no such file");
  const auto size = fs::file_size(path, ec);
  if (ec) fail(c, "cannot read its size: " + ec.message());
  if (static_cast<int64_t>(size) > c.options.max_file_bytes) {
    std::ostringstream s;
    s << "the file is " << size << " bytes, more than the limit of " << c.options.max_file_bytes;
    fail(c, s.str());
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (!in) fail(c, "reading it failed");
  return bytes;
}

}  // namespace

std::string Node::label() const {
  std::string s = op_type;
  if (!name.empty()) {
    s += " '";
    s += name;
    s += '\'';
  } else {
    s += " (unnamed, first output '";
    s += outputs.empty() ? std::string() : outputs[0];
    s += "')";
  }
  return s;
}

Model parse_model(const void* data, size_t size, const std::string& name, const std::string& base_dir,
                  const LoadOptions& options) {
  Ctx c{name, base_dir, options};
  ::onnx::ModelProto m;
  parse_bytes(c, data, size, m, "ONNX model");
  return to_model(c, m);
}

Model load_model(const std::string& path, const LoadOptions& options) {
  const fs::path dir = fs::path(path).parent_path();
  Ctx c{path, dir.empty() ? std::string(".") : dir.string(), options};
  ::onnx::ModelProto m;
  {
    const std::string bytes = read_file(c, path);  // released once parsed: the weights are then held once
    parse_bytes(c, bytes.data(), bytes.size(), m, "ONNX model");
  }
  return to_model(c, m);
}

Tensor load_tensor(const std::string& path, const LoadOptions& options) {
  fs::path dir = fs::path(path).parent_path();
  Ctx c{path, dir.empty() ? "." : dir.string(), options};
  const std::string bytes = read_file(c, path);
  ::onnx::TensorProto t;
  parse_bytes(c, bytes.data(), bytes.size(), t, "ONNX TensorProto");
  return to_tensor(c, t, "");
}

}  // namespace braid::onnx
