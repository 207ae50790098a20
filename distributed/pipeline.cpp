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

#include <algorithm>
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
// A slot is one (micro-batch, chunk) of a step, micro * chunks + chunk, counting the chunk of the
// virtual stage that receives; PipelineStage::forward's messages use the last slots.
constexpr int kSlots = 32767 / (2 * kTagStride);
int inference_slot(int chunk) { return kSlots - 1 - chunk; }
// The first tag of a slot's activation (which = 0) or gradient (which = 1).
int tag_of(int slot, int which) { return (2 * slot + which) * kTagStride; }

bool is_compute(PipeAction::Kind k) {
  return k == PipeAction::Kind::Forward || k == PipeAction::Kind::Backward || k == PipeAction::Kind::BackwardInput ||
         k == PipeAction::Kind::BackwardWeight;
}

}  // namespace

struct PipelineStage::Incoming {
  int from = 0, tag = 0;
  Tensor header;
  WorkPtr header_work;
  bool data_posted = false;
  StageBoundary boundary;
  std::vector<WorkPtr> data_work;
};

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, ProcessGroupPtr group, const PipelineOptions& options)
    : group_(group ? std::move(group) : world()), options_(options) {
  BRAID_CHECK(module != nullptr, "PipelineStage: the module is null");
  modules_.push_back(std::move(module));
}

void PipelineStage::add_chunk(std::shared_ptr<nn::Module> module) {
  BRAID_CHECK(module != nullptr, "PipelineStage::add_chunk: the module of chunk ", modules_.size(), " is null");
  BRAID_CHECK_T(TypeError, module->device() == modules_.front()->device(), "PipelineStage::add_chunk: chunk ",
                modules_.size(), " is on ", module->device().str(), ", chunk 0 on ", modules_.front()->device().str());
  modules_.push_back(std::move(module));
}

void PipelineStage::send_to(const StageBoundary& b, int to, int tag) {
  if (to == stage())
    own_mail_[tag] = b;  // a ring of one rank: chunk c feeds chunk c + 1 here
  else
    send_boundary(b, to, tag);
}

