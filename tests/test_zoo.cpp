// The model zoo's catalogue (model_zoo/catalogue.h): every builder builds and runs its example;
// parameter counts against independent figures (torchvision's published counts for ResNet-50 and
// MobileNetV2; BERT's parameter formula and, where scripts/setup_pretrained.sh cached it, the
// MiniLM-L3 file's own weights for the encoder); the listing and its errors; the GPT against
// PyTorch (tests/data/gpt_reference.txt, made by tests/data/make_gpt_reference.py), its causality,
// and its corpus reader on a CSV with every quoting rule.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "braid/autograd.h"
#include "braid/nn/loss.h"
#include "braid/onnx/model.h"
#include "braid/ops.h"
#include "braid/random.h"
#include "catalogue.h"
#include "gpt.h"
#include "reference_file.h"
#include "test_paths.h"
#include "core/nice_ticks.h"
#include "plot.h"
#include "models.h"

namespace braid {
namespace {

TEST(Zoo, EveryBuilderBuildsAndRunsItsExample) {
  manual_seed(0);
  for (const auto& e : zoo::catalogue()) {
    if (!e.build) continue;
    nn::ModulePtr m = e.build();
    m->eval();
    NoGradGuard no_grad;
    Tensor y = (*m)(e.example());
    ASSERT_EQ(y.size(0), 2) << e.name;
    const double total = sum(abs(y.to(kFloat64))).item();  // NaN or inf if any element is
    EXPECT_TRUE(std::isfinite(total)) << e.name;
  }
}

TEST(Zoo, ParameterCountsMatchTheReferenceArchitectures) {
  EXPECT_EQ(zoo::mobilenet_v2(1000)->num_parameters(), 3504872);  // torchvision.models.mobilenet_v2
  EXPECT_EQ(zoo::resnet50(1000)->num_parameters(), 25557032);     // torchvision.models.resnet50
  // BERT: embeddings (V + P + T) H + LayerNorm 2H; per layer Q, K, V, O (H^2 + H each), two
  // LayerNorms (2H each) and the feed-forward pair (2 H F + F + H).
  const zoo::EncoderConfig c;
  const int64_t H = c.hidden, F = c.feedforward;
  const int64_t expected = (c.vocab + c.max_positions + c.token_types) * H + 2 * H +
                           c.layers * (4 * (H * H + H) + 4 * H + 2 * H * F + F + H);
  EXPECT_EQ(expected, 17241984);
  EXPECT_EQ(zoo::transformer_encoder(c, 0)->num_parameters(), expected);
  EXPECT_EQ(zoo::transformer_encoder(c, 5)->num_parameters(), expected + H * 5 + 5);
  const std::string cached = zoo::pretrained_path("minilm_l3");
  if (std::filesystem::exists(cached)) {
    int64_t in_file = 0;
    for (const auto& [name, t] : onnx::load_model(cached).graph.initializers) in_file += t.numel();
    EXPECT_EQ(in_file, expected) << "the encoder's shape differs from the pretrained MiniLM-L3 file " << cached;
  }
}

TEST(Zoo, TheEncoderTrainsOnTokenIdsAndRefusesTooLongInput) {
  manual_seed(1);
  zoo::EncoderConfig c;
  c.vocab = 50, c.hidden = 16, c.layers = 2, c.heads = 4, c.feedforward = 32, c.max_positions = 12, c.dropout = 0;
  nn::ModulePtr m = zoo::transformer_encoder(c, 3);
  Tensor ids = randint(0, 50, {4, 10}, kInt64), y = tensor(std::vector<int64_t>{0, 1, 2, 1}, {4});
  Tensor loss = nn::cross_entropy((*m)(ids), y);
  loss.backward();
  int64_t with_grad = 0;
  for (const Tensor& p : m->parameters()) with_grad += p.grad().defined() && amax(abs(p.grad())).item() > 0;
  // every parameter but the rows of unused positions and token types gets a gradient
  EXPECT_EQ(with_grad, static_cast<int64_t>(m->parameters().size()));
  try {
    (*m)(randint(0, 50, {1, 13}, kInt64));
    FAIL() << "13 tokens for 12 positions were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("13 tokens, more than the 12 positions"), std::string::npos) << e.what();
  }
}

TEST(Zoo, TheListingShowsEveryEntryAndUnknownNamesAreRefused) {
  std::ostringstream out;
  zoo::print_catalogue(out);
  for (const auto& e : zoo::catalogue()) EXPECT_NE(out.str().find(e.name), std::string::npos) << e.name;
  EXPECT_NE(out.str().find("3,504,872"), std::string::npos) << out.str();
  try {
    zoo::zoo_entry("mobilenet_v3");
    FAIL() << "an unknown name was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no model 'mobilenet_v3'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("mobilenet_v2"), std::string::npos);
  }
}

// The model against PyTorch's own layers (nn.MultiheadAttention with a causal mask, LayerNorm,
// GELU(tanh)): logits, the mean cross-entropy, and every parameter's gradient.
TEST(Zoo, GptMatchesPyTorchsLogitsLossAndGradients) {
  const auto cases = testing::load_reference(std::string(test::data_dir()) + "/gpt_reference.txt");
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto& cfg = c.words("config");
    auto num = [&](size_t i) { return std::stoll(cfg.at(i)); };
    auto m = zoo::gpt(zoo::GptConfig{.vocab = num(0), .context = num(1), .layers = num(2), .heads = num(3),
                                     .embed = num(4)});
    m->to(kFloat64);
    nn::StateDict state;
    for (const auto& [key, t] : c.tensors)
      if (key.rfind("state.", 0) == 0) state[key.substr(6)] = t.make();
    ASSERT_EQ(state.size(), m->state_dict().size());
    m->load_state_dict(state);
    Tensor logits = (*m)(c.tensor("input.ids"));
    Tensor loss = zoo::gpt_loss(logits, c.tensor("input.targets"));
    loss.backward();
    std::string where;
    EXPECT_LE(testing::tolerance_ratio(logits, c.ref("output.logits"), 1e-10, 1e-12, &where), 1.0) << where;
    EXPECT_LE(testing::tolerance_ratio(loss, c.ref("output.loss"), 1e-12, 1e-12, &where), 1.0) << where;
    for (const auto& [name, p] : m->named_parameters())
      EXPECT_LE(testing::tolerance_ratio(p.grad(), c.ref("grad." + name), 1e-9, 1e-11, &where), 1.0) << name << where;
  }
}

// Position i's logits depend on tokens 0..i only: changing token j leaves positions before j as
// they were, bit for bit, and moves position j.
TEST(Zoo, GptIsCausal) {
  manual_seed(3);
  auto m = zoo::gpt(zoo::GptConfig{.vocab = 20, .context = 10, .layers = 2, .heads = 2, .embed = 16});
  m->eval();
  NoGradGuard no_grad;
  Tensor ids = randint(0, 20, {2, 10}, kInt64);
  const Tensor before = (*m)(ids);
  for (int64_t j : {0, 4, 9}) {
    Tensor changed = ids.clone();
    changed.narrow(1, j, 1).fill_(static_cast<double>((ids.to_vector<int64_t>()[static_cast<size_t>(j)] + 1) % 20));
    const Tensor after = (*m)(changed);
    if (j > 0) {
      EXPECT_EQ(amax(abs(after.narrow(1, 0, j) - before.narrow(1, 0, j))).item(), 0.0) << j;
    }
    EXPECT_GT(amax(abs(after.narrow(1, j, 1) - before.narrow(1, j, 1))).item(), 1e-4) << j;
  }
  try {
    (*m)(randint(0, 20, {1, 11}, kInt64));
    FAIL() << "11 tokens for a context of 10 were accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("11 tokens, more than the context of 10"), std::string::npos) << e.what();
  }
}

// RFC 4180's rules (quoted commas, doubled quotes, a newline inside quotes, CRLF) and UTF-8: the
// characters are code points, the windows non-overlapping with targets one character ahead.
TEST(Zoo, GptCorpusReadsQuotedCsvAsCharacters) {
  const std::string path = ::testing::TempDir() + "braid_corpus.csv";
  {
    std::ofstream f(path, std::ios::binary);
    f << "text,label,source\r\n"
      << "\"ab, \"\"c\"\"\",1,rotten_tomatoes\r\n"
      << "skipped,0,imdb\n"
      << "\"caf\xc3\xa9\nx\",0,rotten_tomatoes\n";
  }
  // Rotten Tomatoes rows only, each followed by a newline: 'ab, "c"\n' and 'café\nx\n'.
  const zoo::CharCorpus c = zoo::load_movie_review_corpus(path, 3, 0.25);
  EXPECT_EQ(c.text, "ab, \"c\"\ncaf\xc3\xa9\nx\n");
  const std::u32string alphabet(c.alphabet.begin(), c.alphabet.end());
  EXPECT_EQ(alphabet, U"\n \",abcfx\u00e9");
  // 15 characters make 3 windows of 4: 2 for training, 1 (a quarter, at least one) for validation.
  ASSERT_EQ(c.train->size(), 2);
  ASSERT_EQ(c.validation->size(), 1);
  auto ids = [&](const std::u32string& s) {
    std::vector<int64_t> out;
    for (char32_t ch : s) out.push_back(static_cast<int64_t>(alphabet.find(ch)));
    return out;
  };
  EXPECT_EQ(c.train->inputs().to_vector<int64_t>(), ids(U"ab,\"c\""));
  EXPECT_EQ(c.train->targets().to_vector<int64_t>(), ids(U"b, c\"\n"));
  EXPECT_EQ(c.validation->inputs().to_vector<int64_t>(), ids(U"caf"));
  EXPECT_EQ(c.validation->targets().to_vector<int64_t>(), ids(U"af\u00e9"));
  EXPECT_EQ(c.decode(ids(U"caf\u00e9")), "caf\xc3\xa9");
  try {
    zoo::load_movie_review_corpus(::testing::TempDir() + "no_such.csv", 3);
    FAIL() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("setup_pretrained.sh movie_reviews"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace braid

// Note [Axis ticks]: steps of 1, 2, 2.5 or 5 times a power of ten, the axis widened to the outer ticks.
TEST(Plot, AxisTicksAreRoundValues) {
  using braid::detail::nice_ticks;
  auto labels = [](const braid::detail::AxisTicks& t) {
    std::string all;
    for (const auto& l : t.labels) all += (all.empty() ? "" : " ") + l;
    return all;
  };
  // The curves' old labels read 0.0213, 0.766, 1.51; the pipeline's 4.818 ms.
  EXPECT_EQ(labels(nice_ticks(0.0213, 1.51)), "0 0.5 1 1.5 2");
  EXPECT_EQ(labels(nice_ticks(0.0213, 1.49)), "0 0.5 1 1.5");
  EXPECT_EQ(labels(nice_ticks(0.0, 4.818)), "0 2 4 6");
  EXPECT_EQ(labels(nice_ticks(0.7288, 1.5472)), "0.5 0.75 1 1.25 1.5 1.75");
  EXPECT_EQ(labels(nice_ticks(1.0, 3.0)), "1 1.5 2 2.5 3");
  EXPECT_EQ(labels(nice_ticks(-0.3, 0.2)), "-0.4 -0.2 0 0.2");
  EXPECT_EQ(labels(nice_ticks(0.0, 48.0)), "0 20 40 60");
  EXPECT_EQ(labels(nice_ticks(2.0, 2.0)), "2 2.05 2.1 2.15 2.2");  // an empty range still gets an axis
  const auto t = nice_ticks(0.0213, 1.51);
  EXPECT_DOUBLE_EQ(t.step, 0.5);
  EXPECT_DOUBLE_EQ(t.lo, 0.0);
  EXPECT_DOUBLE_EQ(t.hi, 2.0);
}

TEST(Plot, TheChartLabelsItsAxesAtRoundValues) {
  braid::zoo::Series loss{"train", {0.0213, 1.0, 2.0, 3.0}, {1.51, 1.1, 0.9, 0.766}, "#1f77b4"};
  const std::string path = ::testing::TempDir() + "braid_plot_ticks.svg";
  braid::zoo::write_svg_chart(path, "ticks", {{"loss", {loss}}});
  std::ifstream f(path);
  const std::string svg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* label : {">0.5</text>", ">0.75</text>", ">1.75</text>", ">0</text>", ">3</text>"})
    EXPECT_NE(svg.find(label), std::string::npos) << label << " missing from\n" << svg;
  EXPECT_EQ(svg.find("0.0213"), std::string::npos);
  EXPECT_EQ(svg.find("0.766"), std::string::npos);
}
