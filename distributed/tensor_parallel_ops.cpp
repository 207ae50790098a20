// The differentiable collectives of tensor and sequence parallelism (Note [Tensor-parallel
// regions] in tensor_parallel.h) and the vocabulary-parallel cross-entropy built from them. Each
// collective is a new primitive for autograd: its forward is one call on the group and its backward
// the dual call, recorded with detail::record as all_reduce_sum is.
#include <string>
#include <vector>

#include "autograd/function.h"
#include "braid/autograd.h"
#include "braid/distributed/tensor_parallel.h"
#include "braid/ops.h"

namespace braid::distributed {

namespace {

const ProcessGroupPtr& checked(const ProcessGroupPtr& group, const char* op) {
  BRAID_CHECK(group != nullptr, op, ": the group is null");
  return group;
}

int64_t axis_of(const Tensor& x, int64_t axis, const char* op) {
  const int64_t d = x.dim();
  BRAID_CHECK_T(IndexError, d >= 1 && axis >= -d && axis < d, op, ": axis ", axis, " is out of range for shape ",
                shape_str(x.shape()));
  return axis < 0 ? axis + d : axis;
}

/// The ranks' x concatenated along axis (rank order).
Tensor all_gather_along(const Tensor& x, int64_t axis, ProcessGroup& group) {
  Tensor stacked = group.all_gather(x.contiguous());  // (P, ...x)
  if (group.size() == 1) return stacked.squeeze(0);
  std::vector<int64_t> order;
  for (int64_t d = 1; d <= axis; ++d) order.push_back(d);
  order.push_back(0);
  for (int64_t d = axis + 1; d <= x.dim(); ++d) order.push_back(d);
  Shape out = x.shape();
  out[static_cast<size_t>(axis)] *= group.size();
  return stacked.permute(order).contiguous().reshape(out);
}

void check_divisible(const Tensor& x, int64_t axis, const ProcessGroup& group, const char* op) {
  BRAID_CHECK(x.size(axis) % group.size() == 0, op, ": axis ", axis, " of shape ", shape_str(x.shape()),
              " must divide into ", group.size(), " equal parts, one per rank of ", group.name());
}

/// This rank's slice of x along axis.
Tensor shard_along(const Tensor& x, int64_t axis, const ProcessGroup& group) {
  const int64_t n = x.size(axis) / group.size();
  return x.narrow(axis, group.rank() * n, n).contiguous().clone();
}

/// The sum over the ranks of x, of which this rank keeps its slice along axis.
Tensor reduce_scatter_along(const Tensor& x, int64_t axis, ProcessGroup& group) {
  const int64_t P = group.size();
  Shape split = x.shape(), out = x.shape();
  const auto a = static_cast<size_t>(axis);
  out[a] /= P;
  split[a] = out[a];
  split.insert(split.begin() + static_cast<std::ptrdiff_t>(a), P);  // (..., P, n / P, ...)
  std::vector<int64_t> order{axis};
  for (int64_t d = 0; d < static_cast<int64_t>(split.size()); ++d)
    if (d != axis) order.push_back(d);
  Tensor parts = x.reshape(split).permute(order).contiguous().reshape({P, -1});
  return group.reduce_scatter(parts, ReduceOp::Sum).reshape(out);
}

}  // namespace

Tensor copy_to_tp(const Tensor& x, const ProcessGroupPtr& group) {
  checked(group, "copy_to_tp");
  return ::braid::detail::record("copy_to_tp", x.detach(), {x},
                                 [group](const Tensor& g, ::braid::detail::Grads& grads) {
                                   Tensor total = g.contiguous().clone();
                                   group->all_reduce(total, ReduceOp::Sum);
                                   grads.set(0, total);
                                 });
}

Tensor reduce_from_tp(const Tensor& x, const ProcessGroupPtr& group) {
  checked(group, "reduce_from_tp");
  Tensor out = x.detach().contiguous().clone();
  group->all_reduce(out, ReduceOp::Sum);
  return ::braid::detail::record("reduce_from_tp", out, {x},
                                 [](const Tensor& g, ::braid::detail::Grads& grads) { grads.set(0, g); });
}

Tensor gather_from_tp(const Tensor& x, const ProcessGroupPtr& group) {
  checked(group, "gather_from_tp");
  const int64_t axis = axis_of(x, -1, "gather_from_tp");
  Tensor out = all_gather_along(x.detach(), axis, *group);
  return ::braid::detail::record(
      "gather_from_tp", out, {x},
      [group, axis](const Tensor& g, ::braid::detail::Grads& grads) { grads.set(0, shard_along(g, axis, *group)); });
}

Tensor scatter_to_tp(const Tensor& x, const ProcessGroupPtr& group) {
  checked(group, "scatter_to_tp");
  const int64_t axis = axis_of(x, -1, "scatter_to_tp");
  check_divisible(x, axis, *group, "scatter_to_tp");
  Tensor out = shard_along(x.detach(), axis, *group);
  return ::braid::detail::record("scatter_to_tp", out, {x},
                                 [group, axis](const Tensor& g, ::braid::detail::Grads& grads) {
                                   grads.set(0, all_gather_along(g, axis, *group));
                                 });
}

Tensor gather_from_sp(const Tensor& x, int64_t axis, const ProcessGroupPtr& group) {
  checked(group, "gather_from_sp");
  axis = axis_of(x, axis, "gather_from_sp");
  Tensor out = all_gather_along(x.detach(), axis, *group);
  return ::braid::detail::record("gather_from_sp", out, {x},
                                 [group, axis](const Tensor& g, ::braid::detail::Grads& grads) {
                                   grads.set(0, reduce_scatter_along(g, axis, *group));
                                 });
}

Tensor reduce_scatter_to_sp(const Tensor& x, int64_t axis, const ProcessGroupPtr& group) {
  checked(group, "reduce_scatter_to_sp");
  axis = axis_of(x, axis, "reduce_scatter_to_sp");
  check_divisible(x, axis, *group, "reduce_scatter_to_sp");
  Tensor out = reduce_scatter_along(x.detach(), axis, *group);
  return ::braid::detail::record("reduce_scatter_to_sp", out, {x},
                                 [group, axis](const Tensor& g, ::braid::detail::Grads& grads) {
                                   grads.set(0, all_gather_along(g, axis, *group));
                                 });
}

Tensor scatter_to_sp(const Tensor& x, int64_t axis, const ProcessGroupPtr& group) {
  checked(group, "scatter_to_sp");
  axis = axis_of(x, axis, "scatter_to_sp");
  check_divisible(x, axis, *group, "scatter_to_sp");
  Tensor out = shard_along(x.detach(), axis, *group);
  return ::braid::detail::record("scatter_to_sp", out, {x},
                                 [group, axis](const Tensor& g, ::braid::detail::Grads& grads) {
                                   grads.set(0, all_gather_along(g, axis, *group));
                                 });
}

// Note [Vocabulary-parallel cross-entropy]
// loss = log(sum_c exp(z_c - m)) - (z_t - m) with m the row maximum. m is all-reduced (max)
// without a gradient: the loss does not depend on it, so its gradient would cancel. The sums of
// exponentials and the target logits (zero on the ranks that do not hold the target's class) go
// in one all-reduce of a stacked (2, ...) tensor through reduce_from_tp, whose backward is the
// identity: every rank computes the same loss from the summed values, so each rank's gradient of
// its own summand is the gradient of the sum.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, const ProcessGroupPtr& group,
                                    int64_t ignore_index, const std::string& reduction) {
  checked(group, "vocab_parallel_cross_entropy");
  BRAID_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none",
              "vocab_parallel_cross_entropy: unknown reduction '", reduction, "'; known: mean, sum, none");
  BRAID_CHECK_T(TypeError, is_floating(logits.dtype()),
                "vocab_parallel_cross_entropy: logits must be floating-point, got ", dtype_name(logits.dtype()));
  BRAID_CHECK_T(TypeError, target.dtype() == kInt64 || target.dtype() == kInt32,
                "vocab_parallel_cross_entropy: target must hold class indices (int64 or int32), got ",
                dtype_name(target.dtype()));
  Shape want = logits.shape();
  BRAID_CHECK(logits.dim() >= 1, "vocab_parallel_cross_entropy: logits must have a class axis, got a scalar");
  want.pop_back();
  BRAID_CHECK(target.shape() == want, "vocab_parallel_cross_entropy: target must have the logits' shape ",
              shape_str(logits.shape()), " without the class axis, i.e. ", shape_str(want), ", got ",
              shape_str(target.shape()));
  const int64_t classes = logits.size(-1), start = group->rank() * classes;
  const Device dev = logits.device();

  Tensor m = amax(logits.detach(), {-1}).contiguous().clone();
  group->all_reduce(m, ReduceOp::Max);
  Tensor z = logits - m.unsqueeze(-1);

  Tensor t = target.to(kInt64);
  Tensor local = t - scalar_like(t, static_cast<double>(start));
  Tensor mine =
      logical_and(ge(local, zeros({}, kInt64, dev)), lt(local, full({}, static_cast<double>(classes), kInt64, dev)));
  Tensor picked = gather(z, -1, where(mine, local, zeros({}, kInt64, dev)).unsqueeze(-1)).squeeze(-1);
  picked = where(mine, picked, zeros({}, picked.dtype(), dev));

  Tensor summed = reduce_from_tp(stack({sum(exp(z), {-1}), picked}, 0), group);
  std::vector<Tensor> parts = chunk(summed, 2, 0);
  Tensor loss = log(parts[0].squeeze(0)) - parts[1].squeeze(0);

  Tensor keep = ne(t, scalar_like(t, static_cast<double>(ignore_index)));
  loss = where(keep, loss, zeros({}, loss.dtype(), dev));
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  return sum(loss) * (1.0 / sum(keep.to(kFloat64)).item());
}

}  // namespace braid::distributed
