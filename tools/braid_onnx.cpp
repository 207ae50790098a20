// braid-onnx: the command line for people who bring ONNX files.
//
//   braid-onnx inspect MODEL.onnx
//       inputs and outputs (names, element types, shapes with their symbolic dimensions), opsets,
//       producer, weights, op counts, and the preflight's list of what braid cannot run
//   braid-onnx run MODEL.onnx [--input NAME=FILE.npy]... [--dim SYMBOL=N]... [--shape NAME=AxBxC]...
//                             [--seed S] [--out DIR] [--compare DIR | --expect NAME=FILE.npy ...]
//                             [--rtol R] [--atol A]
//       runs the model once on inputs read from .npy files (random ones for inputs not given: normal
//       floats, integers 0 or 1; shapes from --shape, else the model's with symbols from --dim and
//       1 for open dimensions), prints each output, writes
//       them as DIR/NAME.npy, and compares them with reference .npy files (exit code 1 on a mismatch)
//   braid-onnx bench MODEL.onnx [--batch-sizes 1,8] [--iters N] [--warmup N] [--dim SYMBOL=N]...
//       latency per batch size (random inputs, the batch being each input's first dimension) and the
//       per-op-type profile of the largest batch size
// --threads N sets braid's thread count (default: BRAID_NUM_THREADS, else the cores).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "braid/autograd.h"
#include "braid/data/readers.h"
#include "braid/error.h"
#include "braid/onnx/model.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "braid/parallel.h"
#include "braid/random.h"

using namespace braid;

namespace {

struct Args {
  std::string command, model;
  std::map<std::string, std::string> inputs, expect;  // name -> .npy
  std::map<std::string, int64_t> dims;                // symbol -> size
  std::map<std::string, Shape> shapes;                // input name -> its whole shape
  std::string out, compare;
  std::vector<int64_t> batch_sizes{1, 8};
  int64_t iters = 20, warmup = 2, threads = 0;
  uint64_t seed = 0;
  double rtol = 1e-4, atol = 1e-5;
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: braid-onnx inspect MODEL.onnx\n"
               "       braid-onnx ops [DOMAIN] (the ops braid runs, with their opsets; DOMAIN: ai.onnx by default,\n"
               "                  or com.microsoft, ...; `braid-onnx ops all` lists every domain)\n"
               "       braid-onnx run MODEL.onnx [--input NAME=FILE.npy]... [--dim SYMBOL=N]... [--seed S]\n"
               "                  [--shape NAME=1x3x224x224]... [--out DIR] [--compare DIR | --expect NAME=FILE.npy ...]\n"
               "                  [--rtol R] [--atol A]\n"
               "       braid-onnx bench MODEL.onnx [--batch-sizes 1,8] [--iters N] [--warmup N] [--dim SYMBOL=N]...\n"
               "                  [--shape NAME=1x3x224x224]...\n"
               "common: --threads N (braid's threads; default BRAID_NUM_THREADS, else the cores)\n");
}

