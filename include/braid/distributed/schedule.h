// Pipeline schedules as data. A schedule lists, for every stage (rank) of a K-stage pipeline, the
// actions it performs in order for one mini-batch of M micro-batches: forward and backward of a
// micro-batch, sending and receiving activations and gradients, and the weight update. The Stage
// (what runs) is kept apart from the Schedule (when it runs): GPipe, 1F1B, interleaved 1F1B and
// ZB-H1 are functions that build schedules, and validate() proves a schedule free of deadlock and
// reports its bubble and peak live activations before anything runs.
#pragma once

#include <string>
#include <vector>

namespace braid::distributed {

struct PipeAction {
  /// Backward runs a micro-batch's whole backward; a split backward runs BackwardInput (the
  /// gradient of the stage's input, which is sent upstream at once) and later BackwardWeight (the
  /// weight gradients), as the zero-bubble schedules do. New kinds go at the end: timelines store
  /// the kind as its number.
  enum class Kind {
    Forward,
    Backward,
    SendActivation,
    RecvActivation,
    SendGrad,
    RecvGrad,
    Update,
    BackwardInput,
    BackwardWeight
  };
  Kind kind;
  int micro = -1;  ///< micro-batch index; -1 for Update
  /// The model chunk on this rank that the action belongs to (interleaved schedules hold several):
  /// chunk c of stage s is virtual stage c * stages + s. 0 in schedules of one chunk per stage.
  int chunk = 0;
  /// "F3", "B0", "BI2", "W2", "send_act 2", "recv_grad 1", "update"; " chunk c" follows when c > 0.
  std::string str() const;
  bool operator==(const PipeAction&) const = default;
};

/// actions[s] is stage s's list, in order.
struct PipeSchedule {
  std::string name;
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<PipeAction>> actions;
  /// Model chunks per stage (virtual stages per rank); more than 1 only for interleaved schedules.
  int chunks = 1;
};

/// GPipe: every micro-batch forward, then every micro-batch backward (in reverse), then update.
PipeSchedule gpipe_schedule(int stages, int micro_batches);
/// 1F1B (PipeDream-Flush): stage s runs min(K - s - 1, M) warm-up forwards, then alternates one
/// forward and one backward, then drains the remaining backwards, then updates; at most K - s
/// micro-batches' activations are alive on stage s instead of M.
PipeSchedule one_f_one_b_schedule(int stages, int micro_batches);
/// Interleaved 1F1B (Megatron-LM, arXiv 2104.04473): each of the K ranks holds `chunks` = v model
/// chunks, chunk c of rank s being virtual stage c * K + s, so activations go rank s -> s + 1 and
/// from the last rank back to rank 0 for the next chunk. Micro-batches run in groups of K through
/// one chunk after another; the bubble shrinks v-fold to (K - 1) / (v M) of the ideal time
/// (Note [Interleaved 1F1B]). Needs M % K == 0 and v >= 2.
PipeSchedule interleaved_schedule(int stages, int micro_batches, int chunks);
/// ZB-H1 (zero bubble, arXiv 2401.10241): backward split into BackwardInput, sent upstream at once,
/// and BackwardWeight, deferred to fill the tail of the pipeline; with F = B = W the bubble is a
/// third of 1F1B's, (K - 1) / (3 M) of the ideal time (Note [ZB-H1]). Needs M >= K.
PipeSchedule zb_h1_schedule(int stages, int micro_batches);
/// The schedule of that name: "gpipe", "1f1b", "interleaved" (with `chunks`), "zb-h1". An unknown
/// name is a ValueError listing the known ones.
PipeSchedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks = 2);

/// The simulated duration of each compute action, for one micro-batch through a rank's whole share
/// of the model; an action of an interleaved schedule costs 1 / chunks of it, so that a rank's total
/// work is the same whatever the schedule. A split backward (BackwardInput + BackwardWeight) is
/// meant to cost what Backward does; the defaults (F = B = W = 1, full backward 2) are ZB-H1's.
struct StepCosts {
  double forward = 1.0;
  double backward = 2.0;         ///< a whole (unsplit) backward
  double backward_input = 1.0;   ///< BackwardInput
  double backward_weight = 1.0;  ///< BackwardWeight
};

struct ScheduleReport {
  /// Idle share of K x makespan: 1 - busy / (K x makespan), GPipe's (K - 1) / (M + K - 1).
  double bubble_fraction = 0;
  /// Idle time over busy time, (K x makespan - busy) / busy: the bubble relative to the ideal time,
  /// as Megatron and the zero-bubble paper state it (1F1B's (K - 1) / M).
  double bubble_over_ideal = 0;
  double makespan = 0;
  /// Per stage, the most (micro-batch, chunk) activations alive at once: from F until the backward
  /// is complete (Backward, or BackwardWeight when split). Units of one chunk's activation.
  std::vector<int> peak_live_activations;
  /// Per stage, the most activations whose input gradient has not yet run (from F until Backward
  /// or BackwardInput): after BackwardInput only what BackwardWeight reads is still kept.
  std::vector<int> peak_awaiting_input_grad;
};

/// Checks that every stage forwards every micro-batch through each of its chunks once, then
/// backwards it once (Backward, or BackwardInput before BackwardWeight), that update comes last,
/// that each activation and gradient is sent after it is made and received before it is used by
/// the neighbouring virtual stage (the last rank's chunk c feeds rank 0's chunk c + 1), and that
/// the schedule completes when receives block until the matching send has run (sends do not
/// block). Throws ValueError naming the stage and the action on the first problem, e.g. "stage 1
/// waits forever at recv_grad 2 (action 5); stage 2 waits at ...".
ScheduleReport validate(const PipeSchedule& schedule, const StepCosts& costs);
/// Forward cost 1 and backward cost backward_cost (a split backward half of it each).
ScheduleReport validate(const PipeSchedule& schedule, double backward_cost = 2.0);

}  // namespace braid::distributed
