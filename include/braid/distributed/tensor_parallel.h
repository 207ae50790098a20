// Tensor parallelism (Megatron-LM's layout, arXiv 1909.08053) and sequence parallelism (arXiv
// 2205.05198): layers that hold one rank's share of a weight, the differentiable collectives that
// join the shares, and parallelize_module, which swaps named layers of a model for their parallel
// forms in place. Parameter names stay those of the serial layers, so a rank's state dict is its
// shard of the serial one under the same keys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "braid/distributed/process_group.h"
#include "braid/nn/attention.h"
#include "braid/nn/layers.h"

namespace braid::distributed {

// Note [Tensor-parallel regions]
// Megatron's f and g: a column-parallel layer needs its input whole on every rank, and what flows
// back into that input from each rank is only that rank's share of the gradient, so it enters
// through copy_to_tp (identity forward, all-reduce backward); a row-parallel layer leaves each rank
// with a partial sum, so it exits through reduce_from_tp (all-reduce forward, identity backward).
// A Transformer layer therefore costs two all-reduces of its activations (L, N, E) forward and two
// backward. With sequence parallelism the activations between the blocks are cut along the
// sequence axis instead of repeated, and each all-reduce becomes the two halves it is made of: an
// all-gather along the sequence before the column-parallel layer (reduce-scatter backward) and a
// reduce-scatter after the row-parallel one (all-gather backward). The volume on the wire is the
// same (a ring all-reduce is a reduce-scatter plus an all-gather); what changes is that LayerNorm,
// dropout and the residual run on 1/tp of the sequence. benchmarks/README.md has the formulas and
// the counts the tests measure.
//
// Dropout draws from each rank's generator. In replicated regions (between the blocks, without
// sequence parallelism) every rank must drop the same elements, so the ranks' generators must be
// in the same state, as after manual_seed with one seed. Inside a block (attention over a rank's
// heads, the feed-forward's features) and on sequence shards the ranks then draw the same pattern
// for different elements: not the serial layer's draw, and correlated across ranks. Megatron keeps
// a second, per-rank seeded generator for those regions; braid does not yet, and the tests run
// with dropout 0.

/// Identity forward; all-reduce (sum) of the gradient backward: enters a column-parallel region.
Tensor copy_to_tp(const Tensor& x, const ProcessGroupPtr& group);
/// All-reduce (sum) forward; identity backward: leaves a row-parallel region.
Tensor reduce_from_tp(const Tensor& x, const ProcessGroupPtr& group);
/// The ranks' x concatenated along the last axis (all-gather); backward keeps this rank's slice.
Tensor gather_from_tp(const Tensor& x, const ProcessGroupPtr& group);
/// This rank's slice of x along the last axis (which the group's size must divide); backward
/// all-gathers the gradient.
Tensor scatter_to_tp(const Tensor& x, const ProcessGroupPtr& group);
/// The ranks' sequence shards concatenated along axis (all-gather); backward reduce-scatters the
/// gradient, since every rank's gradient of the whole sequence is a partial sum.
Tensor gather_from_sp(const Tensor& x, int64_t axis, const ProcessGroupPtr& group);
/// The sum over the ranks of x, of which this rank keeps its shard along axis (reduce-scatter);
/// backward all-gathers the gradient.
Tensor reduce_scatter_to_sp(const Tensor& x, int64_t axis, const ProcessGroupPtr& group);
/// This rank's shard of x along axis (which the group's size must divide); backward all-gathers.
Tensor scatter_to_sp(const Tensor& x, int64_t axis, const ProcessGroupPtr& group);

struct ColumnParallelLinearOptions {
  bool bias = true;
  /// Concatenate the ranks' outputs (all-gather) instead of leaving each rank its features.
  bool gather_output = false;
  /// The input is this rank's shard of the sequence along sequence_axis: all-gather it first.
  bool sequence_parallel = false;
  int64_t sequence_axis = 0;
};

/// y = x W^T + b with W's rows (output features) split over the group: weight (out / tp, in), bias
/// (out / tp). The output is this rank's out / tp features unless gather_output.
class ColumnParallelLinear : public nn::Module {
 public:
  /// This rank's shard of a new Linear(in_features, out_features) (Note [Initialising a shard] in
  /// distributed/tensor_parallel.cpp).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, ProcessGroupPtr group,
                       const ColumnParallelLinearOptions& options = {});
  /// This rank's shard of full's weight and bias (its dtype and device).
  ColumnParallelLinear(const nn::Linear& full, ProcessGroupPtr group, const ColumnParallelLinearOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const ProcessGroupPtr& group() const { return group_; }

 private:
  void check_split(int64_t out_features) const;
  int64_t in_, out_;
  ProcessGroupPtr group_;
  ColumnParallelLinearOptions options_;
  Tensor weight_, bias_;
};

struct RowParallelLinearOptions {
  bool bias = true;
  /// The input is already this rank's in / tp features (a column-parallel layer's output);
  /// otherwise the layer takes its slice of a whole input.
  bool input_is_parallel = true;
  /// Reduce-scatter the output along sequence_axis instead of all-reducing it.
  bool sequence_parallel = false;
  int64_t sequence_axis = 0;
};

/// y = x W^T + b with W's columns (input features) split over the group: weight (out, in / tp),
/// bias (out) whole, added once after the partial products are summed.
class RowParallelLinear : public nn::Module {
 public:
  /// This rank's shard of a new Linear(in_features, out_features) (Note [Initialising a shard]).
  RowParallelLinear(int64_t in_features, int64_t out_features, ProcessGroupPtr group,
                    const RowParallelLinearOptions& options = {});
  /// This rank's columns of full's weight, and its whole bias.
  RowParallelLinear(const nn::Linear& full, ProcessGroupPtr group, const RowParallelLinearOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const ProcessGroupPtr& group() const { return group_; }

 private:
  void check_split(int64_t in_features) const;
  int64_t in_, out_;
  ProcessGroupPtr group_;
  RowParallelLinearOptions options_;
  Tensor weight_, bias_;
};

struct VocabParallelEmbeddingOptions {
  /// Reduce-scatter the lookups along the output's sequence_axis instead of all-reducing them, so
  /// that each rank has its sequence shard (the entry to a sequence-parallel model).
  bool sequence_parallel = false;
  int64_t sequence_axis = 0;
};

/// An embedding whose vocabulary rows are split over the group: weight (V / tp, dim), rows
/// [r V / tp, (r + 1) V / tp) on rank r. Indices outside this rank's rows look up zeros, and the
/// all-reduce of the ranks' lookups gives every rank the whole result. padding_idx is not offered.
class VocabParallelEmbedding : public nn::Module {
 public:
  /// This rank's rows of a new Embedding (Note [Initialising a shard] in distributed/tensor_parallel.cpp).
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, ProcessGroupPtr group,
                         const VocabParallelEmbeddingOptions& options = {});
  VocabParallelEmbedding(const nn::Embedding& full, ProcessGroupPtr group,
                         const VocabParallelEmbeddingOptions& options = {});
  Tensor forward(const Tensor& indices) override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  /// The first vocabulary row this rank holds.
  int64_t vocab_start() const { return start_; }
  const ProcessGroupPtr& group() const { return group_; }