std::pair<std::string, std::string> split_pair(const std::string& s, const std::string& opt) {
  const size_t eq = s.find('=');
  BRAID_CHECK(eq != std::string::npos && eq > 0, "braid-onnx: ", opt, " takes NAME=VALUE, got '", s, "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

int64_t to_int(const std::string& s, const std::string& opt) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  BRAID_CHECK(used == s.size() && !s.empty(), "braid-onnx: ", opt, " takes an integer, got '", s, "'");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (k.rfind("--", 0) != 0) {
      pos.push_back(k);
      continue;
    }
    BRAID_CHECK(i + 1 < argc, "braid-onnx: option ", k, " needs a value (see --help)");
    const std::string v = argv[++i];
    if (k == "--input") a.inputs.insert(split_pair(v, k));
    else if (k == "--expect") a.expect.insert(split_pair(v, k));
    else if (k == "--shape") {
      auto [name, text] = split_pair(v, k);
      Shape shape;
      std::stringstream ss(text);
      std::string part;
      while (std::getline(ss, part, 'x')) shape.push_back(to_int(part, k));
      a.shapes[name] = shape;
    } else if (k == "--dim") {
      auto [sym, n] = split_pair(v, k);
      a.dims[sym] = to_int(n, k);
    } else if (k == "--out") a.out = v;
    else if (k == "--compare") a.compare = v;
    else if (k == "--seed") a.seed = static_cast<uint64_t>(to_int(v, k));
    else if (k == "--iters") a.iters = to_int(v, k);
    else if (k == "--warmup") a.warmup = to_int(v, k);
    else if (k == "--threads") a.threads = to_int(v, k);
    else if (k == "--rtol") a.rtol = std::stod(v);
    else if (k == "--atol") a.atol = std::stod(v);
    else if (k == "--batch-sizes") {
      a.batch_sizes.clear();
      std::stringstream ss(v);
      std::string part;
      while (std::getline(ss, part, ',')) a.batch_sizes.push_back(to_int(part, k));
      BRAID_CHECK(!a.batch_sizes.empty(), "braid-onnx: --batch-sizes is empty");
    } else {
      throw ValueError("braid-onnx: unknown option '" + k + "' (see --help)");
    }
  }
  if (!pos.empty() && pos[0] == "ops") {  // braid-onnx ops [DOMAIN]: the model slot holds the domain
    BRAID_CHECK(pos.size() <= 2, "braid-onnx: ops takes at most one domain (see --help)");
    a.command = "ops", a.model = pos.size() == 2 ? pos[1] : "ai.onnx";
    return a;
  }
  BRAID_CHECK(pos.size() == 2, "braid-onnx: expected a command and a model file (see --help)");
  a.command = pos[0], a.model = pos[1];
  BRAID_CHECK(a.command == "inspect" || a.command == "run" || a.command == "bench", "braid-onnx: unknown command '",
              a.command, "' (inspect, ops, run or bench)");
  BRAID_CHECK(a.iters > 0 && a.warmup >= 1, "braid-onnx: --iters and --warmup must be positive");
  BRAID_CHECK(a.compare.empty() || a.expect.empty(), "braid-onnx: give --compare DIR or --expect, not both");
  return a;
}

std::string shape_text(const onnx::ValueInfo& v) {
  if (!v.has_shape) return "(shape not given)";
  std::string s = "[";
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (i) s += ", ";
    const auto& d = v.shape[i];
    s += d.size >= 0 ? std::to_string(d.size) : (d.symbol.empty() ? "?" : d.symbol);
  }
  return s + "]";
}

std::string file_name(std::string name) {
  for (char& c : name)
    if (c == '/' || c == '\\' || c == ':' || c == ' ') c = '_';
  return name;
}

const onnx::ValueInfo& info_of(const onnx::Model& m, const std::string& name) {
  for (const auto& v : m.graph.inputs)
    if (v.name == name) return v;
  throw IndexError("braid-onnx: the model has no input '" + name + "'");
}

