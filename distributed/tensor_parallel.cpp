// Tensor-parallel layers (column- and row-parallel Linear, vocabulary-parallel Embedding,
// head-parallel MultiheadAttention) and parallelize_module. The layers are forward ops around the
// collectives of tensor_parallel_ops.cpp, so autograd derives their backward.
#include <limits>
#include <memory>
#include <sstream>

#include "braid/autograd.h"
#include "braid/distributed/tensor_parallel.h"
#include "braid/ops.h"

namespace braid::distributed {

namespace {

/// Rank r's `length` rows (axis 0) or columns (axis 1) of a serial layer's tensor, as a new tensor.
Tensor shard_of(const Tensor& full, int64_t axis, int64_t length, int rank) {
  return full.detach().narrow(axis, rank * length, length).contiguous().clone();
}

ProcessGroupPtr or_world(ProcessGroupPtr group) { return group ? std::move(group) : world(); }

void check_even(const char* layer, const char* what, int64_t n, const ProcessGroup& group) {
  BRAID_CHECK(n % group.size() == 0, layer, ": ", what, " (", n, ") must be divisible by the tensor-parallel size (",
              group.size(), ", group ", group.name(), "); uneven splits are not supported");
}

}  // namespace

// ---- ColumnParallelLinear ----

// Note [Initialising a shard]
// A layer made from sizes builds the serial layer and keeps its shard, so that ranks seeded alike
// (manual_seed) hold the pieces of one serial initialisation, the serial layer's own. Initialising
// each shard by itself would give every rank the same values, a weight of repeated blocks. The
// whole weight exists for a moment on each rank; a layer larger than that is loaded from shards.
ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, ProcessGroupPtr group,
                                           const ColumnParallelLinearOptions& options)
    : ColumnParallelLinear(nn::Linear(in_features, out_features, options.bias), std::move(group), options) {}

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, ProcessGroupPtr group,
                                           const ColumnParallelLinearOptions& options)
    : Module("ColumnParallelLinear"),
      in_(full.config().in_features),
      out_(full.config().out_features),
      group_(or_world(std::move(group))),
      options_(options) {
  check_split(out_);
  options_.bias = full.bias().defined();
  const int64_t local = out_ / group_->size();
  weight_ = register_parameter("weight", shard_of(full.weight(), 0, local, group_->rank()));
  if (options_.bias) bias_ = register_parameter("bias", shard_of(full.bias(), 0, local, group_->rank()));
}

void ColumnParallelLinear::check_split(int64_t out_features) const {
  check_even("ColumnParallelLinear", "out_features", out_features, *group_);
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  BRAID_CHECK(x.dim() >= 1 && x.size(-1) == in_, "ColumnParallelLinear: expected input with last dimension ", in_,
              " (in_features), got shape ", shape_str(x.shape()));
  Tensor in = options_.sequence_parallel ? gather_from_sp(x, options_.sequence_axis, group_) : copy_to_tp(x, group_);
  Tensor y = nn::linear(in, weight_, bias_);
  return options_.gather_output ? gather_from_tp(y, group_) : y;
}

std::string ColumnParallelLinear::describe() const {
  return detail::cat("ColumnParallelLinear(in_features=", in_, ", out_features=", out_, " (", out_ / group_->size(),
                     " on this rank), bias=", bias_.defined() ? "True" : "False",
                     ", gather_output=", options_.gather_output ? "True" : "False",
                     ", sequence_parallel=", options_.sequence_parallel ? "True" : "False", ", group=", group_->name(),
                     ")");
}

// ---- RowParallelLinear ----

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, ProcessGroupPtr group,
                                     const RowParallelLinearOptions& options)
    : RowParallelLinear(nn::Linear(in_features, out_features, options.bias), std::move(group), options) {}

RowParallelLinear::RowParallelLinear(const nn::Linear& full, ProcessGroupPtr group,
                                     const RowParallelLinearOptions& options)
    : Module("RowParallelLinear"),
      in_(full.config().in_features),
      out_(full.config().out_features),
      group_(or_world(std::move(group))),
      options_(options) {
  check_split(in_);
  options_.bias = full.bias().defined();
  weight_ = register_parameter("weight", shard_of(full.weight(), 1, in_ / group_->size(), group_->rank()));
  if (options_.bias) bias_ = register_parameter("bias", full.bias().detach().clone());
}

