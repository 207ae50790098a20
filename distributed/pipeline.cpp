// PipelineStage::train_step: one interpreter loop over the schedule's actions for this stage.
//
// Note [Stage boundary messages]
// What crosses a cut for a micro-batch (StageBoundary: the activation and any skip tensors carried
// past the cut) travels as one header message (how many tensors; each one's name, dtype and shape)
// and then one message per tensor, so that stages need not know each other's shapes in advance.
// Every receive a stage's schedule will need is posted as soon as the step starts (its header), and
// between actions the stage checks which headers have arrived and posts their data receives at
// once, so that transfers proceed while the stage computes instead of when the schedule reaches
// the receive. Tags: each (micro-batch, direction) owns kTagStride tags, the header's first.
#include "braid/distributed/pipeline.h"

#include <chrono>
#include <cstring>
#include <map>
#include <optional>

#include "braid/autograd.h"
#include "braid/nn/skip.h"
#include "braid/ops.h"
#include "braid/random.h"
#include "braid/storage.h"

namespace braid::distributed {

namespace {
constexpr int64_t kMaxDims = 8;
constexpr int64_t kMaxTensors = 32;  // activation + skip tensors crossing one cut
constexpr int64_t kNameWords = 6;    // names of up to 48 bytes
constexpr int64_t kPerTensor = 2 + kMaxDims + 1 + kNameWords;
constexpr int64_t kHeaderWords = 1 + kMaxTensors * kPerTensor;
constexpr int kTagStride = static_cast<int>(kMaxTensors) + 1;
constexpr int kMaxMicroBatches = 32767 / (2 * kTagStride) - 1;
constexpr int kInferenceMicro = kMaxMicroBatches;  // PipelineStage::forward's messages
// The first tag of micro-batch m's activation (which = 0) or gradient (which = 1).
int tag_of(int micro, int which) { return (2 * micro + which) * kTagStride; }

}  // namespace

struct PipelineStage::Incoming {
  int from = 0, tag = 0;
  Tensor header;
  WorkPtr header_work;
  bool data_posted = false;
  StageBoundary boundary;
  std::vector<WorkPtr> data_work;
};

Grid make_grid(int pipeline_stages, ProcessGroupPtr world_group) {
  ProcessGroupPtr w = world_group ? std::move(world_group) : world();
  BRAID_CHECK(pipeline_stages >= 1 && w->size() % pipeline_stages == 0, "make_grid: ", w->size(),
              " ranks do not divide into pipelines of ", pipeline_stages, " stages");
  Grid g;
  g.replica = w->rank() / pipeline_stages;
  g.stage = w->rank() % pipeline_stages;
  g.pipeline = w->split(g.replica, g.stage);
  g.data = w->split(g.stage, g.replica);
  return g;
}

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, ProcessGroupPtr group, const PipelineOptions& options)
    : module_(std::move(module)), group_(group ? std::move(group) : world()), options_(options) {
  BRAID_CHECK(module_ != nullptr, "PipelineStage: the module is null");
}

