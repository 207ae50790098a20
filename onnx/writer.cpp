// Writing braid's onnx::Model back to an ONNX file (braid/onnx/export.h).
//
// Note [Writing ONNX files]
// Tensors are written as raw little-endian data (the form every ONNX reader accepts), values
// bit for bit, so importing a written model gives bitwise the same weights. The file is written
// to "<path>.tmp" and renamed over path only once complete, so a crash while writing never leaves
// a truncated model where a good one was. Integer types that the loader widened (int16,
// uint16 -> int32; uint32 -> int64) are written in the widened type; int8 and uint8 as themselves.
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "braid/onnx/export.h"
#include "braid/ops.h"

namespace braid::onnx {

namespace {

int32_t proto_type(DType t) {
  using TP = ::onnx::TensorProto;
  switch (t) {
    case DType::Float32: return TP::FLOAT;
    case DType::Float64: return TP::DOUBLE;
    case DType::Int64: return TP::INT64;
    case DType::Int32: return TP::INT32;
    case DType::Bool: return TP::BOOL;
    case DType::Float16: return TP::FLOAT16;
    case DType::BFloat16: return TP::BFLOAT16;
    case DType::Int8:
      return TP::INT8;
    case DType::UInt8:
      return TP::UINT8;
  }
  return TP::UNDEFINED;
}

void write_tensor(const Tensor& t0, const std::string& name, ::onnx::TensorProto& p) {
  p.set_name(name);
  p.set_data_type(proto_type(t0.dtype()));
  for (int64_t d : t0.shape()) p.add_dims(d);
  Tensor t = contiguous(t0.detach()).cpu();
  const size_t bytes = static_cast<size_t>(t.numel() * t.element_size());
  if (t.dtype() == kBool) {
    std::string raw(static_cast<size_t>(t.numel()), '\0');
    const bool* b = t.data<bool>();
    for (int64_t i = 0; i < t.numel(); ++i) raw[static_cast<size_t>(i)] = b[i] ? 1 : 0;
    p.set_raw_data(raw);
  } else {
    p.set_raw_data(std::string(static_cast<const char*>(t.raw_data()), bytes));
  }
}

void write_value_info(const ValueInfo& v, ::onnx::ValueInfoProto& p) {
  p.set_name(v.name);
  if (!v.has_type) return;  // as the file it came from had it (a subgraph output left untyped)
  auto* tt = p.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(proto_type(v.dtype));
  if (!v.has_shape) return;
  auto* shape = tt->mutable_shape();
  for (const Dim& d : v.shape) {
    auto* dim = shape->add_dim();
    if (d.size >= 0) dim->set_dim_value(d.size);
    else if (!d.symbol.empty()) dim->set_dim_param(d.symbol);
  }
}

void write_graph(const Graph& g, ::onnx::GraphProto& p);

void write_attribute(const std::string& name, const Attribute& a, ::onnx::AttributeProto& p) {
  using AP = ::onnx::AttributeProto;
  p.set_name(name);
  switch (a.kind) {
    case Attribute::Kind::Float: p.set_type(AP::FLOAT); p.set_f(static_cast<float>(a.f)); break;
    case Attribute::Kind::Int: p.set_type(AP::INT); p.set_i(a.i); break;
    case Attribute::Kind::String: p.set_type(AP::STRING); p.set_s(a.s); break;
    case Attribute::Kind::Tensor: p.set_type(AP::TENSOR); write_tensor(a.t, "", *p.mutable_t()); break;
    case Attribute::Kind::Graph: p.set_type(AP::GRAPH); write_graph(*a.g, *p.mutable_g()); break;
    case Attribute::Kind::Floats:
      p.set_type(AP::FLOATS);
      for (double f : a.floats) p.add_floats(static_cast<float>(f));
      break;
    case Attribute::Kind::Ints:
      p.set_type(AP::INTS);
      for (int64_t i : a.ints) p.add_ints(i);
      break;
    case Attribute::Kind::Strings:
      p.set_type(AP::STRINGS);
      for (const auto& s : a.strings) p.add_strings(s);
      break;
    case Attribute::Kind::Tensors:
      p.set_type(AP::TENSORS);
      for (const auto& t : a.tensors) write_tensor(t, "", *p.add_tensors());
      break;
    case Attribute::Kind::Graphs:
      p.set_type(AP::GRAPHS);
      for (const auto& sub : a.graphs) write_graph(*sub, *p.add_graphs());
      break;
  }
}

void write_graph(const Graph& g, ::onnx::GraphProto& p) {
  p.set_name(g.name.empty() ? "braid" : g.name);
  for (const Node& n : g.nodes) {
    auto* np = p.add_node();
    np->set_name(n.name);
    np->set_op_type(n.op_type);
    if (!n.domain.empty()) np->set_domain(n.domain);
    for (const auto& i : n.inputs) np->add_input(i);
    for (const auto& o : n.outputs) np->add_output(o);
    for (const auto& [name, a] : n.attributes) write_attribute(name, a, *np->add_attribute());
  }
  for (const auto& [name, t] : g.initializers) write_tensor(t, name, *p.add_initializer());
  for (const auto& v : g.inputs) write_value_info(v, *p.add_input());
  for (const auto& v : g.outputs) write_value_info(v, *p.add_output());
  for (const auto& v : g.value_info) write_value_info(v, *p.add_value_info());
}

}  // namespace

std::string serialize_model(const Model& m) {
  ::onnx::ModelProto p;
  p.set_ir_version(m.ir_version > 0 ? m.ir_version : 8);
  p.set_producer_name(m.producer_name.empty() ? "braid" : m.producer_name);
  if (!m.producer_version.empty()) p.set_producer_version(m.producer_version);
  for (const auto& [domain, version] : m.opsets) {
    auto* o = p.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  write_graph(m.graph, *p.mutable_graph());
  std::string out;
  BRAID_CHECK(p.SerializeToString(&out), "save_model: could not serialise the model (over 2 GiB?)");
  return out;
}

namespace {
void write_file(const std::string& bytes, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    BRAID_CHECK(f.good(), "save_model: cannot write '", tmp, "': ", std::strerror(errno));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      throw ValueError(detail::cat("save_model: writing '", tmp, "' failed: ", std::strerror(errno)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw ValueError(detail::cat("save_model: cannot rename '", tmp, "' to '", path, "': ", ec.message()));
  }
}
}  // namespace

void save_model(const Model& m, const std::string& path) { write_file(serialize_model(m), path); }

void save_tensor(const Tensor& t, const std::string& path, const std::string& name) {
  ::onnx::TensorProto p;
  write_tensor(t, name, p);
  std::string bytes;
  BRAID_CHECK(p.SerializeToString(&bytes), "save_tensor: could not serialise a tensor of shape ", shape_str(t.shape()));
  write_file(bytes, path);
}

}  // namespace braid::onnx
