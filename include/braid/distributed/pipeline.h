// Pipeline execution: this rank's stage of a model cut into consecutive layers, run by a schedule
// (schedule.h) over micro-batches. Activations and their gradients cross stage boundaries by MPI
// point-to-point; within a stage, autograd does the backward as usual, so layers stay unchanged.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "braid/distributed/data_parallel.h"
#include "braid/distributed/process_group.h"
#include "braid/distributed/schedule.h"
#include "braid/distributed/sharded.h"
#include "braid/nn/module.h"

namespace braid::distributed {

/// loss(output, target) of one micro-batch, reduced to a scalar by its mean.
using PipeLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;

struct PipelineOptions {
  /// Activation recomputation (GPipe's re-materialisation): forward keeps only the stage's input
  /// per micro-batch and backward runs the stage's forward again. The default generator's state is
  /// replayed for the second run, so dropout draws the same masks (as torch.utils.checkpoint's
  /// preserve_rng_state); a layer given its own Generator is not replayed.
  bool recompute = false;
  /// Data x pipeline: the stage's DistributedDataParallel over the ranks that hold the same stage
  /// in the other replicas (see make_grid). Gradients are all-reduced once per mini-batch, during
  /// the stage's last backward.
  DistributedDataParallel* data_parallel = nullptr;
  /// Or sharded data parallelism across the replicas (ShardedDataParallel at stage 1 or 2 over
  /// the stage's module and the grid's data group): the same, then its step() instead of the
  /// optimizer's.
  ShardedDataParallel* sharded = nullptr;
};

/// The sizes of a 3-D grid of ranks: data-parallel replicas x pipeline stages x tensor-parallel
/// shards. data = 0 takes what is left: world size / (pipeline x tensor).
struct GridShape {
  int data = 0, pipeline = 1, tensor = 1;
};

// Note [Grid placement]
// Rank r sits at (replica, stage, tensor_rank) with r = (replica x P + stage) x T + tensor_rank:
// the tensor-parallel shards of a layer are neighbours (on one node, where its fast links are; as
// Megatron-LM places them), a pipeline's stages come next, and the replicas vary slowest. With
// T = 1 this is make_grid(K)'s layout: stage r % K of replica r / K.

/// Every group a rank of the grid takes part in, and its coordinates.
struct Grid {
  /// pipeline: one replica's P stages (same replica and tensor_rank; group rank = stage).
  /// data: the D ranks holding the same stage and shard (DistributedDataParallel's or
  /// ShardedDataParallel's group; group rank = replica). tensor: the T shards of one stage (the
  /// tensor-parallel layers' group; group rank = tensor_rank). model: the P x T ranks of one
  /// replica, which together hold the whole model once.
  ProcessGroupPtr pipeline, data, tensor, model;
  int replica = 0, stage = 0, tensor_rank = 0;
  GridShape shape;
  /// The world rank at these coordinates (Note [Grid placement]).
  int rank_of(int replica, int stage, int tensor_rank) const;
  /// "replica 1 of 2, stage 0 of 2, tensor shard 1 of 1".
  std::string describe() const;
};
/// Builds the grid's four groups (collective over world_group, default the world). Sizes must be
/// positive and multiply to the world's size: ValueError naming them otherwise.
Grid make_grid(const GridShape& shape, ProcessGroupPtr world_group = nullptr);
/// The D x K grid of a K-stage pipeline replicated over the remaining ranks: make_grid({0, K, 1}).
Grid make_grid(int pipeline_stages, ProcessGroupPtr world_group = nullptr);

/// One action of one stage in a step, in seconds: steady-clock time in last_events(), since the
/// step's earliest event in a gathered PipeTimeline (Note [Timeline clock]).
struct PipeEvent {
  int stage = 0;
  PipeAction action;
  double start = 0, end = 0;
};

/// Every stage's events of a step, gathered.
struct PipeTimeline {
  std::vector<PipeEvent> events;
  int stages = 0;
  double makespan = 0;
  /// 1 - (time in forward and backward) / (stages x makespan): the measured bubble.
  double bubble_fraction = 0;
  /// Chrome trace format (chrome://tracing, Perfetto): one track per stage.
  void write_chrome_trace(const std::string& path) const;
  /// A Gantt chart: one row per stage, forward and backward boxes labelled by micro-batch,
  /// transfers and waits in grey, idle time blank.
  void write_gantt_svg(const std::string& path, const std::string& title) const;
};

/// What crosses a cut for one micro-batch: the activation first (named ""), then the skip tensors
/// stashed before the cut and used after it (nn/skip.h), by name. Gradients return the same way.
struct StageBoundary {
  std::vector<std::string> names;
  std::vector<Tensor> tensors;
};

class PipelineStage {
 public:
  /// module: this rank's stage; group: the pipeline's ranks, stage s = group rank s. Collective
  /// only in train_step (every stage calls it with the same schedule).
  PipelineStage(std::shared_ptr<nn::Module> module, ProcessGroupPtr group, const PipelineOptions& options = {});
  /// For interleaved schedules: the next model chunk of this rank, the constructor's module being
  /// chunk 0; chunk c is virtual stage c * K + s of the model cut into v K consecutive pieces
  /// (schedule.h). Every chunk lives on chunk 0's device.
  void add_chunk(std::shared_ptr<nn::Module> module);

