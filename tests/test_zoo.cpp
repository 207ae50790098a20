// The model zoo's catalogue (model_zoo/catalogue.h): every builder builds and runs its example;
// parameter counts against independent figures (torchvision's published counts for ResNet-50 and
// MobileNetV2; BERT's parameter formula and, where scripts/setup_pretrained.sh cached it, the
// MiniLM-L3 file's own weights for the encoder); the listing and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "braid/autograd.h"
#include "braid/nn/loss.h"
#include "braid/onnx/model.h"
#include "braid/ops.h"
#include "braid/random.h"
#include "catalogue.h"
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

}  // namespace
}  // namespace braid