 private:
  void check_split();
  int64_t num_, dim_, start_ = 0;
  ProcessGroupPtr group_;
  VocabParallelEmbeddingOptions options_;
  Tensor weight_;
};

/// Cross-entropy of logits whose class axis (the last) is split over the group as a
/// column-parallel layer leaves it: (..., C / tp) on each rank, rank r holding classes
/// [r C / tp, (r + 1) C / tp). The row maxima, then the sums of exponentials with the target
/// logits, are all-reduced (two all-reduces, none backward; Note [Vocabulary-parallel
/// cross-entropy]); the logits are never gathered. target (...) holds class indices; ignore_index positions count for
/// nothing. reduction: "mean" (over counted positions), "sum" or "none". Equals nn::cross_entropy on the gathered
/// logits.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, const ProcessGroupPtr& group,
                                    int64_t ignore_index = -100, const std::string& reduction = "mean");

struct ParallelMultiheadAttentionOptions {
  /// Inputs are this rank's sequence shards along sequence_axis, and so is the output.
  bool sequence_parallel = false;
  /// Defaults to the sequence axis of the layout (0, or 1 with batch_first) when negative.
  int64_t sequence_axis = -1;
};

/// MultiheadAttention with its heads split over the group: in_proj_weight (3E / tp, E) holds this
/// rank's rows of W_q, W_k and W_v (in that order), in_proj_bias likewise, and out_proj is a
/// RowParallelLinear (weight (E, E / tp), bias (E)). The same names as MultiheadAttention's.
class ParallelMultiheadAttention : public nn::Module {
 public:
  ParallelMultiheadAttention(const nn::MultiheadAttention& full, ProcessGroupPtr group,
                             const ParallelMultiheadAttentionOptions& options = {});
  /// Self-attention.
  Tensor forward(const Tensor& x) override;
  /// As MultiheadAttention's (attn_mask (L, S) or (N * num_heads, L, S) of all heads).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 const Tensor& attn_mask = Tensor());
  std::string describe() const override;
  int64_t local_heads() const { return heads_; }
  const ProcessGroupPtr& group() const { return group_; }

