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
#include "braid/distributed/parameter_server.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed {

namespace {
constexpr int kPushHeader = 7101, kPushData = 7102, kPullHeader = 7103, kPullData = 7104;
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
    if (record) pulls_.push_back({clock_, h[1], h[0], s});
    int64_t at = 0;
    for (size_t i : vars_of_[static_cast<size_t>(s)]) {
      Tensor(params_[i]).copy_(p.flats[static_cast<size_t>(s)].narrow(0, at, params_[i].numel()).view(params_[i].shape()));
      at += params_[i].numel();
    }
  }
}

void ParameterServer::push_pull() {
  BRAID_CHECK(!is_server(), "ParameterServer::push_pull: rank ", rank_, " is a server; call serve() there");
  NoGradGuard no_grad;
  ++clock_;
  Pulls pulls = post_pulls();
  std::vector<WorkPtr> sends;
  std::vector<Tensor> keep;
  for (int s = 0; s < options_.servers; ++s) {
    std::vector<Tensor> grads;
    for (size_t i : vars_of_[static_cast<size_t>(s)]) {
      const Tensor g = params_[i].grad();
      grads.push_back(g.defined() ? g.reshape({g.numel()}) : zeros({params_[i].numel()}, params_[i].dtype(),
                                                                  params_[i].device()));
    }
    Tensor header = tensor(std::vector<int64_t>{clock_, 0}, {2}, Device::cpu());
    sends.push_back(group_->isend(header, s, kPushHeader));
    keep.push_back(header);
    if (grads.empty()) continue;
    Tensor flat = concat(grads, 0).contiguous();
    sends.push_back(group_->isend(flat, s, kPushData));
    keep.push_back(flat);
  }
  take_pulls(pulls, true);
  for (auto& w : sends) w->wait();
}

void ParameterServer::finish() {
  BRAID_CHECK(!is_server(), "ParameterServer::finish: rank ", rank_, " is a server");
  NoGradGuard no_grad;
  Pulls pulls = post_pulls();
  for (int s = 0; s < options_.servers; ++s) send_header(s, -1, 0, kPushHeader);
  take_pulls(pulls, false);
}

void ParameterServer::serve() {
  BRAID_CHECK(is_server(), "ParameterServer::serve: rank ", rank_, " is a worker; call push_pull() there");
  NoGradGuard no_grad;
  ServerState& st = *server_;
  const int W = workers(), S = options_.servers;
  std::vector<int64_t> clock(static_cast<size_t>(W), 0);
  std::vector<bool> done(static_cast<size_t>(W), false), owed(static_cast<size_t>(W), false);
  std::vector<Tensor> headers(static_cast<size_t>(W));
  std::vector<WorkPtr> posted(static_cast<size_t>(W));
  auto post = [&](int w) {
    headers[static_cast<size_t>(w)] = zeros({2}, kInt64, Device::cpu());
    posted[static_cast<size_t>(w)] = group_->irecv(headers[static_cast<size_t>(w)], S + w, kPushHeader);
  };
  auto receive_gradient = [&](int w) {
    Tensor flat = empty({st.numel}, params_[0].dtype(), params_[0].device());
    if (st.numel > 0) group_->recv(flat, S + w, kPushData);
    return flat;
  };
  auto slowest = [&] {
    int64_t m = INT64_MAX;
    for (int w = 0; w < W; ++w)
      if (!done[static_cast<size_t>(w)]) m = std::min(m, clock[static_cast<size_t>(w)]);
    return m == INT64_MAX ? *std::max_element(clock.begin(), clock.end()) : m;
  };
  auto answer = [&](int w) {
    send_header(S + w, st.version, slowest(), kPullHeader);
    if (st.numel == 0) return;
    std::vector<Tensor> flat;
    for (const Tensor& v : st.vars) flat.push_back(v.reshape({v.numel()}));
    group_->send(concat(flat, 0).contiguous(), S + w, kPullData);
  };
  auto step_with = [&](const Tensor& grad) {
    if (st.numel == 0) return;
    int64_t at = 0;
    for (Tensor v : st.vars) {
      v.set_grad(grad.narrow(0, at, v.numel()).view(v.shape()).clone());
      at += v.numel();
    }
    st.optimizer->step();
    ++st.version;
    if (on_step_) on_step_(*st.optimizer);
  };
  for (int w = 0; w < W; ++w) post(w);
  auto all_done = [&] { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); };
  if (options_.staleness == 0) {
    // Rounds: each worker still training pushes once; the sum in worker order, averaged, one step.
    while (!all_done()) {
      Tensor sum;
      int pushed = 0;
      std::vector<int> contributors;
      for (int w = 0; w < W; ++w) {
        if (done[static_cast<size_t>(w)]) continue;
        posted[static_cast<size_t>(w)]->wait();
        if (headers[static_cast<size_t>(w)].to_vector<int64_t>()[0] < 0) {
          done[static_cast<size_t>(w)] = true;
          continue;
        }
        Tensor g = receive_gradient(w);
        sum = sum.defined() ? sum + g : g;
        ++pushed, ++clock[static_cast<size_t>(w)];
        contributors.push_back(w);
        post(w);
      }
      if (pushed == 0) break;
      step_with(sum * (1.0 / pushed));
      for (int w : contributors) answer(w);
    }
  } else {
    while (!all_done() || std::any_of(owed.begin(), owed.end(), [](bool o) { return o; })) {
      bool progressed = false;
      for (int w = 0; w < W; ++w) {
        if (done[static_cast<size_t>(w)] || !posted[static_cast<size_t>(w)]->is_completed()) continue;
        posted[static_cast<size_t>(w)]->wait();
        progressed = true;
        if (headers[static_cast<size_t>(w)].to_vector<int64_t>()[0] < 0) {
          done[static_cast<size_t>(w)] = true;
          continue;
        }
        step_with(receive_gradient(w) * (1.0 / W));
        ++clock[static_cast<size_t>(w)];
        owed[static_cast<size_t>(w)] = true;
        post(w);
      }
      // Answer every worker that is at most `staleness` steps ahead of the slowest still training.
      for (int w = 0; w < W; ++w) {
        if (!owed[static_cast<size_t>(w)]) continue;
        if (options_.staleness > 0 && clock[static_cast<size_t>(w)] - slowest() > options_.staleness) continue;
        answer(w);
        owed[static_cast<size_t>(w)] = false;
        progressed = true;
      }
      if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  for (int w = 0; w < W; ++w) answer(w);  // the final variables, to every worker in finish()
}

}  // namespace braid::distributed