  /// Runs one mini-batch by schedule: the first stage splits input, the last splits target, into
  /// schedule.micro_batches equal parts along axis 0; each micro-batch's loss is scaled by 1/M so
  /// that the accumulated gradients are those of the mean loss over the mini-batch. Gradients
  /// accumulate into the stage's parameters (zero them and step the optimizer around the call).
  /// Interleaved schedules need as many chunks as the schedule's; a split backward (ZB-H1) sends
  /// the input gradient after BackwardInput and computes the weights' at BackwardWeight
  /// (backward_input, autograd.h). Returns the mini-batch's mean loss on every stage.
  double train_step(const PipeSchedule& schedule, const Tensor& input, const Tensor& target, const PipeLoss& loss);

  /// Inference through the pipeline (no autograd): the first stage takes input, the last returns
  /// the model's output; the other stages return an undefined tensor. Collective over the group.
  Tensor forward(const Tensor& input);

  int stage() const { return group_->rank(); }
  int stages() const { return group_->size(); }
  /// Model chunks on this rank (1 unless made for an interleaved schedule).
  int chunks() const { return static_cast<int>(modules_.size()); }
  /// Chunk 0, the whole stage unless interleaved.
  nn::Module& module() { return *modules_.front(); }
  nn::Module& chunk_module(int chunk) { return *modules_.at(static_cast<size_t>(chunk)); }
  /// The most bytes of tensor storage alive during the latest train_step, less what was alive at
  /// its start (activations, gradients and buffers of the step).
  int64_t last_peak_bytes() const { return peak_bytes_; }
  /// This stage's events of the latest train_step.
  const std::vector<PipeEvent>& last_events() const { return events_; }
  /// Gathers every stage's events of the latest train_step (collective over the pipeline group;
  /// every stage gets the whole timeline).
  PipeTimeline gather_timeline();

 private:
  struct Incoming;
  void send_boundary(const StageBoundary& b, int to, int tag);
  std::shared_ptr<Incoming> post_receive(int from, int tag);
  void post_data(Incoming& in);
  StageBoundary finish_receive(Incoming& in);
  void progress(std::vector<std::shared_ptr<Incoming>>& pending);
  /// Runs chunk c on in's activation with in's skip tensors in scope: the output and, unless this
  /// is the model's last piece, the skip tensors left to carry on.
  StageBoundary run_module(int chunk, const StageBoundary& in);
  /// send_boundary, or to this rank's own mailbox when a one-rank ring sends to itself.
  void send_to(const StageBoundary& b, int to, int tag);
  /// The boundary with that tag from this rank's mailbox.
  StageBoundary take_own(int tag);

  std::vector<std::shared_ptr<nn::Module>> modules_;
  ProcessGroupPtr group_;
  PipelineOptions options_;
  int64_t peak_bytes_ = 0;
  std::vector<PipeEvent> events_;
  std::vector<WorkPtr> pending_sends_;
  std::vector<Tensor> send_buffers_;
  std::map<int, StageBoundary> own_mail_;
};

}  // namespace braid::distributed
