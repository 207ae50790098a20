// Conformance with the ONNX project's own backend test suite (Debian's libonnx-testdata): every
// model under data/{node,pytorch-converted,pytorch-operator,simple} with its input_N.pb and
// output_N.pb files. Each case is one test: it passes when braid's outputs match the suite's
// expected outputs with the suite's default tolerances (rtol 1e-3, atol 1e-7), is skipped with the
// reason when the model uses an op, attribute or type braid does not support (the preflight's
// message) or is listed in onnx_conformance_exclusions.txt with a written reason, and fails
// otherwise. At the end the driver prints the counts; with BRAID_ONNX_COVERAGE=path it also writes
// the op coverage table (scripts/onnx_coverage.sh puts it in docs/onnx_coverage.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "braid/autograd.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using namespace braid;

namespace {

std::string testdata_root() {
  const char* env = std::getenv("BRAID_ONNX_TESTDATA");
  return env != nullptr ? env : "/usr/share/libonnx-testdata/data";
}

struct Case {
  std::string suite, name, dir;
  std::string id() const {
    std::string s = suite + "_" + name;
    for (char& ch : s)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
  }
};

// For gtest's messages: the case's path rather than its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.suite << "/" << c.name; }

std::vector<Case> discover() {
  std::vector<Case> out;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    fs::path root = fs::path(testdata_root()) / suite;
    std::error_code ec;
    if (!fs::is_directory(root, ec)) continue;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (fs::exists(e.path() / "model.onnx")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) out.push_back({suite, n, (root / n).string()});
  }
  return out;
}

std::map<std::string, std::string> exclusions() {
  std::map<std::string, std::string> out;
  // Each suite has its own list: Debian's (ONNX 1.12) by default, another for PyPI's newer one.
  const char* env = std::getenv("BRAID_ONNX_EXCLUSIONS");
  const std::string path = env != nullptr ? env : std::string(braid::test::source_dir()) + "/onnx_conformance_exclusions.txt";
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read the exclusions file " + path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string name, reason;
    s >> name;
    std::getline(s, reason);
    reason.erase(0, reason.find_first_not_of(" \t"));
    if (!name.empty()) out[name] = reason;
  }
  return out;
}

enum class Outcome { Pass, Fail, Unsupported, Excluded };

struct Tally {
  std::map<std::string, std::map<Outcome, int>> by_op;
  std::map<std::string, std::map<Outcome, int>> by_suite;
  std::map<std::string, int> unsupported_reasons;  // first problem's op, e.g. "op 'Scan'"
};

Tally& tally() {
  static Tally t;
  return t;
}

std::set<std::string> op_types(const onnx::Graph& g) {
  std::set<std::string> ops;
  for (const auto& n : g.nodes) {
    ops.insert(n.domain.empty() ? n.op_type : n.domain + "." + n.op_type);
    for (const auto& [name, a] : n.attributes) {
      if (a.g) {
        auto sub = op_types(*a.g);
        ops.insert(sub.begin(), sub.end());
      }
    }
  }
  return ops;
}

void record(const Case& c, const std::set<std::string>& ops, Outcome o) {
  tally().by_suite[c.suite][o]++;
  for (const auto& op : ops) tally().by_op[op][o]++;
}

/// The reason category for the summary: the op or type a problem names.
std::string reason_key(const std::string& problem) {
  auto q = problem.find("op '");
  if (q != std::string::npos) return problem.substr(q, problem.find('\'', q + 4) - q + 1);
  q = problem.find("attribute '");
  if (q != std::string::npos) {
    auto p = problem.find(' ');
    return problem.substr(0, p) + " " + problem.substr(q, problem.find('\'', q + 11) - q + 1);
  }
  return problem.substr(0, 80);
}