void PipelineStage::send_boundary(const StageBoundary& b, int to, int tag) {
  BRAID_CHECK(static_cast<int64_t>(b.tensors.size()) <= kMaxTensors, "PipelineStage (stage ", stage(), "): ",
              b.tensors.size(), " tensors would cross to stage ", to, " (the activation and ", b.tensors.size() - 1,
              " skip tensors); at most ", kMaxTensors, " can");
  Tensor header = zeros({kHeaderWords}, kInt64);
  auto* h = header.data<int64_t>();
  h[0] = static_cast<int64_t>(b.tensors.size());
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    const Tensor& t = b.tensors[i];
    const std::string& name = b.names[i];
    BRAID_CHECK(t.dim() <= kMaxDims, "PipelineStage (stage ", stage(), "): a tensor crossing stages may have at most ",
                kMaxDims, " axes, '", name, "' has shape ", shape_str(t.shape()));
    BRAID_CHECK(static_cast<int64_t>(name.size()) <= 8 * kNameWords, "PipelineStage: the skip name '", name,
                "' is longer than ", 8 * kNameWords, " bytes");
    int64_t* e = h + 1 + static_cast<int64_t>(i) * kPerTensor;
    e[0] = static_cast<int64_t>(t.dtype());
    e[1] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) e[2 + d] = t.size(d);
    e[2 + kMaxDims] = static_cast<int64_t>(name.size());
    std::memcpy(e + 3 + kMaxDims, name.data(), name.size());
  }
  // Sends that have completed give their buffers back, so that an activation lives no longer than
  // its transfer.
  for (size_t i = 0; i < pending_sends_.size();) {
    if (pending_sends_[i]->is_completed()) {
      pending_sends_[i]->wait();
      pending_sends_.erase(pending_sends_.begin() + static_cast<long>(i));
      send_buffers_.erase(send_buffers_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  pending_sends_.push_back(group_->isend(header, to, tag));
  send_buffers_.push_back(header);
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    Tensor data = b.tensors[i].contiguous();
    pending_sends_.push_back(group_->isend(data, to, tag + 1 + static_cast<int>(i)));
    send_buffers_.push_back(data);
  }
}

std::shared_ptr<PipelineStage::Incoming> PipelineStage::post_receive(int from, int tag) {
  auto in = std::make_shared<Incoming>();
  in->from = from;
  in->tag = tag;
  in->header = zeros({kHeaderWords}, kInt64);
  in->header_work = group_->irecv(in->header, from, tag);
  return in;
}

void PipelineStage::post_data(Incoming& in) {
  in.header_work->wait();
  const auto* h = in.header.data<int64_t>();
  BRAID_ASSERT(h[0] >= 1 && h[0] <= kMaxTensors, "PipelineStage: a boundary header from stage ", in.from,
               " announces ", h[0], " tensors");
  for (int64_t i = 0; i < h[0]; ++i) {
    const int64_t* e = h + 1 + i * kPerTensor;
    BRAID_ASSERT(e[1] >= 0 && e[1] <= kMaxDims && e[2 + kMaxDims] >= 0 && e[2 + kMaxDims] <= 8 * kNameWords,
                 "PipelineStage: a malformed boundary header from stage ", in.from);
    Shape shape(static_cast<size_t>(e[1]));
    for (int64_t d = 0; d < e[1]; ++d) shape[static_cast<size_t>(d)] = e[2 + d];
    Tensor t = empty(shape, static_cast<DType>(e[0]), module_->device());
    in.boundary.names.emplace_back(reinterpret_cast<const char*>(e + 3 + kMaxDims), static_cast<size_t>(e[2 + kMaxDims]));
    in.data_work.push_back(group_->irecv(t, in.from, in.tag + 1 + static_cast<int>(i)));
    in.boundary.tensors.push_back(std::move(t));
  }
  in.data_posted = true;
}

StageBoundary PipelineStage::finish_receive(Incoming& in) {
  if (!in.data_posted) post_data(in);
  for (auto& w : in.data_work) w->wait();
  in.data_work.clear();
  return std::move(in.boundary);
}

void PipelineStage::progress(std::vector<std::shared_ptr<Incoming>>& pending) {
  // Headers that have arrived get their data receives posted now.
  for (auto& in : pending)
    if (!in->data_posted && in->header_work->is_completed()) post_data(*in);
}

StageBoundary PipelineStage::run_module(const StageBoundary& in) {
  std::map<std::string, Tensor> carried;
  for (size_t i = 1; i < in.tensors.size(); ++i) carried[in.names[i]] = in.tensors[i];
  nn::SkipScope scope(std::move(carried));
  StageBoundary out{{""}, {module_->forward(in.tensors.at(0))}};
  if (stage() == stages() - 1) {
    BRAID_CHECK(scope.tensors().empty(), "PipelineStage (last stage ", stage(), "): the model ended with ",
                scope.tensors().size(), " stashed skip tensor(s) never used, e.g. '", scope.tensors().begin()->first,
                "'; every SkipStash needs a later SkipAdd or SkipConcat");
  }
  for (auto& [name, t] : scope.tensors()) {
    out.names.push_back(name);
    out.tensors.push_back(t);
  }
  return out;
}

double PipelineStage::train_step(const PipeSchedule& schedule, const Tensor& input, const Tensor& target,
                                 const PipeLoss& loss) {
  const int s = stage(), k = stages(), m_count = schedule.micro_batches;
  BRAID_CHECK(schedule.stages == k, "PipelineStage: schedule '", schedule.name, "' is for ", schedule.stages,
              " stages, the group has ", k, " ranks");
  BRAID_CHECK_T(NotImplementedError, schedule.chunks == 1, "PipelineStage: schedule '", schedule.name, "' has ",
                schedule.chunks, " model chunks per stage, which train_step does not run yet");
  BRAID_CHECK(m_count >= 1 && m_count <= kMaxMicroBatches, "PipelineStage: schedule '", schedule.name, "' has ",
              m_count, " micro-batches; 1 to ", kMaxMicroBatches, " are supported");
  const bool first = s == 0, last = s == k - 1;
  auto split = [&](const Tensor& t, int m, const char* what) {
    BRAID_CHECK(t.defined() && t.dim() >= 1 && t.size(0) % m_count == 0, "PipelineStage: the ", what,
                " (shape ", t.defined() ? shape_str(t.shape()) : "undefined", ") must split into ", m_count,
                " equal micro-batches along axis 0");
    const int64_t b = t.size(0) / m_count;
    return t.narrow(0, m * b, b);
  };
  const size_t mc = static_cast<size_t>(m_count);
  std::vector<StageBoundary> inputs(mc), outputs(mc), grads(mc);
  // With recomputation, the default generator's state at each micro-batch's forward, replayed when
  // backward runs that forward again.
  std::vector<std::pair<uint64_t, uint64_t>> rng_state(mc);
  double loss_sum = 0;
  // The forward of micro-batch m with autograd recording: the stage's outputs, or on the last stage
  // the micro-batch's share of the loss.
  auto run_forward = [&](int m) {
    StageBoundary out = run_module(inputs[static_cast<size_t>(m)]);
    if (last) out.tensors[0] = loss(out.tensors[0], split(target, m, "target")) * (1.0 / m_count);
    return out;
  };
  const auto& actions = schedule.actions.at(static_cast<size_t>(s));
  size_t last_backward = 0;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == PipeAction::Kind::Backward) last_backward = i;
  // Note [Timeline clock]
  // Events carry steady-clock times, which all processes of one node share, so that the gathered
  // timeline shows real causality (a stage's forward starts after its predecessor's ends);
  // gather_timeline() subtracts the earliest start. Across nodes the clocks are not aligned.
  group_->barrier();
  // Every receive of the step is posted now (Note [Stage boundary messages]).
  std::vector<std::shared_ptr<Incoming>> incoming_act(mc), incoming_grad(mc), pending;
  for (const PipeAction& a : actions) {
    if (a.kind == PipeAction::Kind::RecvActivation)
      pending.push_back(incoming_act[static_cast<size_t>(a.micro)] = post_receive(s - 1, tag_of(a.micro, 0)));
    else if (a.kind == PipeAction::Kind::RecvGrad)
      pending.push_back(incoming_grad[static_cast<size_t>(a.micro)] = post_receive(s + 1, tag_of(a.micro, 1)));
  }
  auto since = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  events_.clear();
  const Device dev = module_->device();  // the stage's activations live on its parameters' device
  const int64_t base_bytes = memory_allocated(dev);
  peak_bytes_ = 0;
  auto note_memory = [&] { peak_bytes_ = std::max(peak_bytes_, memory_allocated(dev) - base_bytes); };
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    progress(pending);
    events_.push_back({s, a, since(), 0});
    const size_t m = static_cast<size_t>(std::max(a.micro, 0));
    switch (a.kind) {
      case PipeAction::Kind::RecvActivation: {
        BRAID_CHECK(incoming_act[m] != nullptr, "PipelineStage: no receive posted for ", a.str());
        inputs[m] = finish_receive(*incoming_act[m]);
        std::erase(pending, incoming_act[m]);
        incoming_act[m] = nullptr;
        for (Tensor& t : inputs[m].tensors)
          if (is_floating(t.dtype())) t.set_requires_grad(true);
        break;
      }
      case PipeAction::Kind::Forward: {
        if (first) inputs[m] = StageBoundary{{""}, {split(input, a.micro, "input")}};
        StageBoundary out;
        if (options_.recompute) {
          const Generator& g = default_generator();
          rng_state[m] = {g.seed(), g.offset()};
          NoGradGuard no_grad;  // keep only the input; backward runs the forward again
          out = run_forward(a.micro);
        } else {
          out = run_forward(a.micro);
        }
        if (last) loss_sum += out.tensors[0].item();
        outputs[m] = std::move(out);  // with recomputation: sent below, then dropped
        note_memory();
        break;
      }
      case PipeAction::Kind::SendActivation: {
        StageBoundary detached = outputs[m];
        for (Tensor& t : detached.tensors) t = t.detach();
        send_boundary(detached, s + 1, tag_of(a.micro, 0));
        if (options_.recompute) outputs[m] = StageBoundary();
        break;
      }
      case PipeAction::Kind::RecvGrad:
        BRAID_CHECK(incoming_grad[m] != nullptr, "PipelineStage: no receive posted for ", a.str());
        grads[m] = finish_receive(*incoming_grad[m]);
        std::erase(pending, incoming_grad[m]);
        incoming_grad[m] = nullptr;
        break;
      case PipeAction::Kind::Backward: {
        if (options_.recompute) {
          Generator& g = default_generator();
          const std::pair<uint64_t, uint64_t> now{g.seed(), g.offset()};
          g.set_state(rng_state[m].first, rng_state[m].second);
          outputs[m] = run_forward(a.micro);
          g.set_state(now.first, now.second);
        }
        note_memory();
        // With data parallelism, only the stage's last backward of the mini-batch all-reduces.
        std::optional<DistributedDataParallel::NoSync> no_sync;
        if (options_.data_parallel && i != last_backward) no_sync.emplace(*options_.data_parallel);
        if (last) {
          outputs[m].tensors[0].backward();
        } else {
          BRAID_CHECK(grads[m].tensors.size() == outputs[m].tensors.size(), "PipelineStage (stage ", s,
                      "): stage ", s + 1, " returned ", grads[m].tensors.size(), " gradients for micro-batch ", a.micro,
                      ", this stage sent ", outputs[m].tensors.size(), " tensors");
          std::vector<Tensor> roots, root_grads;
          for (size_t t = 0; t < outputs[m].tensors.size(); ++t) {
            if (!outputs[m].tensors[t].requires_grad()) continue;
            roots.push_back(outputs[m].tensors[t]);
            root_grads.push_back(grads[m].tensors[t]);
          }
          backward(roots, root_grads);
        }
        outputs[m] = StageBoundary();  // the graph of micro-batch m is freed here, as 1F1B intends
        grads[m] = StageBoundary();
        break;
      }
      case PipeAction::Kind::SendGrad: {
        StageBoundary g{inputs[m].names, {}};
        for (const Tensor& t : inputs[m].tensors) g.tensors.push_back(t.grad().defined() ? t.grad() : zeros_like(t));
        send_boundary(g, s - 1, tag_of(a.micro, 1));
        inputs[m] = StageBoundary();
        break;
      }
      case PipeAction::Kind::Update:
        break;  // the caller steps its optimizer after train_step
      case PipeAction::Kind::BackwardInput:
      case PipeAction::Kind::BackwardWeight:
        throw NotImplementedError(::braid::detail::cat("PipelineStage: schedule '", schedule.name, "' splits the ",
                                                       "backward (", a.str(), "), which train_step does not run yet"));
    }
    events_.back().end = since();
  }
  BRAID_CHECK(pending.empty(), "PipelineStage (stage ", s, "): schedule '", schedule.name,
              "' left a receive unused");
  for (auto& w : pending_sends_) w->wait();
  pending_sends_.clear();
  send_buffers_.clear();
  Tensor l = full({1}, loss_sum, kFloat64);
  group_->broadcast(l, k - 1);
  return l.item();
}

