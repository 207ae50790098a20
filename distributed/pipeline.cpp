// PipelineStage::train_step: one interpreter loop over the schedule's actions for this stage. A
// tensor crosses a boundary as a small header (dtype and shape) and then its data, so that stages
// need not know each other's shapes in advance.
#include "braid/distributed/pipeline.h"

#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid::distributed {

namespace {
constexpr int64_t kMaxDims = 8;
// Tags: four per micro-batch (activation header and data, gradient header and data).
int tag_of(int micro, int which) { return 4 * micro + which; }
}  // namespace

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, ProcessGroupPtr group)
    : module_(std::move(module)), group_(group ? std::move(group) : world()) {
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
  pending_sends_.push_back(group_->isend(header, to, 2 * tag));
  pending_sends_.push_back(group_->isend(data, to, 2 * tag + 1));
  send_buffers_.push_back(header);
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
  for (const PipeAction& a : schedule.actions.at(static_cast<size_t>(s))) {
    const size_t m = static_cast<size_t>(std::max(a.micro, 0));
    switch (a.kind) {
      case PipeAction::Kind::RecvActivation:
        inputs[m] = recv_tensor(s - 1, tag_of(a.micro, 0));
        inputs[m].set_requires_grad(true);
        break;
      case PipeAction::Kind::Forward: {
        if (first) inputs[m] = split(input, a.micro, "input");
        Tensor out = module_->forward(inputs[m]);
        if (last) {
          Tensor l = loss(out, split(target, a.micro, "target")) * (1.0 / m_count);
          loss_sum += l.item();
          out = l;
        }
        outputs[m] = out;
        break;
      }
      case PipeAction::Kind::SendActivation:
        send_tensor(outputs[m].detach(), s + 1, tag_of(a.micro, 0));
        break;
      case PipeAction::Kind::RecvGrad:
        grads[m] = recv_tensor(s + 1, tag_of(a.micro, 1));
        break;
      case PipeAction::Kind::Backward:
        if (last) outputs[m].backward();
        else outputs[m].backward(grads[m]);
        outputs[m] = Tensor();  // the graph of micro-batch m is freed here, as 1F1B intends
        grads[m] = Tensor();
        break;
      case PipeAction::Kind::SendGrad:
        send_tensor(inputs[m].grad(), s - 1, tag_of(a.micro, 1));
        inputs[m] = Tensor();
        break;
      case PipeAction::Kind::Update:
        break;  // the caller steps its optimizer after train_step
    }
  }
  for (auto& w : pending_sends_) w->wait();
  pending_sends_.clear();
  send_buffers_.clear();
  Tensor l = full({1}, loss_sum, kFloat64);
  group_->broadcast(l, k - 1);
  return l.item();
}

}  // namespace braid::distributed
