// The differential test: thousands of seeded random cases over every public op (0-d, empty and
// size-1 axes; every dtype; permuted, strided and expanded views; NaN, inf, signed zeros, huge and
// denormal values; broadcasting; bad axes and shapes), each compared with NumPy's result under
// PyTorch's rules, which tests/diff/gen_cases.py writes at build time. One gtest per op; the
// planted tests below check that the comparison catches a wrong value, dtype or error.
// BRAID_DIFF_CASES=FILE runs another case file (scripts/diff_long.sh writes larger ones).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>

#include "diff/diff_runner.h"
#include "test_paths.h"

namespace braid::diff {
namespace {

std::string cases_path() {
  const char* env = std::getenv("BRAID_DIFF_CASES");
  return env != nullptr && *env != '\0' ? env : braid::test::diff_cases_path();
}

const std::vector<DiffCase>& all_cases() {
  static const std::vector<DiffCase> cases = load_cases(cases_path());
  return cases;
}

std::vector<std::string> op_names() {
  std::set<std::string> names;
  for (const auto& [name, op] : builtin_ops()) names.insert(name);
  return {names.begin(), names.end()};
}

// The disagreements of every case of op under table.
std::vector<std::string> failures(const std::string& op, const OpTable& table) {
  std::vector<std::string> out;
  for (const DiffCase& c : all_cases()) {
    if (c.op != op) continue;
    std::string d = run_case(c, table);
    if (!d.empty()) out.push_back(d);
  }
  return out;
}

class Differential : public ::testing::TestWithParam<std::string> {};

TEST_P(Differential, AgreesWithReference) {
  const std::string op = GetParam();
  int64_t n = 0;
  for (const DiffCase& c : all_cases()) n += c.op == op;
  ASSERT_GT(n, 0) << "the case file " << cases_path() << " has no case for " << op;
  std::vector<std::string> bad = failures(op, builtin_ops());
  std::string shown;
  for (size_t i = 0; i < bad.size() && i < 12; ++i) shown += "\n  " + bad[i];
  EXPECT_TRUE(bad.empty()) << op << ": " << bad.size() << " of " << n << " cases disagree:" << shown;
}

INSTANTIATE_TEST_SUITE_P(Ops, Differential, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(DifferentialFile, CoversEveryOpWithValuesAndErrors) {
  const OpTable table = builtin_ops();
  std::set<std::string> in_file;
  int64_t errors = 0, values = 0;
  for (const DiffCase& c : all_cases()) {
    in_file.insert(c.op);
    (c.json.at("expect").contains("error") ? errors : values) += 1;
  }
  for (const std::string& op : in_file)
    EXPECT_TRUE(table.count(op)) << "the case file has op '" << op << "' that the runner lacks";
  EXPECT_GE(static_cast<int64_t>(all_cases().size()), 2000);
  EXPECT_GT(errors, 100) << "too few cases where the reference rejects the input";
  EXPECT_GT(values, 1000);
  std::printf("differential: %zu cases over %zu ops (%lld with values, %lld where the reference rejects the input)\n",
              all_cases().size(), in_file.size(), static_cast<long long>(values), static_cast<long long>(errors));
}

// ---- the test of the test: plant a wrong op and see the comparison catch it ----

OpTable planted(const std::string& op, DiffOp wrong) {
  OpTable t = builtin_ops();
  t[op] = std::move(wrong);
  return t;
}

TEST(DifferentialPlanted, CatchesAValueOffByOnePartInTenThousand) {
  // exp, with one element of every non-empty float result nudged by 1e-4 relative.
  OpTable t = planted("exp", {"exp", [](const std::vector<Tensor>& in, const Json&) {
                                Tensor y = exp(in.at(0)).contiguous().cpu().clone();
                                if (y.numel() > 0 && y.dtype() == kFloat64) y.data<double>()[0] *= 1 + 1e-4;
                                if (y.numel() > 0 && y.dtype() == kFloat32) y.data<float>()[0] *= 1 + 1e-4f;
                                return std::vector<Tensor>{y};
                              }});
  EXPECT_GT(failures("exp", t).size(), 0u);
}

TEST(DifferentialPlanted, CatchesNegativeZeroForNaN) {
  // var as it was before the fix: a zero sum divided by n - correction < 0 gives -0.0, not NaN.
  OpTable t = planted("var", {"var", [](const std::vector<Tensor>& in, const Json& a) {
                                Tensor x = in.at(0).dtype() == kFloat64 ? in.at(0) : cast(in.at(0), kFloat32);
                                std::vector<int64_t> axes = a.at("axes").get<std::vector<int64_t>>();
                                const bool keep = a.at("keepdim").get<bool>();
                                int64_t n = 1;
                                for (int64_t d = 0; d < x.dim(); ++d) {
                                  bool reduced = axes.empty();
                                  for (int64_t ax : axes) reduced |= (ax < 0 ? ax + x.dim() : ax) == d;
                                  if (reduced) n *= x.shape()[d];
                                }
                                Tensor c = x - mean(x, axes, true);
                                const double div = static_cast<double>(n - a.at("correction").get<int64_t>());
                                return std::vector<Tensor>{sum(c * c, axes, keep) / div};
                              }});
  std::vector<std::string> bad = failures("var", t);
  bool negative_zero_caught = false;
  for (const std::string& b : bad)
    negative_zero_caught |= b.find("got -0 want") != std::string::npos && b.find("nan") != std::string::npos;
  std::string all;
  for (const std::string& b : bad) all += "\n  " + b;
  EXPECT_TRUE(negative_zero_caught) << "no var case with n <= correction caught the -0.0:" << all;
}

TEST(DifferentialPlanted, CatchesAWrongDtype) {
  // mul that sums every integer or bool product in int64, as the old promotion did for two bools.
  OpTable t = planted("mul", {"mul", [](const std::vector<Tensor>& in, const Json&) {
                                Tensor a = in.at(0), b = in.at(1);
                                if (!is_floating(a.dtype()) && !is_floating(b.dtype())) a = cast(a, kInt64);
                                return std::vector<Tensor>{mul(a, b)};
                              }});
  bool caught = false;
  for (const std::string& b : failures("mul", t)) caught |= b.find("dtype int64, want") != std::string::npos;
  EXPECT_TRUE(caught) << "no mul case of int32 or bool operands caught the int64 result";
}

TEST(DifferentialPlanted, CatchesAMissingError) {
  // narrow that gives back its input when braid would refuse the arguments.
  OpTable t =
      planted("narrow", {"narrow", [](const std::vector<Tensor>& in, const Json& a) {
                           try {
                             return std::vector<Tensor>{narrow(in.at(0), a.at("axis"), a.at("start"), a.at("length"))};
                           } catch (const Error&) {
                             return std::vector<Tensor>{in.at(0)};
                           }
                         }});
  std::vector<std::string> bad = failures("narrow", t);
  bool caught = false;
  for (const std::string& b : bad) caught |= b.find("accepted an input the reference rejects") != std::string::npos;
  EXPECT_TRUE(caught);
}

TEST(DifferentialPlanted, CatchesASpuriousError) {
  OpTable t = planted("sqrt", {"sqrt", [](const std::vector<Tensor>&, const Json&) -> std::vector<Tensor> {
                                 throw ValueError("sqrt: planted");
                               }});
  std::vector<std::string> bad = failures("sqrt", t);
  ASSERT_GT(bad.size(), 0u);
  EXPECT_NE(bad[0].find("braid threw where the reference accepts"), std::string::npos) << bad[0];
}

}  // namespace
}  // namespace braid::diff
