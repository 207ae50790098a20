// Reader for the PyTorch reference files that tests/data/make_optim_reference.py writes (format in
// its docstring): named cases, each with word/number params and named tensors, so that a test can
// rebuild the exact inputs PyTorch saw and compare against its outputs.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace braid::testing {

struct RefTensor {
  std::string dtype;  // float32, float64 or int64
  Shape shape;
  std::vector<double> values;
  std::vector<int64_t> ints;

  /// The tensor in its own dtype (float32 values are exact in the file).
  Tensor make() const {
    if (dtype == "int64") return braid::tensor(ints, shape);
    Tensor t = braid::tensor(values, shape);
    return dtype == "float32" ? t.to(kFloat32) : t;
  }
};

struct RefCase {
  std::string name;
  std::map<std::string, std::vector<std::string>> params;
  std::map<std::string, RefTensor> tensors;

  bool has(const std::string& key) const { return params.count(key) > 0; }
  bool has_tensor(const std::string& key) const { return tensors.count(key) > 0; }
  const std::vector<std::string>& words(const std::string& key) const {
    auto it = params.find(key);
    if (it == params.end()) throw std::runtime_error("reference case " + name + " has no param '" + key + "'");
    return it->second;
  }
  std::string str(const std::string& key) const { return words(key).at(0); }
  double num(const std::string& key) const { return std::strtod(str(key).c_str(), nullptr); }
  double num(const std::string& key, double fallback) const { return has(key) ? num(key) : fallback; }
  const RefTensor& ref(const std::string& key) const {
    auto it = tensors.find(key);
    if (it == tensors.end()) throw std::runtime_error("reference case " + name + " has no tensor '" + key + "'");
    return it->second;
  }
  Tensor tensor(const std::string& key) const { return ref(key).make(); }
};

inline Shape parse_ref_shape(const std::string& s) {
  Shape shape;
  if (s == "scalar") return shape;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) shape.push_back(std::strtoll(part.c_str(), nullptr, 10));
  return shape;
}

/// Every case of the file, in order; throws when it cannot be opened.
inline std::vector<RefCase> load_reference(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path + "; run tests/data/make_optim_reference.py");
  std::vector<RefCase> cases;
  RefCase cur;
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty() || text[0] == '#') continue;
    std::istringstream line(text);
    std::string key;
    line >> key;
    if (key == "case") {
      cur = RefCase();
      line >> cur.name;
    } else if (key == "param") {
      std::string name, w;
      line >> name;
      auto& v = cur.params[name];
      while (line >> w) v.push_back(w);
    } else if (key == "tensor") {
      std::string name, shape, tok;
      RefTensor t;
      line >> name >> t.dtype >> shape;
      t.shape = parse_ref_shape(shape);
      while (line >> tok) {
        t.values.push_back(std::strtod(tok.c_str(), nullptr));
        t.ints.push_back(t.dtype == "int64" ? std::strtoll(tok.c_str(), nullptr, 10) : 0);
      }
      cur.tensors[name] = t;
    } else if (key == "end") {
      cases.push_back(cur);
    } else {
      throw std::runtime_error(path + ": unknown line '" + text.substr(0, 40) + "'");
    }
  }
  return cases;
}

/// The names of the cases whose name starts with prefix, for INSTANTIATE_TEST_SUITE_P.
inline std::vector<std::string> reference_names(const std::vector<RefCase>& cases, const std::string& prefix) {
  std::vector<std::string> names;
  for (const RefCase& c : cases)
    if (c.name.rfind(prefix, 0) == 0) names.push_back(c.name);
  return names;
}

/// A gtest-safe test name: letters, digits and '_' only.
inline std::string gtest_name(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

/// Largest |got - want| / (atol + rtol |want|) over the elements (<= 1 passes), with the position
/// of the worst element in where. Shapes must match; NaN must meet NaN.
inline double tolerance_ratio(const Tensor& got, const RefTensor& want, double rtol, double atol, std::string* where) {
  if (got.shape() != want.shape) {
    *where = "shape " + shape_str(got.shape()) + " vs reference " + shape_str(want.shape);
    return 1e300;
  }
  std::vector<double> g = got.to(kFloat64).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double w = want.values[i];
    double r;
    if (std::isnan(w) || std::isnan(g[i])) r = std::isnan(w) && std::isnan(g[i]) ? 0 : 1e300;
    else r = std::fabs(g[i] - w) / (atol + rtol * std::fabs(w));
    if (r > worst) {
      worst = r;
      std::ostringstream os;
      os.precision(17);
      os << "element " << i << ": got " << g[i] << ", want " << w;
      *where = os.str();
    }
  }
  return worst;
}

}  // namespace braid::testing