/// Compares as the ONNX backend test runner does: same shape, values within rtol/atol, NaN where
/// NaN is expected; integer and bool outputs exactly.
std::string compare(const Tensor& got_in, const Tensor& want_in, const std::string& name) {
  if (got_in.shape() != want_in.shape())
    return detail::cat("output '", name, "': shape ", shape_str(got_in.shape()), ", expected ", shape_str(want_in.shape()));
  const bool fl = is_floating(want_in.dtype());
  if (!fl && is_floating(got_in.dtype()))
    return detail::cat("output '", name, "': dtype ", dtype_name(got_in.dtype()), ", expected ", dtype_name(want_in.dtype()));
  std::vector<double> got = cast(got_in, kFloat64).to_vector<double>();
  std::vector<double> want = cast(want_in, kFloat64).to_vector<double>();
  const double rtol = 1e-3, atol = 1e-7;
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w)) ok = std::isnan(g);
    else if (std::isinf(w)) ok = g == w;
    else ok = fl ? std::abs(g - w) <= atol + rtol * std::abs(w) : g == w;
    if (!ok && bad++ == 0) first = detail::cat("at flat index ", i, ": got ", g, ", expected ", w);
  }
  if (bad > 0) return detail::cat("output '", name, "': ", bad, " of ", got.size(), " values differ; first ", first);
  return "";
}

class Conformance : public testing::TestWithParam<Case> {};

TEST_P(Conformance, MatchesExpectedOutputs) {
  const Case& c = GetParam();
  static const auto excluded = exclusions();
  std::set<std::string> ops;
  auto ex = excluded.find(c.suite + "/" + c.name);
  onnx::Model model;
  try {
    model = onnx::load_model(c.dir + "/model.onnx");
  } catch (const Error& e) {
    // The loader refuses types braid cannot hold (strings, uint64, sequences, optionals).
    record(c, {"(refused by the loader)"}, Outcome::Unsupported);
    tally().unsupported_reasons["loader: " + std::string(e.what()).substr(std::string(e.what()).rfind(": ") + 2, 60)]++;
    GTEST_SKIP() << "unsupported: " << e.what();
  }
  ops = op_types(model.graph);
  if (ex != excluded.end()) {
    record(c, ops, Outcome::Excluded);
    GTEST_SKIP() << "excluded: " << ex->second;
  }
  std::vector<std::string> problems = onnx::preflight(model);
  if (!problems.empty()) {
    record(c, ops, Outcome::Unsupported);
    tally().unsupported_reasons[reason_key(problems[0])]++;
    std::string all;
    for (const auto& p : problems) all += "\n  " + p;
    GTEST_SKIP() << "unsupported:" << all;
  }
  auto module = std::make_shared<onnx::OnnxModule>(std::move(model));
  module->eval();
  module->to(default_device());  // the device under test (tests/test_device.h)
  std::vector<std::string> sets;
  for (const auto& e : fs::directory_iterator(c.dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path().string());
  std::sort(sets.begin(), sets.end());
  ASSERT_FALSE(sets.empty()) << c.dir << " has no test_data_set_*";
  for (const std::string& set : sets) {
    std::vector<Tensor> inputs, expected;
    for (size_t i = 0; fs::exists(set + "/input_" + std::to_string(i) + ".pb"); ++i)
      inputs.push_back(onnx::load_tensor(set + "/input_" + std::to_string(i) + ".pb").to(default_device()));
    for (size_t i = 0; fs::exists(set + "/output_" + std::to_string(i) + ".pb"); ++i)
      expected.push_back(onnx::load_tensor(set + "/output_" + std::to_string(i) + ".pb"));
    std::vector<Tensor> got;
    try {
      NoGradGuard no_grad;
      got = module->run(inputs);
    } catch (const NotImplementedError& e) {
      record(c, ops, Outcome::Unsupported);
      tally().unsupported_reasons["run: " + std::string(e.what()).substr(std::string(e.what()).find(": ") + 2, 70)]++;
      GTEST_SKIP() << "unsupported: " << e.what();
    } catch (const Error& e) {
      record(c, ops, Outcome::Fail);
      FAIL() << set << ": " << e.what();
    }
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      std::string problem = compare(got[i], expected[i], module->output_names()[i]);
      if (!problem.empty()) {
        record(c, ops, Outcome::Fail);
        FAIL() << set << ": " << problem;
      }
    }
  }
  record(c, ops, Outcome::Pass);
}

std::vector<Case> all_cases() {
  std::vector<Case> cs = discover();
  return cs;
}

