// ParameterServer: placement, the workers' push and pull, and the servers' loop.
//
// Note [Parameter-server protocol]
// Point-to-point over the group, in four streams (tags): a worker's push is a header (its clock, the
// number of steps it has pushed, or -1 when it has finished) and one flat buffer of the gradients of
// a server's variables, in the model's order; the answer is a header (the server's version and the
// slowest worker's clock) and the variables, flat. A worker pushes to every server before it waits
// for any answer, and posts the receives of every server's answer first, so that an answer too
// large to be sent eagerly is taken while the worker still waits on another server, instead of
// holding that server in its send until the worker gets to it. (Receiving from one server after
// the other does not deadlock either: every server sees the same pushes, so when one server may
// answer a worker, the others may too.)
// - Synchronous (staleness 0): the server takes the workers' pushes of a step in worker order, adds
//   them in that order, multiplies by 1 / (workers that pushed), steps the optimizer once and answers
//   them all: the step of synchronous data parallelism on the same shards, bit for bit with a
//   reference that adds in worker order (tests/test_parameter_server.cpp).
// - Asynchronous and bounded staleness s: the server polls every worker's header and applies each
//   gradient as it arrives, scaled by 1 / workers (so that one push from each is one step's
//   average), then answers the worker, unless it is more than s steps ahead of the slowest worker
//   still training: that answer waits until the slowest catches up, which is what blocks a fast
//   worker (stale-synchronous parallel). A worker that has finished no longer holds the others back.
// When every worker has finished, each gets the final variables.
//
// Note [Claimed batches]
// With a slow worker, static shards make every mode but the asynchronous one wait for it: under
// bounded staleness a fast worker may run s steps ahead of the slowest and no further, so over an
// epoch of equal shards it waits as long as synchronous training does. With dynamic batches
// (TensorFlow's coordinator hands steps to whichever worker is free) the batches are numbered
// 0 .. T - 1 and server 0 hands out the next number to each worker that asks; batches
// [r W, (r + 1) W) form round r (W workers; the last round may be shorter). Every server keeps the
// gradients of a round in slots by batch number and, once a round is complete and every earlier
// round applied, adds the slots in batch order, multiplies by 1 / (the round's batches) and steps:
// version v means rounds 0 .. v - 1 applied. A worker that claimed a batch of round r gets the
// variables once version >= r - s, so it never computes on variables more than s rounds old; at
// s = 0 every batch of round r sees exactly the variables after round r - 1, which is synchronous
// data parallelism over the batch order (round r = step r, batch r W + i on rank i) bit for bit, and
// still no faster than the slowest worker's batch in each round. At s > 0 the slow worker's batch
// holds back only the rounds within s of it: the others take the batches it would have taken, and
// the rounds it is not part of complete without it. Asynchronous (-1): each gradient is applied as
// it arrives, scaled by 1 / W, and every claim is answered at once. A worker's messages to a server
// are headers {kind, batch}: a push of a batch's gradient (data follows), a claim (server 0: it
// answers with the number on its own tag, then the variables as a pull) or a pull of a claimed
// batch (the other servers), and -1 when the worker has finished.
#include "braid/distributed/parameter_server.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed {

namespace {
constexpr int kPushHeader = 7101, kPushData = 7102, kPullHeader = 7103, kPullData = 7104, kClaimed = 7105;
constexpr int64_t kPush = 1, kClaim = 2, kPull = 3;  // header kinds with dynamic batches
}

