// The two checks every layer test makes, on a Module converted to float64:
//  - expect_matches_reference: outputs, input and parameter gradients and buffers after the forward
//    pass equal PyTorch's (tests/data/make_layer_reference.py) for the same weights and inputs;
//  - module_gradcheck_error: analytic gradients w.r.t. inputs and parameters against float64
//    central differences, perturbing parameters in place.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <typeinfo>
#include <vector>

#include "braid/nn/nn.h"
#include "gradcheck.h"
#include "reference_file.h"
#include "test_paths.h"

namespace braid::testing {

/// Runs the module on the inputs, returning its outputs (default: {m.forward(inputs[0])}).
using RunFn = std::function<std::vector<Tensor>(nn::Module&, const std::vector<Tensor>&)>;

inline std::vector<Tensor> run_module(nn::Module& m, const std::vector<Tensor>& inputs, const RunFn& run) {
  return run ? run(m, inputs) : std::vector<Tensor>{m.forward(inputs.at(0))};
}

/// |got - want| <= 1e-10 |want| + 1e-12 max(1, max |want|) elementwise, in float64; exact for integers.
inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.shape(), want.shape()) << what << ": shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  if (!is_floating(want.dtype())) {
    EXPECT_EQ(got.to(kInt64).to_vector<int64_t>(), want.to(kInt64).to_vector<int64_t>()) << what;
    return;
  }
  std::vector<double> g = got.to(kFloat64).to_vector<double>(), w = want.to(kFloat64).to_vector<double>();
  double scale = 1.0;
  for (double v : w) scale = std::max(scale, std::fabs(v));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= 1e-10 * std::fabs(w[i]) + 1e-12 * scale) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << w.size() << " elements differ; first at " << first << ": got "
                     << g[first] << ", want " << w[first];
}

/// A reference tensor, with bool masks (stored as 0/1) turned back into bool.
inline Tensor reference_tensor(const RefTensor& r) {
  return r.dtype == "bool" ? ne(braid::tensor(r.values, r.shape), zeros({}, kFloat64)) : r.make();
}

inline const RefCase& layer_case(const std::string& file, const std::string& name) {
  static std::map<std::string, std::vector<RefCase>> files;
  auto it = files.find(file);
  if (it == files.end()) it = files.emplace(file, load_reference(std::string(braid::test::data_dir()) + "/" + file)).first;
  for (const RefCase& c : it->second)
    if (c.name == name) return c;
  throw std::runtime_error(file + " has no case '" + name + "'; run tests/data/make_layer_reference.py");
}

/// The case's forward arguments, float ones as float64 leaves that require grad.
inline std::vector<Tensor> reference_inputs(const RefCase& c) {
  std::vector<Tensor> inputs;
  for (const std::string& n : c.words("inputs")) {
    Tensor t = reference_tensor(c.ref("input." + n));
    if (is_floating(t.dtype())) t.set_requires_grad(true);
    inputs.push_back(t);
  }
  return inputs;
}

/// Loads the case's state dict (strictly: parameter and buffer names must equal PyTorch's) into m
/// in float64, runs it in the case's mode and compares outputs, gradients and buffers.
inline void expect_matches_reference(nn::Module& m, const std::string& file, const std::string& name,
                                     const RunFn& run = nullptr) {
  SCOPED_TRACE(file + ": " + name);
  const RefCase& c = layer_case(file, name);
  m.to(kFloat64);
  m.train(c.str("mode") == "train");
  nn::StateDict state;
  for (const auto& [key, ref] : c.tensors)
    if (key.rfind("state.", 0) == 0) state[key.substr(6)] = reference_tensor(ref);
  m.load_state_dict(state, true);
  m.zero_grad();
  std::vector<Tensor> inputs = reference_inputs(c);
  std::vector<Tensor> outs = run_module(m, inputs, run);
  size_t n_out = 0;
  while (c.has_tensor(detail::cat("output.y", n_out))) ++n_out;
  ASSERT_EQ(outs.size(), n_out) << "number of outputs";
  Tensor loss = zeros({}, kFloat64);
  for (size_t i = 0; i < n_out; ++i) {
    const std::string y = detail::cat("y", i);
    expect_close(outs[i], c.tensor("output." + y), "output " + y);
    loss = loss + sum(outs[i] * c.tensor("upstream." + y));
  }
  loss.backward();
  const std::vector<std::string>& names = c.words("inputs");
  for (size_t i = 0; i < names.size(); ++i)
    if (c.has_tensor("grad." + names[i])) expect_close(inputs[i].grad(), c.tensor("grad." + names[i]), "grad of input " + names[i]);
  for (const auto& [n, p] : m.named_parameters()) {
    if (c.has_tensor("grad." + n)) expect_close(p.grad(), c.tensor("grad." + n), "grad of parameter " + n);
    else EXPECT_FALSE(p.grad().defined()) << "parameter " << n << " has a gradient but PyTorch's has none";
  }
  for (const auto& [n, b] : m.named_buffers()) expect_close(b, c.tensor("after." + n), "buffer " + n + " after forward");
}