StageBoundary PipelineStage::take_own(int tag) {
  auto it = own_mail_.find(tag);
  BRAID_ASSERT(it != own_mail_.end(), "PipelineStage: nothing sent to this rank with tag ", tag);
  StageBoundary b = std::move(it->second);
  own_mail_.erase(it);
  return b;
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
    Tensor t = empty(shape, static_cast<DType>(e[0]), module().device());
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

StageBoundary PipelineStage::run_module(int chunk, const StageBoundary& in) {
  std::map<std::string, Tensor> carried;
  for (size_t i = 1; i < in.tensors.size(); ++i) carried[in.names[i]] = in.tensors[i];
  nn::SkipScope scope(std::move(carried));
  StageBoundary out{{""}, {chunk_module(chunk).forward(in.tensors.at(0))}};
  if (chunk == chunks() - 1 && stage() == stages() - 1) {
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

// Note [Interleaved and split-backward execution]
// Chunk c of this rank is virtual stage c K + s: its activation goes to rank s + 1, or from the
// last rank to rank 0's chunk c + 1, and its gradient back the same way. Per-step state is kept
// per slot (micro-batch, chunk), and a message's tag names the slot of the virtual stage that
// receives it, so that one pair of ranks can carry several chunks' messages at once. On a ring of
// one rank the chunks hand their boundaries over in memory. BackwardInput runs backward_input()
// to the stage's inputs, whose gradients SendGrad then sends, and keeps the rest for
// BackwardWeight. Each parameter's gradient is accumulated over micro-batches in the order its
// backwards (or W) run; every schedule here runs them in micro-batch order, so the gradients are
// 1F1B's bit for bit.
double PipelineStage::train_step(const PipeSchedule& schedule, const Tensor& input, const Tensor& target,
                                 const PipeLoss& loss) {
  const int s = stage(), k = stages(), v = chunks(), m_count = schedule.micro_batches;
  BRAID_CHECK(schedule.stages == k, "PipelineStage: schedule '", schedule.name, "' is for ", schedule.stages,
              " stages, the group has ", k, " ranks");
  BRAID_CHECK(schedule.chunks == v, "PipelineStage: schedule '", schedule.name, "' runs ", schedule.chunks,
              " model chunks per stage, this stage holds ", v);
  const int max_micro = kSlots / v - 1;
  BRAID_CHECK(m_count >= 1 && m_count <= max_micro, "PipelineStage: schedule '", schedule.name, "' has ", m_count,
              " micro-batches; 1 to ", max_micro, " are supported with ", v, " chunks per stage");
  const auto& actions = schedule.actions.at(static_cast<size_t>(s));
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const PipeAction& a) { return a.kind == PipeAction::Kind::BackwardInput; });
  // Data parallelism all-reduces during the stage's last backward, which must then produce every
  // parameter's gradient: not so with several chunks (it covers one) or a split backward.
  BRAID_CHECK_T(NotImplementedError, !((split || v > 1) && (options_.data_parallel || options_.sharded)),
                "PipelineStage: schedule '",
                schedule.name, "' ", split ? "splits the backward" : "runs several chunks per stage",
                ", which does not run with data parallelism (PipelineOptions::data_parallel) yet");
  const int last_vs = k * v - 1, next = (s + 1) % k, prev = (s + k - 1) % k;
  auto vstage = [&](int c) { return c * k + s; };
  auto slot = [&](int m, int c) { return m * v + c; };
  auto split_batch = [&](const Tensor& t, int m, const char* what) {
    BRAID_CHECK(t.defined() && t.dim() >= 1 && t.size(0) % m_count == 0, "PipelineStage: the ", what,
                " (shape ", t.defined() ? shape_str(t.shape()) : "undefined", ") must split into ", m_count,
                " equal micro-batches along axis 0");
    const int64_t b = t.size(0) / m_count;
    return t.narrow(0, m * b, b);
  };
  const size_t n = static_cast<size_t>(m_count * v);
  std::vector<StageBoundary> inputs(n), outputs(n), grads(n);
  std::vector<DeferredWeightGrads> weights(n);
  // With recomputation, the default generator's state at each forward, replayed when backward runs
  // that forward again.
  std::vector<std::pair<uint64_t, uint64_t>> rng_state(n);
  double loss_sum = 0;
  // The forward of micro-batch m through chunk c with autograd recording: the chunk's outputs, or
  // on the model's last piece the micro-batch's share of the loss.
  auto run_forward = [&](int m, int c) {
    StageBoundary out = run_module(c, inputs[static_cast<size_t>(slot(m, c))]);
    if (vstage(c) == last_vs) out.tensors[0] = loss(out.tensors[0], split_batch(target, m, "target")) * (1.0 / m_count);
    return out;
  };
  size_t last_backward = 0;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == PipeAction::Kind::Backward) last_backward = i;
  // Note [Timeline clock]
  // Events carry steady-clock times, which all processes of one node share, so that the gathered
  // timeline shows real causality (a stage's forward starts after its predecessor's ends);
  // gather_timeline() subtracts the earliest start. Across nodes the clocks are not aligned.
  group_->barrier();
  // Every receive of the step is posted now (Note [Stage boundary messages]).
  std::vector<std::shared_ptr<Incoming>> incoming_act(n), incoming_grad(n), pending;
  for (const PipeAction& a : actions) {
    const int i = slot(a.micro, a.chunk);
    if (a.kind == PipeAction::Kind::RecvActivation && prev != s)
      pending.push_back(incoming_act[static_cast<size_t>(i)] = post_receive(prev, tag_of(i, 0)));
    else if (a.kind == PipeAction::Kind::RecvGrad && next != s)
      pending.push_back(incoming_grad[static_cast<size_t>(i)] = post_receive(next, tag_of(i, 1)));
  }
  auto receive = [&](std::vector<std::shared_ptr<Incoming>>& incoming, size_t i, int which, const PipeAction& a) {
    if ((which == 0 ? prev : next) == s) return take_own(tag_of(static_cast<int>(i), which));
    BRAID_CHECK(incoming[i] != nullptr, "PipelineStage: no receive posted for ", a.str());
    StageBoundary b = finish_receive(*incoming[i]);
    std::erase(pending, incoming[i]);
    incoming[i] = nullptr;
    return b;
  };
  auto since = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  events_.clear();
  own_mail_.clear();
  const Device dev = module().device();  // the stage's activations live on its parameters' device
  const int64_t base_bytes = memory_allocated(dev);
  peak_bytes_ = 0;
  auto note_memory = [&] { peak_bytes_ = std::max(peak_bytes_, memory_allocated(dev) - base_bytes); };
  for (size_t ai = 0; ai < actions.size(); ++ai) {
    const PipeAction& a = actions[ai];
    progress(pending);
    events_.push_back({s, a, since(), 0});
    const int c = a.chunk;
    const size_t i = static_cast<size_t>(slot(std::max(a.micro, 0), c));
    switch (a.kind) {
      case PipeAction::Kind::RecvActivation: {
        inputs[i] = receive(incoming_act, i, 0, a);
        for (Tensor& t : inputs[i].tensors)
          if (is_floating(t.dtype())) t.set_requires_grad(true);
        break;
      }
      case PipeAction::Kind::Forward: {
        if (vstage(c) == 0) inputs[i] = StageBoundary{{""}, {split_batch(input, a.micro, "input")}};
        StageBoundary out;
        if (options_.recompute) {
          const Generator& g = default_generator();
          rng_state[i] = {g.seed(), g.offset()};
          NoGradGuard no_grad;  // keep only the input; backward runs the forward again
          out = run_forward(a.micro, c);
        } else {
          out = run_forward(a.micro, c);
        }
        if (vstage(c) == last_vs) loss_sum += out.tensors[0].item();
        outputs[i] = std::move(out);  // with recomputation: sent below, then dropped
        note_memory();
        break;
      }
      case PipeAction::Kind::SendActivation: {
        StageBoundary detached = outputs[i];
        for (Tensor& t : detached.tensors) t = t.detach();
        send_to(detached, next, tag_of(slot(a.micro, s == k - 1 ? c + 1 : c), 0));
        if (options_.recompute) outputs[i] = StageBoundary();
        break;
      }
      case PipeAction::Kind::RecvGrad:
        grads[i] = receive(incoming_grad, i, 1, a);
        break;
      case PipeAction::Kind::Backward:
      case PipeAction::Kind::BackwardInput: {
        if (options_.recompute) {
          Generator& g = default_generator();
          const std::pair<uint64_t, uint64_t> now{g.seed(), g.offset()};
          g.set_state(rng_state[i].first, rng_state[i].second);
          outputs[i] = run_forward(a.micro, c);
          g.set_state(now.first, now.second);
        }
        note_memory();
        std::vector<Tensor> roots, root_grads;
        if (vstage(c) == last_vs) {
          roots.push_back(outputs[i].tensors[0]);
        } else {
          BRAID_CHECK(grads[i].tensors.size() == outputs[i].tensors.size(), "PipelineStage (stage ", s,
                      "): the next virtual stage returned ", grads[i].tensors.size(), " gradients for ", a.str(),
                      ", this stage sent ", outputs[i].tensors.size(), " tensors");
          for (size_t t = 0; t < outputs[i].tensors.size(); ++t) {
            if (!outputs[i].tensors[t].requires_grad()) continue;
            roots.push_back(outputs[i].tensors[t]);
            root_grads.push_back(grads[i].tensors[t]);
          }
        }
        if (a.kind == PipeAction::Kind::BackwardInput) {
          std::vector<Tensor> xs;
          for (const Tensor& t : inputs[i].tensors)
            if (t.requires_grad()) xs.push_back(t);
          weights[i] = backward_input(roots, root_grads, xs);
        } else {
          // With data parallelism, only the stage's last backward of the mini-batch all-reduces.
          std::optional<DistributedDataParallel::NoSync> no_sync;
          std::optional<ShardedDataParallel::NoSync> no_sync_sharded;
          if (options_.data_parallel && ai != last_backward) no_sync.emplace(*options_.data_parallel);
          if (options_.sharded && ai != last_backward) no_sync_sharded.emplace(*options_.sharded);
          if (vstage(c) == last_vs)
            roots[0].backward();
          else
            backward(roots, root_grads);
        }
        outputs[i] = StageBoundary();  // the graph of micro-batch m is freed here, as 1F1B intends
        grads[i] = StageBoundary();
        break;
      }
      case PipeAction::Kind::BackwardWeight:
        weights[i].run();
        weights[i] = DeferredWeightGrads();
        break;
      case PipeAction::Kind::SendGrad: {
        StageBoundary g{inputs[i].names, {}};
        for (const Tensor& t : inputs[i].tensors) g.tensors.push_back(t.grad().defined() ? t.grad() : zeros_like(t));
        send_to(g, prev, tag_of(slot(a.micro, s == 0 ? c - 1 : c), 1));
        inputs[i] = StageBoundary();
        break;
      }
      case PipeAction::Kind::Update:
        break;  // the caller steps its optimizer after train_step
    }
    events_.back().end = since();
  }
  BRAID_CHECK(pending.empty() && own_mail_.empty(), "PipelineStage (stage ", s, "): schedule '", schedule.name,
              "' left a receive unused");
  for (auto& w : pending_sends_) w->wait();
  pending_sends_.clear();
  send_buffers_.clear();
  Tensor l = full({1}, loss_sum, kFloat64);
  group_->broadcast(l, last_vs % k);
  return l.item();
}

