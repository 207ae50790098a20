// Parameter-server training (TensorFlow's ParameterServerStrategy, stale-synchronous parallel):
// the first `servers` ranks of a group hold the model's variables, each its share, and step the
// optimizer on them; the other ranks are workers that compute gradients on their shards of the
// data, push them to the servers and pull the variables back. Synchronously (every worker's
// gradient of a step, averaged), asynchronously (each gradient applied as it arrives), or with
// bounded staleness s: a worker never continues with variables that lack any worker's updates from
// more than s of its steps ago. With dynamic batches the workers claim numbered batches from the
// servers instead of training on shards, so a fast worker takes more of them than a slow one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "braid/distributed/process_group.h"
#include "braid/distributed/sharded.h"
#include "braid/nn/module.h"

namespace braid::distributed {

enum class Placement {
  RoundRobin,  ///< variable i on server i mod S, in the model's order
  Greedy,      ///< largest first, each onto the least loaded server (GreedyLoadBalancingStrategy), or
               ///< round robin where that happens to balance better
};

/// The server of each variable (sizes in bytes) among servers.
std::vector<int> place_variables(const std::vector<int64_t>& bytes, int servers, Placement placement);
/// The most bytes any server holds under a placement.
int64_t max_load(const std::vector<int64_t>& bytes, const std::vector<int>& server_of, int servers);

struct ParameterServerOptions {
  int servers = 1;
  Placement placement = Placement::Greedy;
  /// 0: synchronous; s > 0: bounded staleness s (stale-synchronous parallel); -1: asynchronous.
  int staleness = 0;
  /// > 0: the batches 0 .. dynamic_batches - 1 go, in order, to whichever worker asks for one
  /// (next_batch()); each `workers` consecutive batches form a round, one update of their average,
  /// and staleness counts rounds (Note [Claimed batches]). 0: each worker trains on its own shard
  /// and calls push_pull().
  int64_t dynamic_batches = 0;
  /// With dynamic batches, a resumed run: batches 0 .. first_batch - 1 were trained (a multiple of
  /// the workers, i.e. whole rounds); the servers start at that round and hand out the rest.
  int64_t first_batch = 0;
};

/// What a worker saw when it pulled from one server: its clock (steps pushed), the slowest worker's
/// clock on that server when it answered, for checking the staleness bound, and the server's version
/// (optimizer steps taken: one per round when synchronous, one per push otherwise). With dynamic
/// batches: the batch claimed, its round as the clock, and the rounds applied as slowest and version.
struct PullRecord {
  int64_t clock = 0, slowest = 0, version = 0;
  int server = 0;
  int64_t batch = -1;
};

class ParameterServer {
 public:
  /// Collective over group: checks that every rank built the same model and starts every rank from
  /// rank 0's values; servers make their variables' optimizer with make_optimizer. The group needs
  /// at least servers + 1 ranks.
  ParameterServer(std::shared_ptr<nn::Module> module, const OptimizerFactory& make_optimizer,
                  ProcessGroupPtr group = nullptr, const ParameterServerOptions& options = {});
  /// The same with one optimizer over the module's parameters (as Python builds it): a server
  /// steps it with gradients on its own variables alone.
  ParameterServer(std::shared_ptr<nn::Module> module, std::shared_ptr<braid::optim::Optimizer> optimizer,
                  ProcessGroupPtr group = nullptr, const ParameterServerOptions& options = {});
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  bool is_server() const { return rank_ < options_.servers; }
  int servers() const { return options_.servers; }
  int workers() const { return size_ - options_.servers; }
  /// This worker's index among the workers (0 .. workers - 1); -1 on a server.
  int worker_index() const { return is_server() ? -1 : rank_ - options_.servers; }
  /// Each variable's server.
  const std::vector<int>& placement() const { return server_of_; }

  /// Worker: after backward, sends every parameter's gradient to its server and waits for the
  /// variables back (Note [Parameter-server protocol]); then the model holds them.
  void push_pull();
  /// Worker, with dynamic batches: pushes the gradient of the batch it holds (none at the first
  /// call), claims the next batch and waits for variables at most `staleness` rounds behind that
  /// batch's round (any age when asynchronous). Returns the batch's number, or -1 once every batch
  /// has been handed out; then call finish(). stop (a preemption, seen by this worker alone): asks
  /// server 0 to hand out nothing past the round of the batches given so far, so that the run ends
  /// at a round's end on every worker.
  int64_t next_batch(bool stop = false);
  /// With dynamic batches: the batches handed out, once next_batch() has returned -1 (a whole
  /// number of rounds; fewer than dynamic_batches after a stop).
  int64_t handed_out() const { return handed_out_; }
  /// Worker: done training; receives the servers' final variables.
  void finish();
  /// Server: answers the workers until every one has finished. The module then holds this
  /// server's variables at their final values (the others stay as they were).
  void serve();
  /// Worker: every pull's record, one per server per step, in order.
  const std::vector<PullRecord>& pulls() const { return pulls_; }
  /// Server: called after each optimizer step with its optimizer (a learning-rate schedule steps
  /// there). Its optimizer, or null on a worker or a server without variables.
  void on_server_step(std::function<void(optim::Optimizer&)> fn) { on_step_ = std::move(fn); }
  optim::Optimizer* server_optimizer();

 private:
  struct ServerState;
  struct Pulls;
  Pulls post_pulls();
  void take_pulls(Pulls& p, bool record);
  void send_header(int to, int64_t a, int64_t b, int tag);
  void push_gradients(int64_t a, int64_t b, std::vector<WorkPtr>& sends, std::vector<Tensor>& keep);
  void serve_claims();
  std::vector<int64_t> header_of(int w) const;
  void post_header(int w);
  Tensor receive_gradient(int w);
  void answer(int w, int64_t a, int64_t b);
  void step_with(const Tensor& grad);
  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr group_;
  ParameterServerOptions options_;
  int rank_ = 0, size_ = 1;
  std::vector<Tensor> params_;
  std::vector<int> server_of_;
  std::vector<std::vector<size_t>> vars_of_;  // per server: its variables, in the model's order
  int64_t clock_ = 0, held_ = -1, handed_out_ = -1;
  std::vector<PullRecord> pulls_;
  std::unique_ptr<ServerState> server_;
  std::function<void(optim::Optimizer&)> on_step_;
};

}  // namespace braid::distributed
