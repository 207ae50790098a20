// Golden-value tests: every op against NumPy results committed in tests/data/golden.txt, which
// tests/data/make_golden.py writes (see its docstring for the format and the tolerances). One gtest
// case per golden case; the op is chosen by the case name's prefix through the table below.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "test_paths.h"

namespace braid {
namespace {

const std::string kGoldenPath = std::string(braid::test::data_dir()) + "/golden.txt";

// ---- the golden file ----

struct Array {
  std::string kind;  // float32, float64, int64, int32, bool, float16bits, bfloat16bits
  Shape shape;
  std::string layout = "c";  // inputs only: c, t (stored transposed) or s (stored with stride 2)
  std::vector<double> f;     // the values as doubles
  std::vector<int64_t> i;    // the values as integers (exact for int64 beyond 2^53)
};

struct GoldenCase {
  std::string name;
  std::map<std::string, std::vector<std::string>> params;
  std::vector<Array> inputs, outputs;
  double rtol = 0, atol = 0;
  std::string parse_error;

  std::string op() const { return name.substr(0, name.find('/')); }
  bool has(const std::string& key) const { return params.count(key) > 0; }
  const std::vector<std::string>& words(const std::string& key) const {
    auto it = params.find(key);
    if (it == params.end()) throw std::runtime_error("golden case " + name + " has no param '" + key + "'");
    return it->second;
  }
  std::string str(const std::string& key) const {
    const auto& w = words(key);
    if (w.size() != 1) throw std::runtime_error("golden case " + name + ": param '" + key + "' is not one word");
    return w[0];
  }
  double num(const std::string& key) const { return std::strtod(str(key).c_str(), nullptr); }
  int64_t integer(const std::string& key) const { return std::strtoll(str(key).c_str(), nullptr, 10); }
  std::vector<int64_t> ints(const std::string& key) const {
    std::vector<int64_t> out;
    for (const std::string& w : words(key)) out.push_back(std::strtoll(w.c_str(), nullptr, 10));
    return out;
  }
};

Shape parse_shape(const std::string& s) {
  Shape shape;
  if (s == "scalar") return shape;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) shape.push_back(std::strtoll(part.c_str(), nullptr, 10));
  return shape;
}

Array parse_array(std::istringstream& line, bool is_input) {
  Array a;
  std::string shape;
  line >> a.kind >> shape;
  a.shape = parse_shape(shape);
  if (is_input) line >> a.layout;
  const bool floating = a.kind == "float32" || a.kind == "float64";
  std::string tok;
  while (line >> tok) {
    a.f.push_back(std::strtod(tok.c_str(), nullptr));
    a.i.push_back(floating ? 0 : std::strtoll(tok.c_str(), nullptr, 10));
  }
  return a;
}

std::vector<GoldenCase> load_golden() {
  std::vector<GoldenCase> cases;
  std::ifstream in(kGoldenPath);
  if (!in) {
    GoldenCase missing;
    missing.name = "missing_golden_file";
    missing.parse_error = "cannot open " + kGoldenPath + "; run tests/data/make_golden.py";
    return {missing};
  }
  std::string text;
  GoldenCase cur;
  bool open = false;
  while (std::getline(in, text)) {
    if (text.empty() || text[0] == '#') continue;
    std::istringstream line(text);
    std::string key;
    line >> key;
    if (key == "case") {
      cur = GoldenCase();
      line >> cur.name;
      open = true;
    } else if (key == "param") {
      std::string name, w;
      line >> name;
      auto& v = cur.params[name];
      while (line >> w) v.push_back(w);
    } else if (key == "input") {
      cur.inputs.push_back(parse_array(line, true));
    } else if (key == "output") {
      cur.outputs.push_back(parse_array(line, false));
    } else if (key == "tol") {
      line >> cur.rtol >> cur.atol;
    } else if (key == "end") {
      if (open) cases.push_back(cur);
      open = false;
    } else {
      cur.parse_error = "unknown line '" + text.substr(0, 40) + "'";
    }
  }
  return cases;
}

const std::vector<GoldenCase>& golden() {
  static const std::vector<GoldenCase> cases = load_golden();
  return cases;
}

// ---- building inputs and reading outputs ----

DType dtype_from(const std::string& s) {
  static const std::map<std::string, DType> names = {
      {"float32", kFloat32}, {"float64", kFloat64}, {"int64", kInt64},          {"int32", kInt32},
      {"bool", kBool},       {"float16", kFloat16}, {"float16bits", kFloat16}, {"bfloat16", kBFloat16},
      {"bfloat16bits", kBFloat16}};
  auto it = names.find(s);
  if (it == names.end()) throw std::runtime_error("unknown dtype '" + s + "' in golden file");
  return it->second;
}

Tensor make_input(const Array& a) {
  Tensor t;
  if (a.kind == "float32") {
    t = tensor(std::vector<float>(a.f.begin(), a.f.end()), a.shape);
  } else if (a.kind == "float64") {
    t = tensor(a.f, a.shape);
  } else if (a.kind == "int64") {
    t = tensor(a.i, a.shape);
  } else if (a.kind == "int32") {
    t = tensor(std::vector<int32_t>(a.i.begin(), a.i.end()), a.shape);
  } else if (a.kind == "bool") {
    std::vector<bool> b;
    for (int64_t v : a.i) b.push_back(v != 0);
    t = tensor_bool(b, a.shape);
  } else {
    throw std::runtime_error("unsupported input dtype " + a.kind);
  }
  if (a.layout == "t") {
    t = t.mT();
    EXPECT_FALSE(t.is_contiguous()) << "layout t should give a non-contiguous view";
  } else if (a.layout == "s") {
    t = t.slice(-1, 0, t.size(-1), 2);
    EXPECT_FALSE(t.is_contiguous() && t.numel() > 1) << "layout s should give a strided view";
  }
  return t;
}

std::optional<double> opt(const GoldenCase& c, const std::string& key) {
  if (c.str(key) == "none") return std::nullopt;
  return c.num(key);
}

// ---- the op table: case-name prefix -> how to call braid ----

using Ins = std::vector<Tensor>;
using OpFn = std::function<std::vector<Tensor>(const GoldenCase&, const Ins&)>;

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

std::map<std::string, OpFn> op_table() {
  std::map<std::string, OpFn> t;
  auto unary = [&](const std::string& name, Tensor (*f)(const Tensor&)) {
    t[name] = [f](const GoldenCase&, const Ins& x) { return one(f(x[0])); };
  };
  unary("neg", neg);
  unary("abs", abs);
  unary("exp", exp);
  unary("log", log);
  unary("log1p", log1p);
  unary("expm1", expm1);
  unary("sqrt", sqrt);
  unary("rsqrt", rsqrt);
  unary("square", square);
  unary("reciprocal", reciprocal);
  unary("sin", sin);
  unary("cos", cos);
  unary("tanh", tanh);
  unary("sigmoid", sigmoid);
  unary("relu", relu);
  unary("silu", silu);
  unary("softplus", softplus);
  unary("erf", erf);
  unary("sign", sign);
  unary("floor", floor);
  unary("ceil", ceil);
  unary("round", round);
  unary("logical_not", logical_not);
  unary("isnan", isnan);
  t["gelu"] = [](const GoldenCase& c, const Ins& x) { return one(gelu(x[0], c.str("approximate"))); };
  t["leaky_relu"] = [](const GoldenCase& c, const Ins& x) { return one(leaky_relu(x[0], c.num("negative_slope"))); };
  t["elu"] = [](const GoldenCase& c, const Ins& x) { return one(elu(x[0], c.num("alpha"))); };
  t["pow_scalar"] = [](const GoldenCase& c, const Ins& x) { return one(pow(x[0], c.num("exponent"))); };
  t["clamp"] = [](const GoldenCase& c, const Ins& x) { return one(clamp(x[0], opt(c, "min"), opt(c, "max"))); };

  t["add"] = [](const GoldenCase& c, const Ins& x) { return one(c.has("alpha") ? add(x[0], x[1], c.num("alpha")) : x[0] + x[1]); };
  t["sub"] = [](const GoldenCase& c, const Ins& x) { return one(c.has("alpha") ? sub(x[0], x[1], c.num("alpha")) : x[0] - x[1]); };
  auto binary = [&](const std::string& name, Tensor (*f)(const Tensor&, const Tensor&)) {
    t[name] = [f](const GoldenCase&, const Ins& x) { return one(f(x[0], x[1])); };
  };
  binary("mul", mul);
  binary("div", div);
  binary("maximum", maximum);
  binary("minimum", minimum);
  binary("eq", eq);
  binary("ne", ne);
  binary("lt", lt);
  binary("le", le);
  binary("gt", gt);
  binary("ge", ge);
  binary("logical_and", logical_and);
  binary("logical_or", logical_or);
  binary("logical_xor", logical_xor);
  t["pow"] = [](const GoldenCase&, const Ins& x) { return one(pow(x[0], x[1])); };
  t["where"] = [](const GoldenCase&, const Ins& x) { return one(where(x[0], x[1], x[2])); };

  auto reduction = [&](const std::string& name, Tensor (*f)(const Tensor&, const std::vector<int64_t>&, bool)) {
    t[name] = [f](const GoldenCase& c, const Ins& x) { return one(f(x[0], c.ints("axes"), c.integer("keepdim") != 0)); };
  };
  reduction("sum", sum);
  reduction("mean", mean);
  reduction("prod", prod);
  reduction("amax", amax);
  reduction("amin", amin);
  reduction("logsumexp", logsumexp);
  t["argmax"] = [](const GoldenCase& c, const Ins& x) { return one(argmax(x[0], c.integer("axis"), c.integer("keepdim") != 0)); };
  t["argmin"] = [](const GoldenCase& c, const Ins& x) { return one(argmin(x[0], c.integer("axis"), c.integer("keepdim") != 0)); };
  t["var"] = [](const GoldenCase& c, const Ins& x) {
    return one(var(x[0], c.ints("axes"), c.integer("correction"), c.integer("keepdim") != 0));
  };
  t["std"] = [](const GoldenCase& c, const Ins& x) {
    return one(braid::std(x[0], c.ints("axes"), c.integer("correction"), c.integer("keepdim") != 0));
  };
  t["softmax"] = [](const GoldenCase& c, const Ins& x) { return one(softmax(x[0], c.integer("axis"))); };
  t["log_softmax"] = [](const GoldenCase& c, const Ins& x) { return one(log_softmax(x[0], c.integer("axis"))); };
  t["sum_full"] = [](const GoldenCase& c, const Ins&) {
    Tensor x = full(c.ints("shape"), c.num("value"), dtype_from(c.str("dtype")));
    return one(c.has("axes") ? sum(x, c.ints("axes")) : sum(x));
  };

  t["matmul"] = [](const GoldenCase&, const Ins& x) { return one(matmul(x[0], x[1])); };

  t["concat"] = [](const GoldenCase& c, const Ins& x) { return one(concat(x, c.integer("axis"))); };
  t["stack"] = [](const GoldenCase& c, const Ins& x) { return one(stack(x, c.integer("axis"))); };
  t["split"] = [](const GoldenCase& c, const Ins& x) { return split(x[0], c.ints("sizes"), c.integer("axis")); };
  t["chunk"] = [](const GoldenCase& c, const Ins& x) { return chunk(x[0], c.integer("n"), c.integer("axis")); };
  t["gather"] = [](const GoldenCase& c, const Ins& x) { return one(gather(x[0], c.integer("axis"), x[1])); };
  t["index_select"] = [](const GoldenCase& c, const Ins& x) { return one(index_select(x[0], c.integer("axis"), x[1])); };
  t["scatter_add"] = [](const GoldenCase& c, const Ins& x) { return one(scatter_add(x[0], c.integer("axis"), x[1], x[2])); };
  t["pad"] = [](const GoldenCase& c, const Ins& x) { return one(pad(x[0], c.ints("pads"), c.str("mode"), c.num("value"))); };
  t["one_hot"] = [](const GoldenCase& c, const Ins& x) {
    return one(one_hot(x[0], c.integer("num_classes"), dtype_from(c.str("dtype"))));
  };
  t["tril"] = [](const GoldenCase& c, const Ins& x) { return one(tril(x[0], c.integer("diagonal"))); };
  t["triu"] = [](const GoldenCase& c, const Ins& x) { return one(triu(x[0], c.integer("diagonal"))); };

  t["cast"] = [](const GoldenCase& c, const Ins& x) { return one(cast(x[0], dtype_from(c.str("dtype")))); };
  // Half types: the bit patterns of the cast, or its value read back as float32.
  auto half_cast = [](const GoldenCase& c, const Ins& x) {
    Tensor h = x[0].to(dtype_from(c.str("dtype")));
    return one(c.outputs.at(0).kind == "float32" ? h.to(kFloat32) : h);
  };
  t["cast_half"] = half_cast;
  t["cast_bf16"] = half_cast;
  t["arange"] = [](const GoldenCase& c, const Ins&) {
    return one(arange(c.num("start"), c.num("end"), c.num("step"), dtype_from(c.str("dtype"))));
  };
  t["linspace"] = [](const GoldenCase& c, const Ins&) {
    return one(linspace(c.num("start"), c.num("end"), c.integer("steps"), dtype_from(c.str("dtype"))));
  };
  t["eye"] = [](const GoldenCase& c, const Ins&) { return one(eye(c.integer("n"), dtype_from(c.str("dtype")))); };
  return t;
}

const std::map<std::string, OpFn>& ops() {
  static const std::map<std::string, OpFn> table = op_table();
  return table;
}

std::string known_ops() {
  std::string s;
  for (const auto& [name, fn] : ops()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// ---- comparison ----

std::vector<int64_t> half_bits(const Tensor& t) {
  Tensor c = t.contiguous().cpu();
  std::vector<int64_t> bits;
  if (c.dtype() == kFloat16) {
    const auto* p = c.data<detail::Half>();
    for (int64_t k = 0; k < c.numel(); ++k) bits.push_back(p[k].bits);
  } else {
    const auto* p = c.data<detail::BFloat16>();
    for (int64_t k = 0; k < c.numel(); ++k) bits.push_back(p[k].bits);
  }
  return bits;
}

void expect_matches(const Tensor& got, const Array& want, double rtol, double atol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined result";
  const std::string want_dtype = want.kind == "float16bits" ? "float16" : want.kind == "bfloat16bits" ? "bfloat16" : want.kind;
  EXPECT_EQ(dtype_name(got.dtype()), want_dtype) << what << ": dtype";
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape)) << what << ": shape";
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.f.size()) << what << ": golden value count";
  int shown = 0, bad = 0;
  std::ostringstream report;
  report.precision(17);
  if (want.kind == "float32" || want.kind == "float64") {
    std::vector<double> g = got.to_vector<double>();
    for (size_t k = 0; k < g.size(); ++k) {
      const double w = want.f[k];
      bool ok;
      if (std::isnan(w)) ok = std::isnan(g[k]);
      else if (std::isinf(w)) ok = g[k] == w;
      else ok = std::isfinite(g[k]) && std::fabs(g[k] - w) <= atol + rtol * std::fabs(w);
      if (!ok) {
        ++bad;
        if (shown++ < 8)
          report << "\n  [" << k << "] got " << g[k] << " want " << w << " (|diff| " << std::fabs(g[k] - w)
                 << ", allowed " << atol + rtol * std::fabs(w) << ")";
      }
    }
  } else {
    std::vector<int64_t> g =
        (want.kind == "float16bits" || want.kind == "bfloat16bits") ? half_bits(got) : got.to_vector<int64_t>();
    for (size_t k = 0; k < g.size(); ++k) {
      if (g[k] != want.i[k]) {
        ++bad;
        if (shown++ < 8) report << "\n  [" << k << "] got " << g[k] << " want " << want.i[k];
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.f.size() << " values differ (rtol " << rtol << ", atol "
                    << atol << ")" << report.str();
}

// ---- the parameterised test ----

class Golden : public ::testing::TestWithParam<size_t> {};

TEST_P(Golden, MatchesNumPy) {
  const GoldenCase& c = golden().at(GetParam());
  ASSERT_TRUE(c.parse_error.empty()) << c.name << ": " << c.parse_error;
  auto it = ops().find(c.op());
  ASSERT_NE(it, ops().end()) << "golden case " << c.name << " names unknown op '" << c.op() << "'; known: " << known_ops();
  Ins inputs;
  for (const Array& a : c.inputs) inputs.push_back(make_input(a));
  std::vector<Tensor> outs;
  try {
    outs = it->second(c, inputs);
  } catch (const std::exception& e) {
    FAIL() << c.name << " threw: " << e.what();
  }
  ASSERT_EQ(outs.size(), c.outputs.size()) << c.name << ": number of outputs";
  for (size_t k = 0; k < outs.size(); ++k)
    expect_matches(outs[k], c.outputs[k], c.rtol, c.atol, c.name + " output " + std::to_string(k));
}

std::string sanitized(std::string s) {
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// The case name with '/', '.' and '-' turned into '_' (stable as cases are added); the index is
// appended only where two names would collide after that.
std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  const std::string s = sanitized(golden().at(info.param).name);
  int same = 0;
  for (const GoldenCase& c : golden()) same += sanitized(c.name) == s;
  return same == 1 ? s : s + "_" + std::to_string(info.param);
}

std::vector<size_t> indices() {
  std::vector<size_t> v(golden().size());
  for (size_t k = 0; k < v.size(); ++k) v[k] = k;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, Golden, ::testing::ValuesIn(indices()), case_name);

// Every op of ops.h that computes values has golden cases, and the table knows every op the file uses.
TEST(GoldenCoverage, EveryOpHasCases) {
  std::map<std::string, int> count;
  for (const GoldenCase& c : golden()) ++count[c.op()];
  const std::vector<std::string> required = {
      "neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos", "tanh",
      "sigmoid", "relu", "leaky_relu", "elu", "silu", "softplus", "gelu", "erf", "pow_scalar", "clamp", "sign",
      "floor", "ceil", "round", "logical_not", "isnan", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq",
      "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "where", "sum", "mean", "prod",
      "amax", "amin", "argmax", "argmin", "var", "std", "logsumexp", "softmax", "log_softmax", "matmul", "concat",
      "stack", "split", "chunk", "gather", "index_select", "scatter_add", "pad", "one_hot", "tril", "triu", "cast",
      "cast_half", "cast_bf16", "arange", "linspace", "eye"};
  for (const std::string& op : required) EXPECT_GE(count[op], 1) << "no golden case for " << op;
  for (const auto& [op, n] : count) EXPECT_TRUE(ops().count(op)) << "golden file uses unknown op " << op;
  EXPECT_GT(golden().size(), 1000u);
}

// ---- large tensors: the multi-threaded kernel paths, against hand-computed exact values ----

TEST(LargeTensors, ArgExtremaTiesAcrossThreadChunks) {
  // Equal extremes far apart land in different threads' chunks; the first index must still win.
  const int64_t n = 1000003;
  std::vector<float> v(n, 0.0f);
  v[300001] = 5;
  v[900000] = 5;
  v[2] = -1;
  v[999999] = -1;
  Tensor x = tensor(v, {n});
  EXPECT_EQ(argmax(x, 0).item(), 300001);
  EXPECT_EQ(argmin(x, 0).item(), 2);
  EXPECT_EQ(amax(x).item(), 5);
  EXPECT_EQ(amin(x).item(), -1);
  // Row-wise over (4, 250000): the maxima 7 at columns 10 and 200000 of every row.
  std::vector<float> w(1000000, 1.0f);
  for (int r = 0; r < 4; ++r) w[r * 250000 + 10] = w[r * 250000 + 200000] = 7;
  EXPECT_EQ(argmax(tensor(w, {4, 250000}), 1).to_vector<int64_t>(), (std::vector<int64_t>{10, 10, 10, 10}));
  // The same along axis 0 of the transpose (a strided reduction).
  EXPECT_EQ(argmax(tensor(w, {4, 250000}).mT(), 0).to_vector<int64_t>(), (std::vector<int64_t>{10, 10, 10, 10}));
}

TEST(LargeTensors, ExactIntegerAndFloat64Reductions) {
  // sum 0..n-1 = n(n-1)/2; population variance of 0..n-1 = (n^2 - 1)/12.
  const int64_t n = 1000000;
  EXPECT_EQ(sum(arange(n)).to_vector<int64_t>(), (std::vector<int64_t>{n * (n - 1) / 2}));
  EXPECT_EQ(sum(arange(n, kInt32)).dtype(), kInt64);
  EXPECT_EQ(sum(arange(n, kInt32)).to_vector<int64_t>(), (std::vector<int64_t>{n * (n - 1) / 2}));
  Tensor x = arange(n, kFloat64);
  EXPECT_DOUBLE_EQ(mean(x).item(), (n - 1) / 2.0);
  // The centred squares are exact in float64, so the only error is the summation's: at most
  // n * eps relative for any order of additions (1.1e-10).
  EXPECT_NEAR(var(x, {}, 0).item(), (static_cast<double>(n) * n - 1) / 12, 1.1e-10 * 8.4e10);
  EXPECT_NEAR(var(x, {}, 1).item(), static_cast<double>(n) * (n + 1) / 12, 1.1e-10 * 8.4e10);
  // Row sums of a (1000, 1000) block: row i holds 1000 i .. 1000 i + 999, sum 10^6 i + 499500.
  std::vector<double> rows = sum(x.reshape({1000, 1000}), {1}).to_vector<double>();
  std::vector<double> cols = sum(x.reshape({1000, 1000}), {0}).to_vector<double>();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(rows[i], 1e6 * i + 499500) << "row " << i;
    ASSERT_EQ(cols[i], 1000.0 * i + 499500000) << "column " << i;  // sum_r (1000 r + i)
  }
}

TEST(LargeTensors, StridedAndBroadcastElementwise) {
  // x[i][j] = 1000 i + j (exact in float32); its transpose t[i][j] = 1000 j + i.
  Tensor x = arange(0.0, 1e6, 1.0, kFloat32).reshape({1000, 1000});
  std::vector<float> y = (x.mT() * 2.0 + 1.0).to_vector<float>();
  std::vector<float> b = (arange(0.0, 1000.0, 1.0, kFloat32).reshape({1000, 1}) * 1000.0 +
                          arange(0.0, 1000.0, 1.0, kFloat32).reshape({1, 1000}))
                             .to_vector<float>();
  std::vector<float> sl = x.slice(1, 1, 1000, 3).to_vector<float>();  // columns 1, 4, ..., 997
  int bad = 0;
  for (int i = 0; i < 1000; ++i)
    for (int j = 0; j < 1000; ++j) {
      bad += y[i * 1000 + j] != 2.0f * (1000 * j + i) + 1;
      bad += b[i * 1000 + j] != 1000.0f * i + j;
      if (j < 333) bad += sl[i * 333 + j] != 1000.0f * i + 1 + 3 * j;
    }
  EXPECT_EQ(bad, 0);
  // exp of a large strided view: exp(0) = 1 and exp(log 2) = 2 exactly enough to test placement.
  Tensor z = zeros({2000, 600}).mT();
  z.select(0, 5).fill_(std::log(2.0));
  std::vector<float> e = exp(z).to_vector<float>();
  for (int i = 0; i < 600; ++i)
    for (int j = 0; j < 2000; j += 97) ASSERT_NEAR(e[i * 2000 + j], i == 5 ? 2.0f : 1.0f, 4e-7f) << i << "," << j;
}

TEST(LargeTensors, SoftmaxRows) {
  // Uniform rows give 1/n; one large entry per row takes all the mass without overflow.
  Tensor x = zeros({512, 1000});
  std::vector<float> s = softmax(x, 1).to_vector<float>();
  for (float v : s) ASSERT_NEAR(v, 1e-3f, 1e-9f);
  x.narrow(1, 7, 1).fill_(1e4);
  std::vector<float> p = softmax(x, -1).to_vector<float>();
  for (int r = 0; r < 512; ++r) {
    ASSERT_EQ(p[r * 1000 + 7], 1.0f);
    ASSERT_EQ(p[r * 1000 + 8], 0.0f);
  }
}

}  // namespace
}  // namespace braid
