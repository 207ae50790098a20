// Note [Preemption] in braid/distributed/preemption.h.
#include "braid/distributed/preemption.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "braid/error.h"
#include "braid/ops.h"
#include "braid/tensor.h"
#include "core/knob_read.h"

namespace braid::distributed {

namespace {

volatile std::sig_atomic_t g_caught = 0;  // the signal number, or 0

extern "C" void on_preemption_signal(int sig) { g_caught = sig; }

// Note [Holding for a preemption test]: the steps of BRAID_TEST_HOLD_AT_STEPS, read once.
const std::vector<int64_t>& hold_steps() {
  static const std::vector<int64_t> steps = [] {
    std::vector<int64_t> out;
    const std::string v = braid::detail::knob_text("BRAID_TEST_HOLD_AT_STEPS");
    if (v.empty()) return out;
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      char* end = nullptr;
      const long long n = std::strtoll(item.c_str(), &end, 10);
      BRAID_CHECK(end != item.c_str() && *end == '\0' && n >= 0, "BRAID_TEST_HOLD_AT_STEPS: expected steps as "
                  "non-negative integers separated by commas, got '", v, "'");
      out.push_back(n);
    }
    return out;
  }();
  return steps;
}

bool holds_at(int64_t step) {
  for (int64_t s : hold_steps())
    if (s == step) return true;
  return false;
}

double hold_limit_seconds() {
  static const double limit = braid::detail::knob_number("BRAID_TEST_HOLD_LIMIT");
  return limit;
}

// Waits until done() or the hold limit; the limit is an error naming where the job held.
template <class Done>
void hold(const std::string& where, Done done) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > hold_limit_seconds())
      throw DistributedError("preemption test hold " + where + ": no preemption signal came within " +
                             std::to_string(static_cast<int>(hold_limit_seconds())) +
                             " s (BRAID_TEST_HOLD_AT_STEPS, BRAID_TEST_HOLD_LIMIT)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

void catch_preemption_signals() { catch_preemption_signals({SIGUSR1, SIGTERM}); }

void catch_preemption_signals(const std::vector<int>& signals) {
  for (int s : signals) {
    struct sigaction sa {};
    sa.sa_handler = on_preemption_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a read or write in progress goes on; the loop checks at the next step
    BRAID_CHECK(::sigaction(s, &sa, nullptr) == 0, "catch_preemption_signals: cannot catch signal ", s, ": ",
                std::strerror(errno));
  }
  // A requeued job (Slurm counts its restarts) is past its start: only the first run holds there.
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  if (holds_at(0) && (restarts == nullptr || std::atoi(restarts) == 0)) {
    std::fprintf(stderr, "braid: pid %ld holding before start for a preemption signal\n", static_cast<long>(::getpid()));
    std::fflush(stderr);
    hold("before start", [] { return g_caught != 0; });
  }
}

bool preemption_requested(const ProcessGroupPtr& group) {
  Tensor flag = full({1}, g_caught != 0 ? 1.0 : 0.0, kInt32);
  if (group && group->size() > 1) group->all_reduce(flag, ReduceOp::Max);
  return flag.item() != 0;
}

bool preemption_requested() { return preemption_requested(world()); }

bool preemption_requested(const ProcessGroupPtr& group, int64_t step) {
  if (step <= 0 || !holds_at(step)) return preemption_requested(group);
  if (!group || group->rank() == 0) {
    std::fprintf(stderr, "braid: holding after step %lld for a preemption signal\n", static_cast<long long>(step));
    std::fflush(stderr);
  }
  hold("after step " + std::to_string(step), [&] { return preemption_requested(group); });
  return true;
}

bool preemption_requested(int64_t step) { return preemption_requested(world(), step); }

std::string preemption_signal() {
  const int s = g_caught;
  if (s == 0) return "";
  if (s == SIGUSR1) return "SIGUSR1";
  if (s == SIGUSR2) return "SIGUSR2";
  if (s == SIGTERM) return "SIGTERM";
  if (s == SIGINT) return "SIGINT";
  return "signal " + std::to_string(s);
}

void clear_preemption() { g_caught = 0; }

}  // namespace braid::distributed
