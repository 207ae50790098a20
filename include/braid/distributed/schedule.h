// Pipeline schedules as data. A schedule lists, for every stage of a K-stage pipeline, the actions
// it performs in order for one mini-batch of M micro-batches: forward and backward of a micro-batch,
// sending and receiving activations and gradients, and the weight update. The Stage (what runs) is
// kept apart from the Schedule (when it runs): GPipe and 1F1B are two functions that build
// schedules, and validate() proves a schedule free of deadlock and reports its bubble and peak
// live activations before anything runs.
#pragma once

#include <string>
#include <vector>

namespace braid::distributed {

struct PipeAction {
  enum class Kind { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad, Update };
  Kind kind;
  int micro = -1;  ///< micro-batch index; -1 for Update
  /// "F3", "B0", "send_act 2", "recv_grad 1", "update".
  std::string str() const;
  bool operator==(const PipeAction&) const = default;
};

/// actions[s] is stage s's list, in order.
struct PipeSchedule {
  std::string name;
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<PipeAction>> actions;
};

/// GPipe: every micro-batch forward, then every micro-batch backward (in reverse), then update.
PipeSchedule gpipe_schedule(int stages, int micro_batches);
/// 1F1B (PipeDream-Flush): stage s runs min(K - s - 1, M) warm-up forwards, then alternates one
/// forward and one backward, then drains the remaining backwards, then updates; at most K - s
/// micro-batches' activations are alive on stage s instead of M.
PipeSchedule one_f_one_b_schedule(int stages, int micro_batches);

struct ScheduleReport {
  /// Idle share of K x makespan in a simulation with forward time 1 and backward time
  /// backward_cost (GPipe's (K - 1) / (M + K - 1) when backward_cost = 1).
  double bubble_fraction = 0;
  double makespan = 0;
  /// Per stage, the most micro-batches whose activations are alive at once.
  std::vector<int> peak_live_activations;
};

/// Checks that every stage forwards and backwards every micro-batch once (forward before backward,
/// update last), that every send has its receive on the neighbouring stage and vice versa, and that
/// the schedule completes when receives block until the matching send has run (sends do not
/// block). Throws ValueError naming the stage and the action on the first problem, e.g. "stage 1
/// waits forever at recv_grad 2 (action 5); stage 2 waits at ...".
ScheduleReport validate(const PipeSchedule& schedule, double backward_cost = 2.0);

}  // namespace braid::distributed
