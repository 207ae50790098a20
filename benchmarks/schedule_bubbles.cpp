// Prints benchmarks/README.md's table of simulated pipeline bubbles: validate()'s simulation of
// GPipe, 1F1B, interleaved 1F1B (v = 2) and ZB-H1 beside each schedule's closed form, with
// F = B = W = 1 (a whole backward 2; an interleaved chunk's actions 1/v of those). No timing: the
// numbers are the schedules' own, the same on every machine.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "braid/distributed/schedule.h"

using namespace braid::distributed;

int main() {
  const int v = 2;
  std::printf(
      "| K | M | schedule | simulated idle share | formula | simulated bubble / ideal | formula |"
      " peak live activations per stage |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---|\n");
  for (int k : {2, 4}) {
    for (int m : {k, 2 * k, 4 * k}) {
      struct Row {
        std::string name;
        PipeSchedule schedule;
        double over_ideal;  // closed form of the bubble over the ideal time
        double share;       // closed form of the idle share
      };
      const double kk = k - 1;
      const std::vector<Row> rows = {
          {"GPipe", gpipe_schedule(k, m), kk / m, kk / (m + kk)},
          {"1F1B", one_f_one_b_schedule(k, m), kk / m, kk / (m + kk)},
          {"interleaved (v = 2)", interleaved_schedule(k, m, v), kk / (v * m), kk / (v * m + kk)},
          {"ZB-H1", zb_h1_schedule(k, m), kk / (3.0 * m), kk / (3.0 * m + kk)},
      };
      for (const Row& r : rows) {
        const ScheduleReport rep = validate(r.schedule, StepCosts{});
        // A stream: GCC 12 warns falsely (-Wrestrict) on string concatenation here.
        std::ostringstream os;
        for (size_t i = 0; i < rep.peak_live_activations.size(); ++i) os << (i ? " " : "") << rep.peak_live_activations[i];
        const std::string peaks = os.str();
        std::printf("| %d | %d | %s | %.4f | %.4f | %.4f | %.4f | %s |\n", k, m, r.name.c_str(), rep.bubble_fraction,
                    r.share, rep.bubble_over_ideal, r.over_ideal, peaks.c_str());
      }
    }
  }
  return 0;
}
