// Embedding: a lookup of weight rows by integer index, composed of index_select so that the weight
// gradient (a scatter-add of the output gradient) comes from autograd. Initialised N(0, 1).
#include "braid/nn/init.h"
#include "braid/nn/layers.h"
#include "braid/ops.h"

namespace braid::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx)
    : Module("Embedding"), num_(num_embeddings), dim_(embedding_dim) {
  BRAID_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: num_embeddings and embedding_dim must be positive, "
              "got ", num_embeddings, " and ", embedding_dim);
  if (padding_idx) {
    BRAID_CHECK_T(IndexError, *padding_idx >= -num_ && *padding_idx < num_, "Embedding: padding_idx ", *padding_idx,
                  " is out of range for ", num_, " embeddings");
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_ : *padding_idx;
  }
  Tensor w = init::normal_(empty({num_, dim_}, kFloat32, default_device()));
  if (padding_idx_) init::zeros_(w.select(0, *padding_idx_));
  weight_ = register_parameter("weight", w);
}

// Note [Embedding padding_idx]
// PyTorch returns weight[padding_idx] like any row but gives it no gradient. Here the output rows
// at padding positions are replaced by their detached copies, so that index_select's backward
// scatters zeros into that row; the values stay the same.
Tensor Embedding::forward(const Tensor& indices) {
  BRAID_CHECK_T(TypeError, indices.dtype() == kInt64 || indices.dtype() == kInt32,
                "Embedding: indices must be int64 or int32, got ", dtype_name(indices.dtype()));
  if (indices.numel() > 0) {
    const int64_t lo = static_cast<int64_t>(amin(indices).item()), hi = static_cast<int64_t>(amax(indices).item());
    BRAID_CHECK_T(IndexError, lo >= 0 && hi < num_, "Embedding: index ", lo < 0 ? lo : hi, " is out of range for ",
                  num_, " embeddings (indices of shape ", shape_str(indices.shape()), ")");
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(dim_);
  Tensor rows = index_select(weight_, 0, indices.reshape({-1})).reshape(out_shape);
  if (!padding_idx_) return rows;
  Tensor is_pad = eq(indices, scalar_like(indices, static_cast<double>(*padding_idx_))).unsqueeze(-1);
  return where(is_pad, rows.detach(), rows);
}

std::string Embedding::describe() const {
  std::string s = detail::cat("Embedding(", num_, ", ", dim_);
  if (padding_idx_) s += detail::cat(", padding_idx=", *padding_idx_);
  return s + ")";
}

}  // namespace braid::nn