int inspect(const Args& a) {
  onnx::Model m = onnx::load_model(a.model);
  std::printf("%s\n  ir_version %lld, producer %s %s\n  opsets:", a.model.c_str(), static_cast<long long>(m.ir_version),
              m.producer_name.empty() ? "(none)" : m.producer_name.c_str(), m.producer_version.c_str());
  for (const auto& [domain, version] : m.opsets)
    std::printf(" %s %lld", domain.empty() ? "ai.onnx" : domain.c_str(), static_cast<long long>(version));
  std::printf("\ninputs:\n");
  for (const auto& v : m.graph.inputs) {
    if (m.graph.initializers.count(v.name)) continue;  // a weight listed as an input (older exporters)
    std::printf("  %-24s %-9s %s\n", v.name.c_str(), dtype_name(v.dtype).c_str(), shape_text(v).c_str());
  }
  std::printf("outputs:\n");
  for (const auto& v : m.graph.outputs)
    std::printf("  %-24s %-9s %s\n", v.name.c_str(), dtype_name(v.dtype).c_str(), shape_text(v).c_str());
  int64_t elements = 0, bytes = 0;
  for (const auto& [name, t] : m.graph.initializers) {
    elements += t.numel();
    bytes += t.numel() * t.element_size();
  }
  std::printf("weights: %zu tensors, %lld elements, %.2f MiB\n", m.graph.initializers.size(),
              static_cast<long long>(elements), static_cast<double>(bytes) / (1 << 20));
  // The standard ops, then those of other domains (onnxruntime's com.microsoft contrib ops, custom
  // ones) apart, each marked where braid does not run it.
  std::map<std::string, int64_t> counts, contrib;
  int64_t contrib_nodes = 0;
  for (const auto& n : m.graph.nodes) {
    if (n.domain.empty() || n.domain == "ai.onnx") {
      ++counts[n.op_type];
    } else {
      ++contrib[n.domain + ":" + n.op_type];
      ++contrib_nodes;
    }
  }
  auto by_count = [](const std::map<std::string, int64_t>& c) {
    std::vector<std::pair<std::string, int64_t>> sorted(c.begin(), c.end());
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    return sorted;
  };
  const auto& registry = onnx::OpRegistry::global();
  auto mark = [&](const std::string& domain, const std::string& op) {
    return registry.find(domain, op) == nullptr ? "  not run by braid" : "";
  };
  std::printf("ops: %lld nodes of %zu types (top-level graph)\n",
              static_cast<long long>(m.graph.nodes.size()) - contrib_nodes, counts.size());
  for (const auto& [op, n] : by_count(counts))
    std::printf("  %-24s %lld%s\n", op.c_str(), static_cast<long long>(n), mark("", op));
  if (!contrib.empty()) {
    std::printf("contrib ops (domains other than ai.onnx): %lld node%s of %zu type%s\n",
                static_cast<long long>(contrib_nodes), contrib_nodes == 1 ? "" : "s", contrib.size(),
                contrib.size() == 1 ? "" : "s");
    for (const auto& [op, n] : by_count(contrib)) {
      const size_t colon = op.find(':');
      std::printf("  %-24s %lld%s\n", op.c_str(), static_cast<long long>(n),
                  mark(op.substr(0, colon), op.substr(colon + 1)));
    }
  }
  const std::vector<std::string> problems = onnx::preflight(m);
  if (problems.empty()) {
    std::printf("preflight: braid can run every node\n");
    // Note [Graph passes] (onnx/passes/passes.cpp): what inference runs fused, and where.
    const onnx::OnnxModule mod(std::move(m), {.frozen = true});
    const std::vector<onnx::FiredPass> fired = mod.fired_passes();
    std::map<std::string, int64_t> per_pass;
    for (const auto& f : fired) ++per_pass[f.pass];
    std::printf("inference passes: %zu fused node%s", fired.size(), fired.size() == 1 ? "" : "s");
    const char* sep = ": ";
    for (const onnx::OnnxPass& p : onnx::onnx_passes())
      if (per_pass.count(p.name) != 0) {
        std::printf("%s%s %lld", sep, p.name.c_str(), static_cast<long long>(per_pass[p.name]));
        sep = ", ";
      }
    std::printf(" (BRAID_ONNX_PASSES_OFF=NAME,... leaves a pass's nodes as written)\n");
    for (const auto& f : fired) {
      std::string nodes;
      for (const auto& r : f.replaced) nodes += (nodes.empty() ? "" : " + ") + r;
      std::printf("  %-11s %s\n", f.pass.c_str(), nodes.c_str());
    }
    return 0;
  }
  std::printf("preflight: %zu problem%s; braid cannot run this model as it is:\n", problems.size(),
              problems.size() == 1 ? "" : "s");
  for (const auto& p : problems) std::printf("  %s\n", p.c_str());
  return 2;
}

/// braid-onnx ops [DOMAIN]: the op types braid runs in DOMAIN with their opset ranges, or (DOMAIN
/// "all") every domain with its count.
int list_ops(const Args& a) {
  const auto& registry = onnx::OpRegistry::global();
  const std::string domain = a.model == "ai.onnx" ? "" : a.model;
  if (domain == "all") {
    for (const std::string& d : registry.domains())
      std::printf("%-24s %zu ops\n", d.empty() ? "ai.onnx" : d.c_str(), registry.op_types(d).size());
    return 0;
  }
  const std::vector<std::string> ops = registry.op_types(domain);
  if (ops.empty()) {
    std::printf("braid runs no op of domain '%s' (`braid-onnx ops all` lists the domains it runs)\n", a.model.c_str());
    return 2;
  }
  std::printf("%zu ops of domain %s that braid runs (opsets):\n", ops.size(), a.model.c_str());
  for (const std::string& op : ops) {
    const onnx::OpSchema* s = registry.find(domain, op);
    std::printf("  %-28s %lld", op.c_str(), static_cast<long long>(s->since_opset));
    if (s->until_opset < onnx::kMaxOpset) std::printf(" to %lld\n", static_cast<long long>(s->until_opset));
    else std::printf(" on\n");
  }
  return 0;
}

