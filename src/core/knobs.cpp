// Knobs: the table of every environment variable braid reads, and reading them.
#include "braid/knobs.h"

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>

#include "braid/config.h"
#include "braid/error.h"
#include "braid/parallel.h"
#include "core/knob_read.h"

namespace braid {

// Note [Knobs]
// Every environment variable that braid's library and programs read is a row of the table below:
// name, kind of value, default, one line of meaning. Nothing else calls getenv for a BRAID_
// variable (tests/tools/test_knobs.py checks the sources), each is read once, the first time any
// knob is asked for, and a value that does not parse is a ValueError naming the variable, never a
// silent fallback. print_config() (`braid-train --print-config`, Python's braid.print_config())
// shows what is in effect, and the README's table is knob_table_markdown() (the same test compares
// them). Variables of the launcher (PMI_*, SLURM_*, OMPI_*), which braid reads to find its world,
// are not knobs; neither are the scripts' and the test harness's own (BRAID_RANKS in run_main.sh,
// BRAID_TEST_DEVICE), documented where they are read.
namespace {

const std::vector<Knob> kKnobs = {
    {"BRAID_NUM_THREADS", "integer", "cores / ranks on the node",
     "threads of braid's kernels and of OpenBLAS in each process (braid::set_num_threads in code)", false},
    {"BRAID_TIMEOUT", "seconds", "600",
     "deadline of every distributed operation; a stuck one is an error naming the ranks that did not arrive", false},
    {"BRAID_DISTRIBUTED_DEBUG", "flag", "0",
     "1: the ranks compare each collective before running it, so a mismatch is an error, not a hang", false},
    {"BRAID_MEMORY_LIMIT", "bytes", "0",
     "most bytes of tensors each process may hold on a device (K/M/G suffixes; 0: no limit): a smaller device "
     "to try a model against; passing it is an error naming the sizes",
     false},
    {"BRAID_RANKS_PER_NODE", "integer", "by host name",
     "every K consecutive ranks count as one node for the hierarchical all-reduce (to try a layout on one machine)",
     false},
    {"BRAID_NCCL", "flag", "1", "0: CUDA tensors' collectives go through MPI, staged in host memory, not NCCL", false},
    {"BRAID_NCCL_P2P", "flag", "1",
     "0: CUDA tensors' point-to-point transfers (pipeline stages) go through MPI, staged in host memory, not NCCL "
     "send/recv",
     false},
    {"BRAID_NCCL_ABORT_GRACE", "seconds", "30",
     "how long an NCCL error the program has not collected may wait before the watchdog ends the job", false},
    {"BRAID_ONEDNN", "flag", "1", "0: CPU convolutions run as im2col + BLAS instead of through oneDNN", false},
    {"BRAID_ONEDNN_MIN_MACS", "number", "1000000",
     "dense float32 convolutions with fewer multiply-adds run braid's own kernels instead of oneDNN's", false},
    {"BRAID_WINOGRAD", "flag", "1", "0: no Winograd kernels for channels-last 3x3 convolutions", false},
    {"BRAID_CUDNN_BENCHMARK", "flag", "0",
     "1: cuDNN times its algorithms on each convolution geometry's first use and keeps the fastest "
     "(braid::set_cudnn_benchmark in code)",
     false},
    {"BRAID_CHANNELS_LAST", "flag", "1",
     "0: every convolution keeps NCHW, inference and training (braid::set_channels_last in code)", false},
    {"BRAID_FLOAT32_MATMUL_PRECISION", "text", "highest",
     "float32 matrix products on CUDA: highest (float32), high or medium (TF32 operands; the CPU ignores it)",
     false},
    {"BRAID_CPU_FUSED", "flag", "1", "0: the CPU backend offers no fused kernels, so every op runs its composite",
     false},
    {"BRAID_ONNX_PASSES_OFF", "text", "",
     "ONNX inference passes (conv,chain,... or all) that leave their nodes as written, to bisect a wrong result",
     false},
    {"BRAID_MODEL_CACHE", "path", "~/.cache/braid/models",
     "where the model zoo's pretrained ONNX models are cached (scripts/setup_pretrained.sh)", false},
    {"BRAID_SHADOW_CAPS", "text", "cpu",
     "the shadow device offers the CPU backend's fused kernels (cpu) or the CUDA backend's (cuda)", true},
    {"BRAID_TEST_HOLD_AT_STEPS", "text", "",
     "steps (N[,M...]) after which training waits for a preemption signal (Note [Holding for a preemption test])",
     true},
    {"BRAID_TEST_HOLD_LIMIT", "seconds", "600", "how long such a hold waits for its signal before it is an error",
     true},
};

struct Values {
  std::vector<std::string> value;
  std::vector<bool> set;
};

const Values& values() {
  static const Values v = [] {
    Values out;
    for (const Knob& k : kKnobs) {
      const char* e = std::getenv(k.name);
      out.set.push_back(e != nullptr && *e != '\0');
      out.value.emplace_back(out.set.back() ? e : "");
    }
    return out;
  }();
  return v;
}

size_t index_of(const std::string& name) {
  for (size_t i = 0; i < kKnobs.size(); ++i)
    if (name == kKnobs[i].name) return i;
  throw ValueError(detail::cat("knob_value: '", name, "' is not one of braid's knobs (braid::knobs() lists them)"));
}

std::string expand_home(const std::string& path) {
  if (path.rfind("~/", 0) != 0) return path;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + path.substr(1);
}

[[noreturn]] void bad_value(const Knob& k, const std::string& v, const char* expected) {
  throw ValueError(detail::cat("environment variable ", k.name, "='", v, "': expected ", expected,
                               "; it sets: ", k.meaning, " (braid-train --print-config lists every knob)"));
}

}  // namespace

const std::vector<Knob>& knobs() { return kKnobs; }

std::string knob_value(const std::string& name) {
  const size_t i = index_of(name);
  const std::string& v = values().set[i] ? values().value[i] : std::string(kKnobs[i].default_value);
  return std::string(kKnobs[i].type) == "path" ? expand_home(v) : v;
}

std::string config_string() {
  std::ostringstream out;
  out << "braid " << BRAID_VERSION << ": knobs in effect (environment variables; "
      << "see the README's table)\n";
  for (size_t i = 0; i < kKnobs.size(); ++i) {
    const Knob& k = kKnobs[i];
    const bool set = values().set[i];
    std::string shown = set ? values().value[i] : k.default_value;
    if (!set && std::string(k.type) == "path") shown = expand_home(shown);
    if (!set && std::string(k.name) == "BRAID_NUM_THREADS") shown = std::to_string(get_num_threads());
    out << "  " << k.name << " = " << (shown.empty() ? "(none)" : shown) << (set ? "  [set]" : "  [default]")
        << (k.for_tests ? "  (tests)" : "") << "\n";
  }
  return out.str();
}

void print_config(std::ostream& out) { out << config_string(); }
void print_config() { print_config(std::cout); }

std::string knob_table_markdown() {
  std::ostringstream out;
  out << "| variable | value | default | meaning |\n|---|---|---|---|\n";
  for (const Knob& k : kKnobs)
    out << "| `" << k.name << "` | " << k.type << " | " << (*k.default_value ? k.default_value : "(none)") << " | "
        << (k.for_tests ? "tests only: " : "") << k.meaning << " |\n";
  return out.str();
}

namespace detail {

const std::string* knob_env(const char* name) {
  const size_t i = index_of(name);
  return values().set[i] ? &values().value[i] : nullptr;
}

bool knob_flag(const char* name) {
  const Knob& k = kKnobs[index_of(name)];
  const std::string* e = knob_env(name);
  const std::string v = e ? *e : k.default_value;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  bad_value(k, v, "0 or 1");
}

int64_t knob_count(const char* name) {
  const Knob& k = kKnobs[index_of(name)];
  const std::string* e = knob_env(name);
  if (!e) return 0;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(e->c_str(), &end, 10);
  if (errno != 0 || end == e->c_str() || *end != '\0' || n < 1) bad_value(k, *e, "a positive integer");
  return n;
}

double knob_number(const char* name) {
  const Knob& k = kKnobs[index_of(name)];
  const std::string* e = knob_env(name);
  const std::string v = e ? *e : k.default_value;
  const bool seconds = std::string(k.type) == "seconds";
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(seconds ? d > 0 : d >= 0) || d != d)
    bad_value(k, v, seconds ? "a positive number of seconds" : "a number >= 0");
  return d;
}

int64_t knob_bytes(const char* name) {
  const Knob& k = kKnobs[index_of(name)];
  const std::string* e = knob_env(name);
  const std::string v = e ? *e : k.default_value;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  double scale = 1;
  if (end != v.c_str() && *end != '\0' && end[1] == '\0') {
    switch (*end) {
      case 'K': case 'k': scale = 1024.0; ++end; break;
      case 'M': case 'm': scale = 1024.0 * 1024; ++end; break;
      case 'G': case 'g': scale = 1024.0 * 1024 * 1024; ++end; break;
      default: break;
    }
  }
  if (errno != 0 || end == v.c_str() || *end != '\0' || !(d >= 0)) bad_value(k, v, "a size such as 512M, 4G or 0");
  return static_cast<int64_t>(d * scale);
}

std::string knob_text(const char* name) { return knob_value(name); }

}  // namespace detail
}  // namespace braid