INSTANTIATE_TEST_SUITE_P(OnnxBackend, Conformance, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.id(); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

TEST(ConformanceData, Present) {
  if (discover().empty()) GTEST_SKIP() << "libonnx-testdata is not installed (" << testdata_root() << " is empty)";
  EXPECT_GT(discover().size(), 1000u);
}

class Summary : public testing::Environment {
 public:
  void TearDown() override {
    const Tally& t = tally();
    std::map<Outcome, int> total;
    for (const auto& [suite, m] : t.by_suite)
      for (const auto& [o, n] : m) total[o] += n;
    std::printf("ONNX conformance: %d passed, %d failed, %d unsupported, %d excluded\n", total[Outcome::Pass],
                total[Outcome::Fail], total[Outcome::Unsupported], total[Outcome::Excluded]);
    for (const auto& [suite, m] : t.by_suite) {
      auto get = [&](Outcome o) { auto it = m.find(o); return it == m.end() ? 0 : it->second; };
      std::printf("  %-18s %4d passed, %3d failed, %3d unsupported, %3d excluded\n", suite.c_str(), get(Outcome::Pass),
                  get(Outcome::Fail), get(Outcome::Unsupported), get(Outcome::Excluded));
    }
    const char* path = std::getenv("BRAID_ONNX_COVERAGE");
    if (path == nullptr) return;
    std::ofstream f(path);
    f << "# ONNX backend test suite: coverage by op\n\n"
      << "Generated by `scripts/onnx_coverage.sh` from `tests/test_onnx_conformance.cpp` running the ONNX\n"
      << "project's backend test suite (Debian's `libonnx-testdata`, ONNX 1.12) against braid. A case counts\n"
      << "for every op its model uses. *Unsupported*: the preflight (or the loader) names an op, attribute or\n"
      << "element type braid does not implement; *excluded*: listed with its reason in\n"
      << "`tests/onnx_conformance_exclusions.txt`.\n\n"
      << "| suite | passed | failed | unsupported | excluded |\n|---|---:|---:|---:|---:|\n";
    for (const auto& [suite, m] : t.by_suite) {
      auto get = [&](Outcome o) { auto it = m.find(o); return it == m.end() ? 0 : it->second; };
      f << "| " << suite << " | " << get(Outcome::Pass) << " | " << get(Outcome::Fail) << " | "
        << get(Outcome::Unsupported) << " | " << get(Outcome::Excluded) << " |\n";
    }
    f << "| **all** | **" << total[Outcome::Pass] << "** | **" << total[Outcome::Fail] << "** | **"
      << total[Outcome::Unsupported] << "** | **" << total[Outcome::Excluded] << "** |\n\n";
    f << "Ops braid implements: " << onnx::OpRegistry::global().op_types().size() << ".\n\n";
    f << "| op | implemented | cases | passed | failed | unsupported | excluded |\n|---|:-:|---:|---:|---:|---:|---:|\n";
    for (const auto& [op, m] : t.by_op) {
      auto get = [&](Outcome o) { auto it = m.find(o); return it == m.end() ? 0 : it->second; };
      const int n = get(Outcome::Pass) + get(Outcome::Fail) + get(Outcome::Unsupported) + get(Outcome::Excluded);
      const bool impl = onnx::OpRegistry::global().find("", op) != nullptr;
      f << "| " << op << " | " << (impl ? "yes" : "no") << " | " << n << " | " << get(Outcome::Pass) << " | "
        << get(Outcome::Fail) << " | " << get(Outcome::Unsupported) << " | " << get(Outcome::Excluded) << " |\n";
    }
    f << "\n## Why cases are unsupported\n\n| first problem | cases |\n|---|---:|\n";
    std::vector<std::pair<int, std::string>> reasons;
    for (const auto& [r, n] : t.unsupported_reasons) reasons.emplace_back(-n, r);
    std::sort(reasons.begin(), reasons.end());
    for (const auto& [n, r] : reasons) {
      std::string cell = r;
      std::replace(cell.begin(), cell.end(), '|', '/');
      f << "| " << cell << " | " << -n << " |\n";
    }
  }
};

const auto* const kSummary = testing::AddGlobalTestEnvironment(new Summary);

}  // namespace