/// A random input for v: its shape from --shape (the batch, when given, replacing the first
/// dimension), else the model's dimensions, symbols from --dim (the batch for the first open
/// dimension), and 1 for the rest.
Tensor random_input(const onnx::ValueInfo& v, const Args& a, int64_t batch, Generator& gen) {
  const auto& dims = a.dims;
  Shape shape;
  if (a.shapes.count(v.name)) {
    shape = a.shapes.at(v.name);
    if (batch > 0 && !shape.empty()) shape[0] = batch;
  } else if (v.has_shape) {
    for (size_t i = 0; i < v.shape.size(); ++i) {
      const auto& d = v.shape[i];
      if (d.size >= 0) shape.push_back(d.size);
      else if (!d.symbol.empty() && dims.count(d.symbol)) shape.push_back(dims.at(d.symbol));
      else shape.push_back(i == 0 && batch > 0 ? batch : 1);
    }
  }
  if (is_floating(v.dtype)) return randn(shape, kFloat32, &gen).to(v.dtype);
  if (v.dtype == kBool) return gt(rand(shape, kFloat32, &gen), scalar_tensor(0.5));
  return randint(0, 2, shape, v.dtype, &gen);
}

std::map<std::string, Tensor> make_inputs(const onnx::OnnxModule& m, const Args& a, int64_t batch, Generator& gen) {
  for (const auto& [name, path] : a.inputs) (void)info_of(m.model(), name);  // names a typo
  for (const auto& [name, shape] : a.shapes) (void)info_of(m.model(), name);
  std::map<std::string, Tensor> in;
  for (const std::string& name : m.input_names()) {
    auto it = a.inputs.find(name);
    in[name] = it != a.inputs.end() ? data::read_npy(it->second) : random_input(info_of(m.model(), name), a, batch, gen);
  }
  return in;
}

std::string summary(const Tensor& t) {
  std::string s = dtype_name(t.dtype()) + " " + shape_str(t.shape());
  if (t.numel() > 0 && is_floating(t.dtype())) {
    Tensor f = t.to(kFloat64);
    char buf[160];
    std::snprintf(buf, sizeof buf, "  min %.6g  max %.6g  mean %.6g", amin(f).item(), amax(f).item(), mean(f).item());
    s += buf;
  }
  return s;
}

/// np.allclose's test (|x - r| <= atol + rtol |r|); prints the worst element. True when it holds.
bool compare(const std::string& name, const Tensor& got, const std::string& ref_path, double rtol, double atol) {
  Tensor ref = data::read_npy(ref_path);
  if (got.shape() != ref.shape()) {
    std::printf("  %-24s MISMATCH: shape %s, reference %s (%s)\n", name.c_str(), shape_str(got.shape()).c_str(),
                shape_str(ref.shape()).c_str(), ref_path.c_str());
    return false;
  }
  Tensor g = got.to(kFloat64), r = ref.to(kFloat64);
  Tensor err = abs(g - r);
  const double max_abs = got.numel() ? amax(err).item() : 0.0;
  const double excess = got.numel() ? amax(err - abs(r) * rtol).item() : 0.0;
  const bool ok = excess <= atol && !std::isnan(max_abs);
  std::printf("  %-24s %s: max |diff| %.3g (rtol %g, atol %g) against %s\n", name.c_str(), ok ? "ok" : "MISMATCH", max_abs,
              rtol, atol, ref_path.c_str());
  return ok;
}

/// Runs the model; an error on random inputs says how they were made.
std::map<std::string, Tensor> run_model(onnx::OnnxModule& m, const std::map<std::string, Tensor>& in, const Args& a) {
  try {
    return m.run_named(in);
  } catch (const Error& e) {
    if (a.inputs.size() == in.size()) throw;
    throw Error(std::string(e.what()) + "\n(random inputs take 1 for every dimension the model leaves open; give " +
                "shapes with --shape NAME=1x3x224x224 or --dim SYMBOL=N, or real inputs with --input NAME=FILE.npy)");
  }
}