/// Largest |analytic - numeric| / max(1, |analytic|, |numeric|) over the elements of every
/// floating-point input and parameter, for L = sum_i sum(out_i * w_i) with fixed random w_i. Tensors
/// of more than max_checked elements are checked at max_checked evenly strided elements, which
/// bounds the cost (two forward passes per element) while touching every row of every tensor. The
/// module is converted to float64; run must be deterministic (reseed any dropout generator in it).
inline double module_gradcheck_error(nn::Module& m, std::vector<Tensor> inputs, const RunFn& run = nullptr,
                                     std::string* where = nullptr, double eps = 1e-6, int64_t max_checked = 40) {
  m.to(kFloat64);
  m.zero_grad();
  std::vector<Tensor> wrt;  // perturbed in place: float inputs, then parameters
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) continue;
    inputs[i] = inputs[i].to(kFloat64).contiguous().clone().detach().set_requires_grad(true);
    wrt.push_back(inputs[i]);
    names.push_back(detail::cat("input ", i));
  }
  for (const auto& [n, p] : m.named_parameters()) {
    EXPECT_TRUE(p.is_contiguous()) << n;
    wrt.push_back(p);
    names.push_back("parameter " + n);
  }
  std::vector<Tensor> outs = run_module(m, inputs, run);
  Generator gen(1234);
  std::vector<Tensor> weights;
  for (const Tensor& o : outs) weights.push_back(randn(o.shape(), kFloat64, &gen));
  auto loss_of = [&](const std::vector<Tensor>& ys) {
    Tensor l = zeros({}, kFloat64);
    for (size_t i = 0; i < ys.size(); ++i) l = l + sum(ys[i] * weights[i]);
    return l;
  };
  loss_of(outs).backward();
  auto loss = [&]() {
    NoGradGuard no_grad;
    return loss_of(run_module(m, inputs, run)).item();
  };
  double worst = 0;
  for (size_t k = 0; k < wrt.size(); ++k) {
    Tensor grad = wrt[k].grad();
    std::vector<double> analytic = grad.defined() ? grad.to_vector<double>() : std::vector<double>(wrt[k].numel(), 0.0);
    const std::vector<double> values = wrt[k].to_vector<double>();
    const int64_t n = wrt[k].numel(), step = (n + max_checked - 1) / max_checked;
    for (int64_t j = 0; j < n; j += step) {
      const double saved = values[static_cast<size_t>(j)];
      set_element(wrt[k], j, saved + eps);
      const double up = loss();
      set_element(wrt[k], j, saved - eps);
      const double down = loss();
      set_element(wrt[k], j, saved);
      const double numeric = (up - down) / (2 * eps);
      const double err = std::fabs(analytic[j] - numeric) / std::max({1.0, std::fabs(analytic[j]), std::fabs(numeric)});
      if (err > worst) {
        worst = err;
        if (where)
          *where = detail::cat(names[k], " element ", j, ": analytic ", analytic[j], " numeric ", numeric);
      }
    }
  }
  return worst;
}

/// Runs f, expecting an exception of type E whose message contains every substring.
template <typename E>
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> substrings, const char* expr) {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& s : substrings)
      EXPECT_NE(msg.find(s), std::string::npos) << expr << ": message \"" << msg << "\" lacks \"" << s << "\"";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << expr << ": expected " << typeid(E).name() << ", got " << typeid(e).name() << ": " << e.what();
    return;
  }
  ADD_FAILURE() << expr << ": expected " << typeid(E).name() << ", nothing was thrown";
}

#define EXPECT_LAYER_ERROR(Type, stmt, ...) \
  ::braid::testing::expect_error<Type>([&] { (void)(stmt); }, {__VA_ARGS__}, #stmt)

/// One row of a layer test table: a reference case and how to build and run the layer for it.
struct LayerCase {
  std::string file, name;
  std::function<nn::ModulePtr()> make;
  RunFn run = nullptr;
  bool gradcheck = true;  // false where PyTorch defines a gradient that is not the derivative
};

/// The rows whose gradient is the derivative (for the finite-difference suite).
inline std::vector<LayerCase> differentiable_rows(const std::vector<LayerCase>& rows) {
  std::vector<LayerCase> out;
  for (const LayerCase& r : rows)
    if (r.gradcheck) out.push_back(r);
  return out;
}

/// gtest prints a row by its case name.
inline void PrintTo(const LayerCase& row, std::ostream* os) { *os << row.file << ": " << row.name; }

inline std::string layer_case_name(const ::testing::TestParamInfo<LayerCase>& info) { return gtest_name(info.param.name); }

/// Gradient-checks m on inputs and expects an error of at most 1e-6.
inline void expect_gradcheck(nn::Module& m, const std::vector<Tensor>& inputs, const RunFn& run = nullptr) {
  std::string where;
  double err = module_gradcheck_error(m, inputs, run, &where);
  EXPECT_LE(err, 1e-6) << m.describe() << ": worst at " << where;
}

/// The row's layer compared with PyTorch.
inline void check_reference_row(const LayerCase& row) {
  nn::ModulePtr m = row.make();
  expect_matches_reference(*m, row.file, row.name, row.run);
}

/// The row's layer gradient-checked on the reference inputs, with the reference weights loaded.
inline void check_gradient_row(const LayerCase& row) {
  const RefCase& c = layer_case(row.file, row.name);
  nn::ModulePtr m = row.make();
  m->to(kFloat64);
  m->train(c.str("mode") == "train");
  nn::StateDict state;
  for (const auto& [key, ref] : c.tensors)
    if (key.rfind("state.", 0) == 0) state[key.substr(6)] = reference_tensor(ref);
  m->load_state_dict(state, true);
  expect_gradcheck(*m, reference_inputs(c), row.run);
}

}  // namespace braid::testing