void RowParallelLinear::check_split(int64_t in_features) const {
  check_even("RowParallelLinear", "in_features", in_features, *group_);
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  const int64_t local = in_ / group_->size();
  const int64_t want = options_.input_is_parallel ? local : in_;
  BRAID_CHECK(x.dim() >= 1 && x.size(-1) == want, "RowParallelLinear: expected input with last dimension ", want,
              options_.input_is_parallel ? " (this rank's share of in_features)" : " (in_features)", ", got shape ",
              shape_str(x.shape()));
  Tensor in = options_.input_is_parallel ? x : scatter_to_tp(x, group_);
  Tensor y = nn::linear(in, weight_);
  y = options_.sequence_parallel ? reduce_scatter_to_sp(y, options_.sequence_axis, group_) : reduce_from_tp(y, group_);
  return bias_.defined() ? y + bias_ : y;  // once, after the sum
}

std::string RowParallelLinear::describe() const {
  return detail::cat("RowParallelLinear(in_features=", in_, " (", in_ / group_->size(),
                     " on this rank), out_features=", out_, ", bias=", bias_.defined() ? "True" : "False",
                     ", input_is_parallel=", options_.input_is_parallel ? "True" : "False",
                     ", sequence_parallel=", options_.sequence_parallel ? "True" : "False", ", group=", group_->name(),
                     ")");
}

// ---- VocabParallelEmbedding ----

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, ProcessGroupPtr group,
                                               const VocabParallelEmbeddingOptions& options)
    : VocabParallelEmbedding(nn::Embedding(num_embeddings, embedding_dim), std::move(group), options) {}

VocabParallelEmbedding::VocabParallelEmbedding(const nn::Embedding& full, ProcessGroupPtr group,
                                               const VocabParallelEmbeddingOptions& options)
    : Module("VocabParallelEmbedding"),
      num_(full.config().num_embeddings),
      dim_(full.config().embedding_dim),
      group_(or_world(std::move(group))),
      options_(options) {
  BRAID_CHECK(!full.config().padding_idx.has_value(), "VocabParallelEmbedding: an Embedding with padding_idx (",
              *full.config().padding_idx, ") is not supported");
  check_split();
  weight_ = register_parameter("weight", shard_of(full.weight(), 0, num_ / group_->size(), group_->rank()));
}

void VocabParallelEmbedding::check_split() {
  check_even("VocabParallelEmbedding", "num_embeddings", num_, *group_);
  start_ = group_->rank() * (num_ / group_->size());
}

Tensor VocabParallelEmbedding::forward(const Tensor& indices) {
  BRAID_CHECK_T(TypeError, indices.dtype() == kInt64 || indices.dtype() == kInt32,
                "VocabParallelEmbedding: indices must be int64 or int32, got ", dtype_name(indices.dtype()));
  if (indices.numel() > 0) {
    const int64_t lo = static_cast<int64_t>(amin(indices).item()), hi = static_cast<int64_t>(amax(indices).item());
    BRAID_CHECK_T(IndexError, lo >= 0 && hi < num_, "VocabParallelEmbedding: index ", lo < 0 ? lo : hi,
                  " is out of range for ", num_, " embeddings (indices of shape ", shape_str(indices.shape()), ")");
  }
  const Device dev = indices.device();
  const int64_t rows = weight_.size(0);
  Tensor local = indices.to(kInt64).reshape({-1});
  local = local - scalar_like(local, static_cast<double>(start_));
  Tensor mine =
      logical_and(ge(local, zeros({}, kInt64, dev)), lt(local, full({}, static_cast<double>(rows), kInt64, dev)));
  Tensor found = index_select(weight_, 0, where(mine, local, zeros({}, kInt64, dev)));
  found = where(mine.unsqueeze(-1), found, zeros({}, found.dtype(), dev));  // rows other ranks hold
  Shape out = indices.shape();
  out.push_back(dim_);
  if (options_.sequence_parallel) return reduce_scatter_to_sp(found.reshape(out), options_.sequence_axis, group_);
  return reduce_from_tp(found, group_).reshape(out);
}

std::string VocabParallelEmbedding::describe() const {
  return detail::cat("VocabParallelEmbedding(", num_, ", ", dim_, ", rows [", start_, ", ", start_ + weight_.size(0),
                     ") on this rank, group=", group_->name(), ")");
}

}  // namespace braid::distributed