 private:
  int64_t embed_dim_, num_heads_, heads_;
  double dropout_;
  bool batch_first_;
  Generator* gen_;
  ProcessGroupPtr group_;
  ParallelMultiheadAttentionOptions options_;
  Tensor in_proj_weight_, in_proj_bias_;
};

/// How parallelize_module splits a layer.
enum class ParallelStyle {
  Colwise,   ///< Linear -> ColumnParallelLinear, output left split
  Rowwise,   ///< Linear -> RowParallelLinear, input already split
  Headwise,  ///< MultiheadAttention -> ParallelMultiheadAttention
  Vocab,     ///< Embedding -> VocabParallelEmbedding
  Sequence,  ///< LayerNorm, Dropout, ...: kept; runs on a sequence shard, so its gradients are partial
};
const char* parallel_style_name(ParallelStyle style);

struct ParallelizeOptions {
  /// Sequence parallelism: Colwise layers all-gather their input along sequence_axis, Rowwise
  /// and Vocab layers reduce-scatter their output, so the model between them runs on sequence shards.
  bool sequence_parallel = false;
  int64_t sequence_axis = 0;
};

/// What parallelize_module did.
struct ParallelizeResult {
  /// The module paths replaced, in the plan's order.
  std::vector<std::string> replaced;
  /// Parameters every rank holds whole but whose gradient covers only this rank's sequence shard
  /// (Sequence-styled modules' and, with sequence parallelism, Rowwise biases): sum their
  /// gradients over the group after backward, with all_reduce_gradients.
  std::vector<Tensor> sequence_parallel_parameters;
};

/// Replaces the named descendants of module (dotted paths as named_modules gives them) in place
/// with their parallel forms holding this rank's shard of the existing weights, as PyTorch's
/// parallelize_module. A path that names no module is an IndexError listing the known ones, a
/// style that does not fit the module's type a TypeError, a split that is not even a ValueError.
/// A TransformerEncoderLayer whose self_attn is made Headwise calls it as forward(x): no masks.
ParallelizeResult parallelize_module(nn::Module& module, const ProcessGroupPtr& group,
                                     const std::vector<std::pair<std::string, ParallelStyle>>& plan,
                                     const ParallelizeOptions& options = {});

/// The serial model's state dict from a tensor-parallel one: the ranks' shards of every split
/// parameter gathered (one all-gather each), the rest as they are, under the same names, so that
/// the serial model's load_state_dict takes it (a checkpoint written by one rank, say). Every rank
/// of each tensor-parallel group calls it, like a collective.
nn::StateDict gather_state_dict(const nn::Module& module);

/// Sums the gradients of params over group in one all-reduce of a flat buffer per dtype.
/// Parameters without a gradient are skipped, so they must be the same ones on every rank.
void all_reduce_gradients(const std::vector<Tensor>& params, const ProcessGroupPtr& group);

}  // namespace braid::distributed
