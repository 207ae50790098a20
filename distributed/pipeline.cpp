// PipelineStage::train_step: one interpreter loop over the schedule's actions for this stage. A
// tensor crosses a boundary as a small header (dtype and shape) and then its data, so that stages
// need not know each other's shapes in advance.
#include "braid/distributed/pipeline.h"

#include <chrono>
#include <optional>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "braid/storage.h"

namespace braid::distributed {

namespace {
constexpr int64_t kMaxDims = 8;
// Tags: four per micro-batch (activation header and data, gradient header and data).
int tag_of(int micro, int which) { return 4 * micro + which; }
}  // namespace

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

void PipelineStage::send_tensor(const Tensor& t, int to, int tag) {
  BRAID_CHECK(t.dim() <= kMaxDims, "PipelineStage: a tensor crossing stages may have at most ", kMaxDims,
              " axes, got shape ", shape_str(t.shape()));
  Tensor header = zeros({2 + kMaxDims}, kInt64);
  auto* h = header.data<int64_t>();
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
  Tensor data = t.contiguous();
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
  pending_sends_.push_back(group_->isend(header, to, 2 * tag));
  send_buffers_.push_back(header);
  pending_sends_.push_back(group_->isend(data, to, 2 * tag + 1));
  send_buffers_.push_back(data);
}

Tensor PipelineStage::recv_tensor(int from, int tag) {
  Tensor header = zeros({2 + kMaxDims}, kInt64);
  group_->recv(header, from, 2 * tag);
  const auto* h = header.data<int64_t>();
  Shape shape(static_cast<size_t>(h[1]));
  for (int64_t d = 0; d < h[1]; ++d) shape[static_cast<size_t>(d)] = h[2 + d];
  Tensor t = empty(shape, static_cast<DType>(h[0]));
  group_->recv(t, from, 2 * tag + 1);
  return t;
}

double PipelineStage::train_step(const PipeSchedule& schedule, const Tensor& input, const Tensor& target,
                                 const PipeLoss& loss) {
  const int s = stage(), k = stages(), m_count = schedule.micro_batches;
  BRAID_CHECK(schedule.stages == k, "PipelineStage: schedule '", schedule.name, "' is for ", schedule.stages,
              " stages, the group has ", k, " ranks");
  const bool first = s == 0, last = s == k - 1;
  auto split = [&](const Tensor& t, int m, const char* what) {
    BRAID_CHECK(t.defined() && t.dim() >= 1 && t.size(0) % m_count == 0, "PipelineStage: the ", what,
                " (shape ", t.defined() ? shape_str(t.shape()) : "undefined", ") must split into ", m_count,
                " equal micro-batches along axis 0");
    const int64_t b = t.size(0) / m_count;
    return t.narrow(0, m * b, b);
  };
  std::vector<Tensor> inputs(static_cast<size_t>(m_count)), outputs(static_cast<size_t>(m_count)),
      grads(static_cast<size_t>(m_count));
  double loss_sum = 0;
  // The forward of micro-batch m with autograd recording: the output, or on the last stage the
  // micro-batch's share of the loss.
  auto run_forward = [&](int m) {
    Tensor out = module_->forward(inputs[static_cast<size_t>(m)]);
    if (!last) return out;
    return loss(out, split(target, m, "target")) * (1.0 / m_count);
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
  auto since = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  events_.clear();
  const int64_t base_bytes = Storage::live_bytes();
  peak_bytes_ = 0;
  auto note_memory = [&] { peak_bytes_ = std::max(peak_bytes_, Storage::live_bytes() - base_bytes); };
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    events_.push_back({s, a, since(), 0});
    const size_t m = static_cast<size_t>(std::max(a.micro, 0));
    switch (a.kind) {
      case PipeAction::Kind::RecvActivation:
        inputs[m] = recv_tensor(s - 1, tag_of(a.micro, 0));
        inputs[m].set_requires_grad(true);
        break;
      case PipeAction::Kind::Forward: {
        if (first) inputs[m] = split(input, a.micro, "input");
        Tensor out;
        if (options_.recompute) {
          NoGradGuard no_grad;  // keep only the input; backward runs the forward again
          out = run_forward(a.micro);
        } else {
          out = run_forward(a.micro);
          outputs[m] = out;
        }
        if (last) loss_sum += out.item();
        else if (options_.recompute) outputs[m] = out;  // sent below, then dropped
        note_memory();
        break;
      }
      case PipeAction::Kind::SendActivation:
        send_tensor(outputs[m].detach(), s + 1, tag_of(a.micro, 0));
        if (options_.recompute) outputs[m] = Tensor();
        break;
      case PipeAction::Kind::RecvGrad:
        grads[m] = recv_tensor(s + 1, tag_of(a.micro, 1));
        break;
      case PipeAction::Kind::Backward: {
        if (options_.recompute) outputs[m] = run_forward(a.micro);
        note_memory();
        // With data parallelism, only the stage's last backward of the mini-batch all-reduces.
        std::optional<DistributedDataParallel::NoSync> no_sync;
        if (options_.data_parallel && i != last_backward) no_sync.emplace(*options_.data_parallel);
        if (last) outputs[m].backward();
        else outputs[m].backward(grads[m]);
        outputs[m] = Tensor();  // the graph of micro-batch m is freed here, as 1F1B intends
        grads[m] = Tensor();
        break;
      }
      case PipeAction::Kind::SendGrad:
        send_tensor(inputs[m].grad(), s - 1, tag_of(a.micro, 1));
        inputs[m] = Tensor();
        break;
      case PipeAction::Kind::Update:
        break;  // the caller steps its optimizer after train_step
    }
    events_.back().end = since();
  }
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
  constexpr int kInferenceTag = 8000;  // apart from train_step's 4 tags per micro-batch
  Tensor x = s == 0 ? input : recv_tensor(s - 1, kInferenceTag);
  Tensor out = module_->forward(x);
  if (s == k - 1) return out;
  send_tensor(out, s + 1, kInferenceTag);
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