Tensor PipelineStage::forward(const Tensor& input) {
  NoGradGuard no_grad;
  const int s = stage(), k = stages();
  StageBoundary in;
  if (s == 0) in = StageBoundary{{""}, {input}};
  else in = finish_receive(*post_receive(s - 1, tag_of(kInferenceMicro, 0)));
  StageBoundary out = run_module(in);
  if (s == k - 1) return out.tensors[0];
  send_boundary(out, s + 1, tag_of(kInferenceMicro, 0));
  for (auto& w : pending_sends_) w->wait();
  pending_sends_.clear();
  send_buffers_.clear();
  return Tensor();
}

PipeTimeline PipelineStage::gather_timeline() {
  // Each stage's events as rows (stage, kind, micro, start, end), padded to the longest list.
  Tensor count = full({1}, static_cast<double>(events_.size()), kInt64);
  const auto counts = group_->all_gather(count).to_vector<int64_t>();
  int64_t longest = 0;
  for (int64_t c : counts) longest = std::max(longest, c);
  Tensor rows = zeros({std::max<int64_t>(longest, 1), 5}, kFloat64);
  auto* r = rows.data<double>();
  for (size_t i = 0; i < events_.size(); ++i) {
    const PipeEvent& e = events_[i];
    r[5 * i + 0] = e.stage;
    r[5 * i + 1] = static_cast<double>(e.action.kind);
    r[5 * i + 2] = e.action.micro;
    r[5 * i + 3] = e.start;
    r[5 * i + 4] = e.end;
  }
  const auto all = group_->all_gather(rows).to_vector<double>();
  PipeTimeline t;
  t.stages = group_->size();
  double busy = 0;
  for (int s = 0; s < t.stages; ++s) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(s)]; ++i) {
      const double* x = &all[static_cast<size_t>((s * std::max<int64_t>(longest, 1) + i) * 5)];
      PipeEvent e{static_cast<int>(x[0]), {static_cast<PipeAction::Kind>(static_cast<int>(x[1])), static_cast<int>(x[2])},
                  x[3], x[4]};
      t.makespan = std::max(t.makespan, e.end);
      if (e.action.kind == PipeAction::Kind::Forward || e.action.kind == PipeAction::Kind::Backward)
        busy += e.end - e.start;
      t.events.push_back(e);
    }
  }
  double zero = t.events.empty() ? 0.0 : t.events.front().start;
  for (const PipeEvent& e : t.events) zero = std::min(zero, e.start);
  t.makespan = 0;
  for (PipeEvent& e : t.events) {
    e.start -= zero;
    e.end -= zero;
    t.makespan = std::max(t.makespan, e.end);
  }
  t.bubble_fraction = t.makespan > 0 ? 1.0 - busy / (t.stages * t.makespan) : 0.0;
  return t;
}

}  // namespace braid::distributed