int run(const Args& a) {
  auto m = onnx::OnnxModule::load(a.model);
  Generator gen(a.seed);
  std::map<std::string, Tensor> in = make_inputs(*m, a, 0, gen);
  std::printf("inputs:\n");
  for (const auto& [name, t] : in)
    std::printf("  %-24s %s%s\n", name.c_str(), summary(t).c_str(), a.inputs.count(name) ? "" : "  (random)");
  std::fflush(stdout);
  NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, Tensor> out = run_model(*m, in, a);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("outputs (%.2f ms):\n", ms);
  for (const std::string& name : m->output_names()) std::printf("  %-24s %s\n", name.c_str(), summary(out.at(name)).c_str());
  if (!a.out.empty()) {
    std::filesystem::create_directories(a.out);
    for (const auto& [name, t] : out) data::write_npy(a.out + "/" + file_name(name) + ".npy", t);
    std::printf("wrote %zu output%s to %s/\n", out.size(), out.size() == 1 ? "" : "s", a.out.c_str());
  }
  std::map<std::string, std::string> refs = a.expect;
  if (!a.compare.empty())
    for (const std::string& name : m->output_names()) refs[name] = a.compare + "/" + file_name(name) + ".npy";
  if (refs.empty()) return 0;
  std::printf("comparison:\n");
  bool all = true;
  for (const auto& [name, path] : refs) {
    BRAID_CHECK(out.count(name), "braid-onnx: --expect names '", name, "', which is not an output of ", a.model);
    all = compare(name, out.at(name), path, a.rtol, a.atol) && all;
  }
  std::printf("%s\n", all ? "all outputs match" : "outputs differ from the reference");
  return all ? 0 : 1;
}

int bench(const Args& a) {
  auto m = onnx::OnnxModule::load(a.model);
  Generator gen(a.seed);
  NoGradGuard no_grad;
  std::printf("%s, %d threads; %lld runs per batch size after %lld warm-up runs\n", a.model.c_str(), get_num_threads(),
              static_cast<long long>(a.iters), static_cast<long long>(a.warmup));
  std::printf("%8s %12s %12s %12s %14s\n", "batch", "median ms", "min ms", "p90 ms", "items/s");
  for (size_t k = 0; k < a.batch_sizes.size(); ++k) {
    const int64_t b = a.batch_sizes[k];
    std::map<std::string, Tensor> in = make_inputs(*m, a, b, gen);
    const bool last = k + 1 == a.batch_sizes.size();
    run_model(*m, in, a);  // a first run, which also checks the inputs
    for (int64_t i = 1; i < a.warmup; ++i) m->run_named(in);
    m->set_profiling(last);
    std::vector<double> times;
    for (int64_t i = 0; i < a.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      m->run_named(in);
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    m->set_profiling(false);
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2], p90 = times[std::min(times.size() - 1, times.size() * 9 / 10)];
    const int64_t items = in.empty() || in.begin()->second.dim() == 0 ? 1 : in.begin()->second.size(0);
    std::printf("%8lld %12.3f %12.3f %12.3f %14.1f\n", static_cast<long long>(items), med, times.front(), p90,
                1000.0 * static_cast<double>(items) / med);
    std::fflush(stdout);
  }
  double total = 0;
  for (const auto& [op, t] : m->profile()) total += t.ms;
  std::vector<std::pair<std::string, onnx::OnnxModule::OpTime>> ops(m->profile().begin(), m->profile().end());
  std::sort(ops.begin(), ops.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
  std::printf("profile at batch %lld (per run):\n%-24s %10s %10s %8s\n", static_cast<long long>(a.batch_sizes.back()),
              "op type", "calls", "ms", "share");
  for (const auto& [op, t] : ops)
    std::printf("%-24s %10.1f %10.3f %7.1f%%\n", op.c_str(), static_cast<double>(t.calls) / static_cast<double>(a.iters),
                t.ms / static_cast<double>(a.iters), total > 0 ? 100.0 * t.ms / total : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    if (a.threads > 0) set_num_threads(static_cast<int>(a.threads));
    if (a.command == "inspect") return inspect(a);
    if (a.command == "ops") return list_ops(a);
    if (a.command == "run") return run(a);
    return bench(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-onnx: error: %s\n", e.what());
    return 3;
  }
}