std::vector<int> place_variables(const std::vector<int64_t>& bytes, int servers, Placement placement) {
  BRAID_CHECK(servers >= 1, "place_variables: need at least one server, got ", servers);
  std::vector<int> out(bytes.size());
  if (placement == Placement::RoundRobin) {
    for (size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<int>(i % static_cast<size_t>(servers));
    return out;
  }
  // Largest first onto the least loaded server (LPT, within 4/3 of the best balance); LPT is not
  // always better than round robin, so the better of the two is kept: never worse than round robin.
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<int64_t> load(static_cast<size_t>(servers), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    out[i] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += bytes[i];
  }
  const std::vector<int> rr = place_variables(bytes, servers, Placement::RoundRobin);
  return max_load(bytes, rr, servers) < max_load(bytes, out, servers) ? rr : out;
}

int64_t max_load(const std::vector<int64_t>& bytes, const std::vector<int>& server_of, int servers) {
  std::vector<int64_t> load(static_cast<size_t>(servers), 0);
  for (size_t i = 0; i < bytes.size(); ++i) load.at(static_cast<size_t>(server_of[i])) += bytes[i];
  return *std::max_element(load.begin(), load.end());
}

struct ParameterServer::ServerState {
  std::shared_ptr<optim::Optimizer> optimizer;
  std::vector<Tensor> vars;  // this server's variables
  int64_t numel = 0, version = 0;
  // serve()'s per-worker bookkeeping: push clocks, finished, owed an answer, the posted header.
  std::vector<int64_t> clock;
  std::vector<bool> done, owed;
  std::vector<Tensor> headers;
  std::vector<WorkPtr> posted;
  bool all_done() const { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); }
  bool any_owed() const { return std::any_of(owed.begin(), owed.end(), [](bool o) { return o; }); }
  int64_t slowest() const {
    int64_t m = INT64_MAX;
    for (size_t w = 0; w < clock.size(); ++w)
      if (!done[w]) m = std::min(m, clock[w]);
    return m == INT64_MAX ? *std::max_element(clock.begin(), clock.end()) : m;
  }
};

ParameterServer::ParameterServer(std::shared_ptr<nn::Module> module, const OptimizerFactory& make_optimizer,
                                 ProcessGroupPtr group, const ParameterServerOptions& options)
    : module_(std::move(module)), group_(group ? std::move(group) : world()), options_(options) {
  BRAID_CHECK(module_ != nullptr, "ParameterServer: the module is null");
  rank_ = group_->rank(), size_ = group_->size();
  BRAID_CHECK(options.servers >= 1 && options.servers < size_, "ParameterServer: ", options.servers,
              " servers in a group of ", size_, " ranks leave no worker (group ", group_->name(), ")");
  BRAID_CHECK(options.staleness >= -1, "ParameterServer: staleness must be >= 0, or -1 for asynchronous, got ",
              options.staleness);
  std::vector<int64_t> bytes;
  for (const Tensor& p : module_->parameters()) {
    if (!p.requires_grad()) continue;
    BRAID_CHECK_T(TypeError, params_.empty() || (p.dtype() == params_[0].dtype() && p.device() == params_[0].device()),
                  "ParameterServer: every parameter must share one dtype and device, got ", dtype_name(p.dtype()),
                  " on ", p.device().str(), " after ", dtype_name(params_[0].dtype()), " on ", params_[0].device().str());
    params_.push_back(p);
    bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
  }
  BRAID_CHECK(!params_.empty(), "ParameterServer: the module has no trainable parameters");
  detail::check_and_broadcast_model(*module_, *group_, true, "ParameterServer");
  server_of_ = place_variables(bytes, options.servers, options.placement);
  vars_of_.assign(static_cast<size_t>(options.servers), {});
  for (size_t i = 0; i < params_.size(); ++i) vars_of_[static_cast<size_t>(server_of_[i])].push_back(i);
  if (!is_server()) return;
  server_ = std::make_unique<ServerState>();
  for (size_t i : vars_of_[static_cast<size_t>(rank_)]) {
    server_->vars.push_back(params_[i]);
    server_->numel += params_[i].numel();
  }
  if (!server_->vars.empty()) server_->optimizer = make_optimizer(server_->vars);
}

ParameterServer::ParameterServer(std::shared_ptr<nn::Module> module, std::shared_ptr<optim::Optimizer> optimizer,
                                 ProcessGroupPtr group, const ParameterServerOptions& options)
    : ParameterServer(std::move(module), [&](const std::vector<Tensor>&) { return optimizer; }, std::move(group),
                      options) {
  BRAID_CHECK(optimizer != nullptr, "ParameterServer: the optimizer is null");
}

ParameterServer::~ParameterServer() = default;

optim::Optimizer* ParameterServer::server_optimizer() { return server_ ? server_->optimizer.get() : nullptr; }

void ParameterServer::send_header(int to, int64_t a, int64_t b, int tag) {
  group_->send(tensor(std::vector<int64_t>{a, b}, {2}, Device::cpu()), to, tag);
}

// Posts the receives of every server's answer before anything is sent, so that a server's answer
// never waits for this worker to finish with another server (Note [Parameter-server protocol]).
struct ParameterServer::Pulls {
  std::vector<Tensor> headers, flats;
  std::vector<WorkPtr> works;
};

