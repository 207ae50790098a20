// The differential runner: builds each case's inputs (base tensor from raw bytes, then the view the
// case asks for), calls the op through the table, and compares dtype, shape and values with the
// reference, or checks that braid refused an input the reference refuses.
#include "diff/diff_runner.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace braid::diff {
namespace {

DType parse_dtype(const std::string& s) {
  static const std::map<std::string, DType> kNames = {
      {"float32", kFloat32}, {"float64", kFloat64}, {"int64", kInt64}, {"int32", kInt32}, {"bool", kBool}};
  auto it = kNames.find(s);
  if (it == kNames.end()) throw std::runtime_error("unknown dtype '" + s + "' in the case file");
  return it->second;
}

std::vector<uint8_t> unhex(const std::string& hex) {
  if (hex.size() % 2) throw std::runtime_error("odd-length hex data in the case file");
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

Shape shape_of(const Json& j) { return j.get<Shape>(); }

// The operand a case describes: its base tensor, seen through the view.
Tensor make_input(const Json& spec) {
  const DType dt = parse_dtype(spec.at("dtype"));
  const Shape shape = shape_of(spec.at("shape"));
  const std::vector<uint8_t> bytes = unhex(spec.at("data"));
  if (static_cast<int64_t>(bytes.size()) != shape_numel(shape) * dtype_size(dt))
    throw std::runtime_error("input data has " + std::to_string(bytes.size()) + " bytes for shape " + shape_str(shape));
  Tensor base = from_buffer(bytes.data(), shape, dt);
  const Json& view = spec.at("view");
  if (view.is_null()) return base;
  const std::string kind = view.at("kind");
  if (kind == "permute") return permute(base, view.at("order").get<std::vector<int64_t>>());
  if (kind == "slice") return slice(base, view.at("axis"), view.at("start"), view.at("end"), view.at("step"));
  if (kind == "expand") return expand(base, shape_of(view.at("shape")));
  throw std::runtime_error("unknown view kind '" + kind + "'");
}

std::string describe_inputs(const Json& inputs) {
  std::ostringstream s;
  for (const Json& in : inputs) {
    s << " " << in.at("dtype").get<std::string>() << shape_str(shape_of(in.at("shape")));
    if (!in.at("view").is_null()) s << "/" << in.at("view").dump();
  }
  return s.str();
}

// Element i of a contiguous CPU tensor as double (for comparison only; int64 beyond 2^53 compares
// through the integer path).
double value_at(const void* data, DType dt, int64_t i) {
  switch (dt) {
    case DType::Float32:
      return static_cast<const float*>(data)[i];
    case DType::Float64:
      return static_cast<const double*>(data)[i];
    case DType::Int64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::Int32:
      return static_cast<const int32_t*>(data)[i];
    case DType::Bool:
      return static_cast<const uint8_t*>(data)[i];
    default:
      return 0;
  }
}

int64_t int_at(const void* data, DType dt, int64_t i) {
  switch (dt) {
    case DType::Int64:
      return static_cast<const int64_t*>(data)[i];
    case DType::Int32:
      return static_cast<const int32_t*>(data)[i];
    case DType::Bool:
      return static_cast<const uint8_t*>(data)[i];
    default:
      return 0;
  }
}

bool float_close(double got, double want, double rtol, double atol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// "" when got matches the expected output spec.
std::string compare_output(const Tensor& got_in, const Json& want, size_t index) {
  const std::string tag = "output " + std::to_string(index) + ": ";
  const DType dt = parse_dtype(want.at("dtype"));
  const Shape shape = shape_of(want.at("shape"));
  if (got_in.dtype() != dt) return tag + "dtype " + dtype_name(got_in.dtype()) + ", want " + dtype_name(dt);
  if (got_in.shape() != shape) return tag + "shape " + shape_str(got_in.shape()) + ", want " + shape_str(shape);
  const Tensor got = got_in.contiguous().cpu();
  const std::vector<uint8_t> bytes = unhex(want.at("data"));
  const int64_t n = got.numel();
  if (static_cast<int64_t>(bytes.size()) != n * dtype_size(dt)) return tag + "expected data has the wrong length";
  const double rtol = want.value("rtol", 0.0), atol = want.value("atol", 0.0);
  std::ostringstream bad;
  int64_t nbad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool ok;
    if (is_floating(dt)) {
      ok = float_close(value_at(got.raw_data(), dt, i), value_at(bytes.data(), dt, i), rtol, atol);
    } else {
      ok = int_at(got.raw_data(), dt, i) == int_at(bytes.data(), dt, i);
    }
    if (!ok && nbad++ < 4) {
      bad.precision(17);
      bad << " [" << i << "] got " << value_at(got.raw_data(), dt, i) << " want " << value_at(bytes.data(), dt, i);
    }
  }
  if (nbad == 0) return "";
  std::ostringstream s;
  s << tag << nbad << " of " << n << " values differ (rtol " << rtol << ", atol " << atol << "):" << bad.str();
  return s.str();
}

}  // namespace

std::vector<DiffCase> load_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open the differential cases '" + path + "'");
  std::vector<DiffCase> cases;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": " + e.what());
    }
    if (lineno == 1) {
      if (j.value("format", "") != "braid-diff-1")
        throw std::runtime_error(path + ": not a braid-diff-1 case file (first line " + line.substr(0, 80) + ")");
      continue;
    }
    cases.push_back({j.at("id").get<int64_t>(), j.at("op").get<std::string>(), std::move(j)});
  }
  return cases;
}

std::string run_case(const DiffCase& c, const OpTable& ops) {
  const Json& j = c.json;
  std::ostringstream head;
  head << "case " << c.id << " " << c.op << " args " << j.at("args").dump() << " inputs"
       << describe_inputs(j.at("inputs")) << ": ";
  auto it = ops.find(c.op);
  if (it == ops.end()) return head.str() + "no such op in the runner's table";
  std::vector<Tensor> inputs;
  for (const Json& spec : j.at("inputs")) inputs.push_back(make_input(spec));

  const Json& expect = j.at("expect");
  std::vector<Tensor> outs;
  try {
    outs = it->second.run(inputs, j.at("args"));
  } catch (const Error& e) {
    if (!expect.contains("error")) return head.str() + "braid threw where the reference accepts: " + e.what();
    const std::string want = expect.at("error");
    const std::string msg = e.what();
    if (msg.find(it->second.braid_name) == std::string::npos)
      return head.str() + "the error does not name the op '" + it->second.braid_name + "': " + msg;
    if (want == "IndexError" && dynamic_cast<const IndexError*>(&e) == nullptr)
      return head.str() + "want an IndexError, got: " + msg;
    if (want == "TypeError" && dynamic_cast<const TypeError*>(&e) == nullptr)
      return head.str() + "want a TypeError, got: " + msg;
    if (want == "ValueError" && dynamic_cast<const ValueError*>(&e) == nullptr)
      return head.str() + "want a ValueError, got: " + msg;
    return "";
  } catch (const std::exception& e) {
    return head.str() + "threw a non-braid exception: " + e.what();
  }
  if (expect.contains("error"))
    return head.str() + "braid accepted an input the reference rejects (" + expect.at("error").get<std::string>() + ")";
  const Json& want = expect.at("outputs");
  if (outs.size() != want.size())
    return head.str() + std::to_string(outs.size()) + " outputs, want " + std::to_string(want.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string d = compare_output(outs[i], want[i], i);
    if (!d.empty()) return head.str() + d;
  }
  return "";
}

}  // namespace braid::diff
