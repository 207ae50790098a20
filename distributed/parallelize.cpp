// Head-parallel MultiheadAttention and parallelize_module, which swaps a model's named layers for
// their tensor-parallel forms in place (PyTorch's parallelize_module with ColwiseParallel and
// RowwiseParallel), and the gradient sum that sequence-parallel parameters need after backward.
#include <cmath>
#include <limits>
#include <map>
#include <memory>

#include "braid/autograd.h"
#include "braid/distributed/tensor_parallel.h"
#include "braid/ops.h"

namespace braid::distributed {

namespace {

/// A bool mask (true = masked) as 0 / -inf, a float mask as it is, both in dtype (as MultiheadAttention).
Tensor additive_mask(const Tensor& mask, DType dtype, const char* name) {
  if (mask.dtype() == kBool)
    return where(mask, full({}, -std::numeric_limits<double>::infinity(), dtype, mask.device()),
                 zeros({}, dtype, mask.device()));
  BRAID_CHECK_T(TypeError, is_floating(mask.dtype()), "ParallelMultiheadAttention: ", name,
                " must be bool or floating-point, got ", dtype_name(mask.dtype()));
  return mask.to(dtype);
}

Tensor parameter(const nn::Module& m, const std::string& name) {
  for (auto& [n, t] : m.named_parameters(false))
    if (n == name) return t;
  return Tensor();
}

/// Rank r's rows of each of W_q, W_k and W_v stacked in in_proj_weight (3E, ...), in that order.
Tensor qkv_shard(const Tensor& full, int64_t rows, int rank) {
  std::vector<Tensor> parts;
  for (const Tensor& w : chunk(full.detach(), 3, 0)) parts.push_back(w.narrow(0, rank * rows, rows));
  return concat(parts, 0).contiguous().clone();
}

/// The ranks' t concatenated along axis.
Tensor concat_over_ranks(const Tensor& t, int64_t axis, ProcessGroup& group) {
  Tensor stacked = group.all_gather(t.detach().contiguous());  // (P, ...t)
  std::vector<Tensor> parts;
  for (int q = 0; q < group.size(); ++q) parts.push_back(stacked.select(0, q));
  return concat(parts, axis);
}

/// in_proj_* from the ranks' shards: W_q of every rank, then W_k, then W_v (qkv_shard's inverse).
Tensor concat_qkv_over_ranks(const Tensor& t, ProcessGroup& group) {
  Tensor stacked = group.all_gather(t.detach().contiguous());  // (P, 3 E / P, ...)
  const int64_t rows = t.size(0) / 3;
  std::vector<Tensor> parts;
  for (int j = 0; j < 3; ++j)
    for (int q = 0; q < group.size(); ++q) parts.push_back(stacked.select(0, q).narrow(0, j * rows, rows));
  return concat(parts, 0);
}

}  // namespace

ParallelMultiheadAttention::ParallelMultiheadAttention(const nn::MultiheadAttention& full, ProcessGroupPtr group,
                                                       const ParallelMultiheadAttentionOptions& options)
    : Module("ParallelMultiheadAttention"),
      embed_dim_(full.config().embed_dim),
      num_heads_(full.config().num_heads),
      dropout_(full.config().options.dropout),
      batch_first_(full.config().options.batch_first),
      gen_(full.config().options.generator),
      group_(group ? std::move(group) : world()),
      options_(options) {
  const int P = group_->size(), r = group_->rank();
  BRAID_CHECK(num_heads_ % P == 0, "ParallelMultiheadAttention: num_heads (", num_heads_,
              ") must be divisible by the tensor-parallel size (", P, ", group ", group_->name(),
              "); uneven splits of heads are not supported");
  heads_ = num_heads_ / P;
  const int64_t local = embed_dim_ / P;  // this rank's heads' features
  const int64_t layout_axis = batch_first_ ? 1 : 0;
  if (options_.sequence_axis < 0) options_.sequence_axis = layout_axis;
  BRAID_CHECK(!options_.sequence_parallel || options_.sequence_axis == layout_axis,
              "ParallelMultiheadAttention: ", "the sequence axis of a ", batch_first_ ? "batch_first " : "",
              "layout is ", layout_axis, ", got ", options_.sequence_axis);
  in_proj_weight_ = register_parameter("in_proj_weight", qkv_shard(parameter(full, "in_proj_weight"), local, r));
  if (Tensor b = parameter(full, "in_proj_bias"); b.defined())
    in_proj_bias_ = register_parameter("in_proj_bias", qkv_shard(b, local, r));
  auto out_proj = std::dynamic_pointer_cast<nn::Linear>(full.child("out_proj"));
  BRAID_CHECK_T(TypeError, out_proj != nullptr, "ParallelMultiheadAttention: out_proj must be a Linear");
  // Inside, the layout is (N, L, E) whatever the caller's: out_proj scatters the sequence on axis 1.
  register_module("out_proj", std::make_shared<RowParallelLinear>(
                                  *out_proj, group_,
                                  RowParallelLinearOptions{.input_is_parallel = true,
                                                           .sequence_parallel = options_.sequence_parallel,
                                                           .sequence_axis = 1}));
  if (!full.is_training()) eval();
}

Tensor ParallelMultiheadAttention::forward(const Tensor& x) { return forward(x, x, x); }

Tensor ParallelMultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                           const Tensor& key_padding_mask, const Tensor& attn_mask) {
  const int64_t E = embed_dim_, H = num_heads_, Hl = heads_, Dh = E / H, El = Hl * Dh;
  BRAID_CHECK(query.dim() == 2 || query.dim() == 3, "ParallelMultiheadAttention: expected a 3-d (batched) or 2-d ",
              "(unbatched) query, got shape ", shape_str(query.shape()));
  BRAID_CHECK(key.dim() == query.dim() && value.dim() == query.dim() && query.size(-1) == E && key.size(-1) == E &&
                  value.size(-1) == E,
              "ParallelMultiheadAttention: expected query, key and value of the same rank with ", E,
              " features (embed_dim), got shapes ", shape_str(query.shape()), ", ", shape_str(key.shape()), " and ",
              shape_str(value.shape()));
  const bool batched = query.dim() == 3;
  const int64_t seq_axis = batched ? options_.sequence_axis : 0;
  auto enter = [&](const Tensor& t) {
    return options_.sequence_parallel ? gather_from_sp(t, seq_axis, group_) : copy_to_tp(t, group_);
  };
  // One collective per distinct input, so that self-attention pays for one.
  const bool self = query.is_same(key) && key.is_same(value);
  Tensor q = enter(query);
  Tensor k = self ? q : enter(key);
  Tensor v = self ? q : value.is_same(key) ? k : enter(value);
  auto to_nle = [&](const Tensor& t) { return !batched ? t.unsqueeze(0) : batch_first_ ? t : t.transpose(0, 1); };
  q = to_nle(q), k = to_nle(k), v = to_nle(v);
  const int64_t N = q.size(0), L = q.size(1), S = k.size(1);
  BRAID_CHECK(k.size(0) == N && v.size(0) == N && v.size(1) == S, "ParallelMultiheadAttention: key and value must ",
              "match the query's batch size and each other's sequence length, got shapes ", shape_str(query.shape()),
              ", ", shape_str(key.shape()), " and ", shape_str(value.shape()));
  if (self) {
    std::vector<Tensor> qkv = chunk(nn::linear(q, in_proj_weight_, in_proj_bias_), 3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    std::vector<Tensor> w = chunk(in_proj_weight_, 3, 0), b(3);
    if (in_proj_bias_.defined()) b = chunk(in_proj_bias_, 3, 0);
    q = nn::linear(q, w[0], b[0]), k = nn::linear(k, w[1], b[1]), v = nn::linear(v, w[2], b[2]);
  }
  auto heads = [&](const Tensor& t, int64_t len) { return t.reshape({N, len, Hl, Dh}).permute({0, 2, 1, 3}); };
  Tensor scores = matmul(heads(q, L) * (1.0 / std::sqrt(static_cast<double>(Dh))), heads(k, S).mT());  // (N, Hl, L, S)
  if (attn_mask.defined()) {
    const bool ok = (attn_mask.dim() == 2 && attn_mask.shape() == Shape{L, S}) ||
                    (attn_mask.dim() == 3 && attn_mask.shape() == Shape{N * H, L, S});
    BRAID_CHECK(ok, "ParallelMultiheadAttention: attn_mask must have shape ", shape_str({L, S}), " or ",
                shape_str({N * H, L, S}), " (batch * num_heads, L, S), got ", shape_str(attn_mask.shape()));
    Tensor m = additive_mask(attn_mask, scores.dtype(), "attn_mask");
    if (m.dim() == 3) m = m.reshape({N, H, L, S}).narrow(1, group_->rank() * Hl, Hl);  // this rank's heads
    scores = scores + m;
  }
  if (key_padding_mask.defined()) {
    const Shape want = batched ? Shape{N, S} : Shape{S};
    BRAID_CHECK(key_padding_mask.shape() == want, "ParallelMultiheadAttention: key_padding_mask must have shape ",
                shape_str(want), " (batch, source length), got ", shape_str(key_padding_mask.shape()));
    scores = scores + additive_mask(key_padding_mask, scores.dtype(), "key_padding_mask").reshape({N, 1, 1, S});
  }
  Tensor attn = nn::dropout(softmax(scores, -1), dropout_, is_training(), gen_);
  Tensor out = matmul(attn, heads(v, S)).permute({0, 2, 1, 3}).reshape({N, L, El});
  out = child("out_proj")->forward(out);  // (N, L, E), or (N, L / tp, E) with sequence parallelism
  if (!batched) return out.squeeze(0);
  return batch_first_ ? out : out.transpose(0, 1);
}

std::string ParallelMultiheadAttention::describe() const {
  return detail::cat("ParallelMultiheadAttention(embed_dim=", embed_dim_, ", num_heads=", num_heads_, " (", heads_,
                     " on this rank), dropout=", dropout_, ", batch_first=", batch_first_ ? "True" : "False",
                     ", sequence_parallel=", options_.sequence_parallel ? "True" : "False", ", group=", group_->name(),
                     ")");
}

const char* parallel_style_name(ParallelStyle style) {
  switch (style) {
    case ParallelStyle::Colwise:
      return "Colwise";
    case ParallelStyle::Rowwise:
      return "Rowwise";
    case ParallelStyle::Headwise:
      return "Headwise";
    case ParallelStyle::Vocab:
      return "Vocab";
    case ParallelStyle::Sequence:
      return "Sequence";
  }
  return "?";
}

ParallelizeResult parallelize_module(nn::Module& module, const ProcessGroupPtr& group,
                                     const std::vector<std::pair<std::string, ParallelStyle>>& plan,
                                     const ParallelizeOptions& options) {
  BRAID_CHECK(group != nullptr, "parallelize_module: the group is null");
  const bool sp = options.sequence_parallel;
  ParallelizeResult result;
  for (const auto& [path, style] : plan) {
    nn::ModulePtr old;
    std::string known;
    for (auto& [p, m] : module.named_modules("", /*include_self=*/false)) {
      if (p == path) old = m;
      known += (known.empty() ? "" : ", ") + p;
    }
    BRAID_CHECK_T(IndexError, old != nullptr, "parallelize_module: unknown module '", path,
                  "'; known: ", known.empty() ? "(none)" : known);
    auto wrong = [&](const char* needs) {
      return detail::cat("parallelize_module: '", path, "' is a ", old->type_name(), ", but style ",
                         parallel_style_name(style), " needs a ", needs);
    };
    nn::ModulePtr made;
    switch (style) {
      case ParallelStyle::Colwise: {
        auto lin = std::dynamic_pointer_cast<nn::Linear>(old);
        BRAID_CHECK_T(TypeError, lin != nullptr, wrong("Linear"));
        made = std::make_shared<ColumnParallelLinear>(
            *lin, group, ColumnParallelLinearOptions{.sequence_parallel = sp, .sequence_axis = options.sequence_axis});
        break;
      }
      case ParallelStyle::Rowwise: {
        auto lin = std::dynamic_pointer_cast<nn::Linear>(old);
        BRAID_CHECK_T(TypeError, lin != nullptr, wrong("Linear"));
        auto row = std::make_shared<RowParallelLinear>(
            *lin, group, RowParallelLinearOptions{.sequence_parallel = sp, .sequence_axis = options.sequence_axis});
        if (sp && row->bias().defined()) result.sequence_parallel_parameters.push_back(row->bias());
        made = row;
        break;
      }
      case ParallelStyle::Headwise: {
        auto mha = std::dynamic_pointer_cast<nn::MultiheadAttention>(old);
        BRAID_CHECK_T(TypeError, mha != nullptr, wrong("MultiheadAttention"));
        auto attn = std::make_shared<ParallelMultiheadAttention>(
            *mha, group,
            ParallelMultiheadAttentionOptions{.sequence_parallel = sp, .sequence_axis = options.sequence_axis});
        auto out_proj = std::dynamic_pointer_cast<RowParallelLinear>(attn->child("out_proj"));
        if (sp && out_proj->bias().defined()) result.sequence_parallel_parameters.push_back(out_proj->bias());
        made = attn;
        break;
      }
      case ParallelStyle::Vocab: {
        auto emb = std::dynamic_pointer_cast<nn::Embedding>(old);
        BRAID_CHECK_T(TypeError, emb != nullptr, wrong("Embedding"));
        made = std::make_shared<VocabParallelEmbedding>(
            *emb, group,
            VocabParallelEmbeddingOptions{.sequence_parallel = sp, .sequence_axis = options.sequence_axis});
        break;
      }
      case ParallelStyle::Sequence:
        BRAID_CHECK(
            sp, "parallelize_module: '", path, "' has style Sequence, which needs ",
            "options.sequence_parallel (without it the module sees every position and its gradients are whole)");
        for (const Tensor& p : old->parameters()) result.sequence_parallel_parameters.push_back(p);
        break;
    }
    if (made == nullptr) continue;  // Sequence: the module stays as it is
    if (!old->is_training()) made->eval();
    module.replace_child(path, made);
    result.replaced.push_back(path);
  }
  return result;
}

nn::StateDict gather_state_dict(const nn::Module& module) {
  nn::StateDict state = module.state_dict();
  auto visit = [&state](const std::string& path, const nn::Module& m) {
    const std::string prefix = path.empty() ? "" : path + ".";
    auto gather = [&](const char* name, const ProcessGroupPtr& group, int64_t axis) {
      auto it = state.find(prefix + name);
      if (it == state.end()) return;  // no bias
      it->second = axis < 0 ? concat_qkv_over_ranks(it->second, *group) : concat_over_ranks(it->second, axis, *group);
    };
    if (auto c = dynamic_cast<const ColumnParallelLinear*>(&m)) {
      gather("weight", c->group(), 0);
      gather("bias", c->group(), 0);
    } else if (auto r = dynamic_cast<const RowParallelLinear*>(&m)) {
      gather("weight", r->group(), 1);
    } else if (auto e = dynamic_cast<const VocabParallelEmbedding*>(&m)) {
      gather("weight", e->group(), 0);
    } else if (auto a = dynamic_cast<const ParallelMultiheadAttention*>(&m)) {
      gather("in_proj_weight", a->group(), -1);
      gather("in_proj_bias", a->group(), -1);
    }
  };
  visit("", module);
  for (auto& [path, m] : module.named_modules("", /*include_self=*/false)) visit(path, *m);
  return state;
}

void all_reduce_gradients(const std::vector<Tensor>& params, const ProcessGroupPtr& group) {
  BRAID_CHECK(group != nullptr, "all_reduce_gradients: the group is null");
  // One flat buffer per dtype, in the order of params (the same on every rank).
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (const Tensor& p : params)
    if (p.grad().defined()) by_dtype[p.grad().dtype()].push_back(p.grad());
  NoGradGuard no_grad;
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<Tensor> flat;
    for (const Tensor& g : grads) flat.push_back(g.reshape({-1}));
    Tensor buffer = concat(flat, 0).contiguous();
    group->all_reduce(buffer, ReduceOp::Sum);
    int64_t offset = 0;
    for (Tensor g : grads) {
      g.copy_(buffer.narrow(0, offset, g.numel()).reshape(g.shape()));
      offset += g.numel();
    }
  }
}

}  // namespace braid::distributed