ParameterServer::Pulls ParameterServer::post_pulls() {
  Pulls p;
  for (int s = 0; s < options_.servers; ++s) {
    p.headers.push_back(zeros({2}, kInt64, Device::cpu()));
    p.works.push_back(group_->irecv(p.headers.back(), s, kPullHeader));
    int64_t n = 0;
    for (size_t i : vars_of_[static_cast<size_t>(s)]) n += params_[i].numel();
    p.flats.push_back(n > 0 ? empty({n}, params_[0].dtype(), params_[0].device()) : Tensor());
    if (n > 0) p.works.push_back(group_->irecv(p.flats.back(), s, kPullData));
  }
  return p;
}

void ParameterServer::take_pulls(Pulls& p, bool record) {
  for (auto& w : p.works) w->wait();
  for (int s = 0; s < options_.servers; ++s) {
    const auto h = p.headers[static_cast<size_t>(s)].to_vector<int64_t>();
    if (record && options_.dynamic_batches > 0) pulls_.push_back({held_ / workers(), h[0], h[0], s, held_});
    else if (record) pulls_.push_back({clock_, h[1], h[0], s});
    int64_t at = 0;
    for (size_t i : vars_of_[static_cast<size_t>(s)]) {
      Tensor(params_[i]).copy_(p.flats[static_cast<size_t>(s)].narrow(0, at, params_[i].numel()).view(params_[i].shape()));
      at += params_[i].numel();
    }
  }
}

// Sends every server the header {a, b} and the gradients of its variables, flat.
void ParameterServer::push_gradients(int64_t a, int64_t b, std::vector<WorkPtr>& sends, std::vector<Tensor>& keep) {
  for (int s = 0; s < options_.servers; ++s) {
    std::vector<Tensor> grads;
    for (size_t i : vars_of_[static_cast<size_t>(s)]) {
      const Tensor g = params_[i].grad();
      grads.push_back(g.defined() ? g.reshape({g.numel()}) : zeros({params_[i].numel()}, params_[i].dtype(),
                                                                  params_[i].device()));
    }
    Tensor header = tensor(std::vector<int64_t>{a, b}, {2}, Device::cpu());
    sends.push_back(group_->isend(header, s, kPushHeader));
    keep.push_back(header);
    if (grads.empty()) continue;
    Tensor flat = concat(grads, 0).contiguous();
    sends.push_back(group_->isend(flat, s, kPushData));
    keep.push_back(flat);
  }
}

void ParameterServer::push_pull() {
  BRAID_CHECK(!is_server(), "ParameterServer::push_pull: rank ", rank_, " is a server; call serve() there");
  BRAID_CHECK(options_.dynamic_batches == 0,
              "ParameterServer::push_pull: with dynamic batches a worker calls next_batch() instead (rank ", rank_, ")");
  NoGradGuard no_grad;
  ++clock_;
  Pulls pulls = post_pulls();
  std::vector<WorkPtr> sends;
  std::vector<Tensor> keep;
  push_gradients(clock_, 0, sends, keep);
  take_pulls(pulls, true);
  for (auto& w : sends) w->wait();
}

int64_t ParameterServer::next_batch(bool stop) {
  BRAID_CHECK(!is_server(), "ParameterServer::next_batch: rank ", rank_, " is a server; call serve() there");
  BRAID_CHECK(options_.dynamic_batches > 0,
              "ParameterServer::next_batch: needs dynamic_batches > 0; with shards call push_pull() (rank ", rank_, ")");
  NoGradGuard no_grad;
  std::vector<WorkPtr> sends;
  std::vector<Tensor> keep;
  if (held_ >= 0) push_gradients(kPush, held_, sends, keep), ++clock_;
  Tensor claimed = zeros({2}, kInt64, Device::cpu());
  WorkPtr got = group_->irecv(claimed, 0, kClaimed);
  send_header(0, kClaim, stop ? 1 : 0, kPushHeader);
  got->wait();
  held_ = claimed.to_vector<int64_t>()[0];
  if (held_ < 0) handed_out_ = claimed.to_vector<int64_t>()[1];
  if (held_ >= 0) {
    // Server 0 answers the claim with the variables as soon as they are fresh enough; the others
    // are told the batch.
    Pulls pulls = post_pulls();
    for (int s = 1; s < options_.servers; ++s) send_header(s, kPull, held_, kPushHeader);
    take_pulls(pulls, true);
  }
  for (auto& w : sends) w->wait();
  return held_;
}