Tensor PipelineStage::forward(const Tensor& input) {
  NoGradGuard no_grad;
  const int s = stage(), k = stages(), v = chunks(), last_vs = k * v - 1;
  own_mail_.clear();
  Tensor result;
  for (int c = 0; c < v; ++c) {
    const int vs = c * k + s;
    StageBoundary in;
    const int tag = tag_of(inference_slot(c), 0);
    if (vs == 0)
      in = StageBoundary{{""}, {input}};
    else if (k == 1)
      in = take_own(tag);
    else
      in = finish_receive(*post_receive((s + k - 1) % k, tag));
    StageBoundary out = run_module(c, in);
    if (vs == last_vs) {
      result = out.tensors[0];
      break;
    }
    send_to(out, (s + 1) % k, tag_of(inference_slot(s == k - 1 ? c + 1 : c), 0));
  }
  for (auto& w : pending_sends_) w->wait();
  pending_sends_.clear();
  send_buffers_.clear();
  return result;
}

PipeTimeline PipelineStage::gather_timeline() {
  // Each stage's events as rows (stage, kind, micro, chunk, start, end), padded to the longest list.
  Tensor count = full({1}, static_cast<double>(events_.size()), kInt64);
  const auto counts = group_->all_gather(count).to_vector<int64_t>();
  int64_t longest = 0;
  for (int64_t c : counts) longest = std::max(longest, c);
  Tensor rows = zeros({std::max<int64_t>(longest, 1), 6}, kFloat64);
  auto* r = rows.data<double>();
  for (size_t i = 0; i < events_.size(); ++i) {
    const PipeEvent& e = events_[i];
    r[6 * i + 0] = e.stage;
    r[6 * i + 1] = static_cast<double>(e.action.kind);
    r[6 * i + 2] = e.action.micro;
    r[6 * i + 3] = e.action.chunk;
    r[6 * i + 4] = e.start;
    r[6 * i + 5] = e.end;
  }
  const auto all = group_->all_gather(rows).to_vector<double>();
  PipeTimeline t;
  t.stages = group_->size();
  double busy = 0;
  for (int s = 0; s < t.stages; ++s) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(s)]; ++i) {
      const double* x = &all[static_cast<size_t>((s * std::max<int64_t>(longest, 1) + i) * 6)];
      PipeEvent e{
          static_cast<int>(x[0]),
          {static_cast<PipeAction::Kind>(static_cast<int>(x[1])), static_cast<int>(x[2]), static_cast<int>(x[3])},
          x[4],
          x[5]};
      t.makespan = std::max(t.makespan, e.end);
      if (is_compute(e.action.kind)) busy += e.end - e.start;
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
