// Note [Preemption] in braid/distributed/preemption.h.
#include "braid/distributed/preemption.h"

#include <csignal>
#include <cstring>

#include "braid/error.h"
#include "braid/ops.h"
#include "braid/tensor.h"

namespace braid::distributed {

namespace {

volatile std::sig_atomic_t g_caught = 0;  // the signal number, or 0

extern "C" void on_preemption_signal(int sig) { g_caught = sig; }

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
}

bool preemption_requested(const ProcessGroupPtr& group) {
  Tensor flag = full({1}, g_caught != 0 ? 1.0 : 0.0, kInt32);
  if (group && group->size() > 1) group->all_reduce(flag, ReduceOp::Max);
  return flag.item() != 0;
}

bool preemption_requested() { return preemption_requested(world()); }

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