void ParameterServer::finish() {
  BRAID_CHECK(!is_server(), "ParameterServer::finish: rank ", rank_, " is a server");
  BRAID_CHECK(options_.dynamic_batches == 0 || held_ < 0, "ParameterServer::finish: rank ", rank_, " still holds batch ",
              held_, "; call next_batch() until it returns -1");
  NoGradGuard no_grad;
  Pulls pulls = post_pulls();
  for (int s = 0; s < options_.servers; ++s) send_header(s, -1, 0, kPushHeader);
  take_pulls(pulls, false);
}

void ParameterServer::serve() {
  BRAID_CHECK(is_server(), "ParameterServer::serve: rank ", rank_, " is a worker; call push_pull() there");
  NoGradGuard no_grad;
  ServerState& st = *server_;
  const int W = workers();
  st.clock.assign(static_cast<size_t>(W), 0);
  st.done.assign(static_cast<size_t>(W), false), st.owed.assign(static_cast<size_t>(W), false);
  st.headers.assign(static_cast<size_t>(W), Tensor()), st.posted.assign(static_cast<size_t>(W), nullptr);
  for (int w = 0; w < W; ++w) post_header(w);
  if (options_.dynamic_batches > 0) serve_claims();
  else if (options_.staleness == 0) {
    // Rounds: each worker still training pushes once; the sum in worker order, averaged, one step.
    while (!st.all_done()) {
      Tensor sum;
      int pushed = 0;
      std::vector<int> contributors;
      for (int w = 0; w < W; ++w) {
        if (st.done[static_cast<size_t>(w)]) continue;
        st.posted[static_cast<size_t>(w)]->wait();
        if (header_of(w)[0] < 0) {
          st.done[static_cast<size_t>(w)] = true;
          continue;
        }
        Tensor g = receive_gradient(w);
        sum = sum.defined() ? sum + g : g;
        ++pushed, ++st.clock[static_cast<size_t>(w)];
        contributors.push_back(w);
        post_header(w);
      }
      if (pushed == 0) break;
      step_with(sum * (1.0 / pushed));
      for (int w : contributors) answer(w, st.version, st.slowest());
    }
  } else {
    while (!st.all_done() || st.any_owed()) {
      bool progressed = false;
      for (int w = 0; w < W; ++w) {
        if (st.done[static_cast<size_t>(w)] || !st.posted[static_cast<size_t>(w)]->is_completed()) continue;
        st.posted[static_cast<size_t>(w)]->wait();
        progressed = true;
        if (header_of(w)[0] < 0) {
          st.done[static_cast<size_t>(w)] = true;
          continue;
        }
        step_with(receive_gradient(w) * (1.0 / W));
        ++st.clock[static_cast<size_t>(w)];
        st.owed[static_cast<size_t>(w)] = true;
        post_header(w);
      }
      // Answer every worker that is at most `staleness` steps ahead of the slowest still training.
      for (int w = 0; w < W; ++w) {
        if (!st.owed[static_cast<size_t>(w)]) continue;
        if (options_.staleness > 0 && st.clock[static_cast<size_t>(w)] - st.slowest() > options_.staleness) continue;
        answer(w, st.version, st.slowest());
        st.owed[static_cast<size_t>(w)] = false;
        progressed = true;
      }
      if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  for (int w = 0; w < W; ++w) answer(w, st.version, st.slowest());  // the final variables, to every worker in finish()
}

// Note [Claimed batches]: the server's side.
void ParameterServer::serve_claims() {
  ServerState& st = *server_;
  const int W = workers();
  int64_t T = options_.dynamic_batches;
  BRAID_CHECK(options_.first_batch >= 0 && options_.first_batch % W == 0 && options_.first_batch <= T,
              "ParameterServer: first_batch ", options_.first_batch, " must be a whole number of rounds of ", W,
              " batches within the ", T, " batches");
  int64_t next = options_.first_batch;  // server 0: the next batch to hand out
  st.version = options_.first_batch / W;
  std::map<int64_t, std::vector<Tensor>> rounds;  // gradients of rounds not yet applied, by batch slot
  std::vector<int64_t> wants(static_cast<size_t>(W), -1);  // the batch a worker waits on variables for
  auto size_of = [&](int64_t r) { return std::min<int64_t>(W, T - r * W); };
  auto complete = [&](int64_t r) {
    auto it = rounds.find(r);
    if (it == rounds.end()) return false;
    return std::count_if(it->second.begin(), it->second.end(), [](const Tensor& g) { return g.defined(); }) == size_of(r);
  };
  while (!st.all_done() || std::any_of(wants.begin(), wants.end(), [](int64_t b) { return b >= 0; })) {
    bool progressed = false;
    for (int w = 0; w < W; ++w) {
      if (st.done[static_cast<size_t>(w)] || !st.posted[static_cast<size_t>(w)]->is_completed()) continue;
      st.posted[static_cast<size_t>(w)]->wait();
      progressed = true;
      const auto h = header_of(w);
      if (h[0] < 0) {
        st.done[static_cast<size_t>(w)] = true;
        continue;
      }
      if (h[0] == kPush) {
        BRAID_CHECK(h[1] >= 0 && h[1] < T && (options_.staleness < 0 || h[1] >= st.version * W), "ParameterServer: worker ", w, " pushed batch ", h[1],
                    ", outside the rounds still open (", st.version, " applied of ", T, " batches)");
        Tensor g = receive_gradient(w);
        ++st.clock[static_cast<size_t>(w)];
        if (options_.staleness < 0) {
          step_with(g * (1.0 / W));
        } else {
          auto& slots = rounds[h[1] / W];
          slots.resize(static_cast<size_t>(W));
          slots[static_cast<size_t>(h[1] % W)] = g;
          for (; complete(st.version); rounds.erase(st.version - 1)) {
            const auto& done = rounds[st.version];
            Tensor sum = done[0];
            for (int64_t i = 1; i < size_of(st.version); ++i) sum = sum + done[static_cast<size_t>(i)];
            step_with(sum * (1.0 / static_cast<double>(size_of(st.version))));
          }
        }
      } else if (h[0] == kClaim) {
        if (h[1] == 1) T = std::min(T, (next + W - 1) / W * W);  // a stop: finish the round begun
        const int64_t b = next < T ? next++ : -1;
        group_->send(tensor(std::vector<int64_t>{b, T}, {2}, Device::cpu()), options_.servers + w, kClaimed);
        wants[static_cast<size_t>(w)] = b;
      } else {
        wants[static_cast<size_t>(w)] = h[1];
      }
      post_header(w);
    }
    for (int w = 0; w < W; ++w) {
      const int64_t b = wants[static_cast<size_t>(w)];
      if (b < 0 || (options_.staleness >= 0 && b / W - options_.staleness > st.version)) continue;
      answer(w, st.version, b);
      wants[static_cast<size_t>(w)] = -1;
      progressed = true;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  BRAID_CHECK(rounds.empty() || options_.staleness < 0, "ParameterServer: the workers finished with ", rounds.size(),
              " round(s) incomplete, from round ", rounds.begin()->first, " (every worker must call next_batch() until -1)");
}

std::vector<int64_t> ParameterServer::header_of(int w) const {
  return server_->headers[static_cast<size_t>(w)].to_vector<int64_t>();
}

void ParameterServer::post_header(int w) {
  server_->headers[static_cast<size_t>(w)] = zeros({2}, kInt64, Device::cpu());
  server_->posted[static_cast<size_t>(w)] =
      group_->irecv(server_->headers[static_cast<size_t>(w)], options_.servers + w, kPushHeader);
}

Tensor ParameterServer::receive_gradient(int w) {
  Tensor flat = empty({server_->numel}, params_[0].dtype(), params_[0].device());
  if (server_->numel > 0) group_->recv(flat, options_.servers + w, kPushData);
  return flat;
}

void ParameterServer::answer(int w, int64_t a, int64_t b) {
  send_header(options_.servers + w, a, b, kPullHeader);
  if (server_->numel == 0) return;
  std::vector<Tensor> flat;
  for (const Tensor& v : server_->vars) flat.push_back(v.reshape({v.numel()}));
  group_->send(concat(flat, 0).contiguous(), options_.servers + w, kPullData);
}

void ParameterServer::step_with(const Tensor& grad) {
  ServerState& st = *server_;
  ++st.version;
  if (st.numel == 0) return;
  int64_t at = 0;
  for (Tensor v : st.vars) {
    v.set_grad(grad.narrow(0, at, v.numel()).view(v.shape()).clone());
    at += v.numel();
  }
  st.optimizer->step();
  if (on_step_) on_step_(*st.optimizer);
}

}  // namespace braid::distributed
