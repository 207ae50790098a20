// Model definitions of the zoo, written as Sequential stacks of layers so that a pipeline can cut
// them between any two blocks.
#include "models.h"

namespace braid::zoo {

using namespace braid::nn;

ModulePtr mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes) {
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<Flatten>());
  int64_t width = in_features;
  for (int64_t h : hidden) {
    m->add(std::make_shared<Linear>(width, h));
    m->add(std::make_shared<ReLU>());
    width = h;
  }
  m->add(std::make_shared<Linear>(width, classes));
  return m;
}

ModulePtr small_cnn(int64_t in_channels, int64_t classes) {
  auto stage = [](int64_t in, int64_t out) {
    return std::make_shared<Sequential>(std::vector<ModulePtr>{
        std::make_shared<Conv2d>(in, out, 3, Conv2dOptions{.padding = 1, .bias = false}),
        std::make_shared<BatchNorm2d>(out), std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2)});
  };
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      stage(in_channels, 16), stage(16, 32), std::make_shared<Flatten>(), std::make_shared<Linear>(32 * 7 * 7, 128),
      std::make_shared<ReLU>(), std::make_shared<Linear>(128, classes)});
}

namespace {
ModulePtr basic_block(int64_t in, int64_t out, int64_t stride) {
  auto body = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(in, out, 3, Conv2dOptions{.stride = stride, .padding = 1, .bias = false}),
      std::make_shared<BatchNorm2d>(out), std::make_shared<ReLU>(),
      std::make_shared<Conv2d>(out, out, 3, Conv2dOptions{.padding = 1, .bias = false}),
      std::make_shared<BatchNorm2d>(out)});
  ModulePtr shortcut;
  if (stride != 1 || in != out)
    shortcut = std::make_shared<Sequential>(
        std::vector<ModulePtr>{std::make_shared<Conv2d>(in, out, 1, Conv2dOptions{.stride = stride, .bias = false}),
                               std::make_shared<BatchNorm2d>(out)});
  return std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Residual>(body, shortcut), std::make_shared<ReLU>()});
}
ModulePtr bottleneck(int64_t in, int64_t width, int64_t stride) {
  const int64_t out = width * 4;
  auto body = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(in, width, 1, Conv2dOptions{.bias = false}), std::make_shared<BatchNorm2d>(width),
      std::make_shared<ReLU>(),
      std::make_shared<Conv2d>(width, width, 3, Conv2dOptions{.stride = stride, .padding = 1, .bias = false}),
      std::make_shared<BatchNorm2d>(width), std::make_shared<ReLU>(),
      std::make_shared<Conv2d>(width, out, 1, Conv2dOptions{.bias = false}), std::make_shared<BatchNorm2d>(out)});
  ModulePtr shortcut;
  if (stride != 1 || in != out)
    shortcut = std::make_shared<Sequential>(
        std::vector<ModulePtr>{std::make_shared<Conv2d>(in, out, 1, Conv2dOptions{.stride = stride, .bias = false}),
                               std::make_shared<BatchNorm2d>(out)});
  return std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Residual>(body, shortcut), std::make_shared<ReLU>()});
}
}  // namespace

ModulePtr resnet50(int64_t classes) {
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<Conv2d>(3, 64, 7, Conv2dOptions{.stride = 2, .padding = 3, .bias = false}));
  m->add(std::make_shared<BatchNorm2d>(64));
  m->add(std::make_shared<ReLU>());
  m->add(std::make_shared<MaxPool2d>(3, MaxPool2dOptions{.stride = 2, .padding = 1}));
  int64_t c = 64;
  const int64_t blocks[] = {3, 4, 6, 3};
  for (int64_t stage = 0; stage < 4; ++stage) {
    const int64_t width = 64 << stage;
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      m->add(bottleneck(c, width, stage > 0 && b == 0 ? 2 : 1));
      c = width * 4;
    }
  }
  m->add(std::make_shared<AdaptiveAvgPool2d>(std::vector<int64_t>{1, 1}));
  m->add(std::make_shared<Flatten>());
  m->add(std::make_shared<Linear>(c, classes));
  return m;
}

ModulePtr resnet(int64_t in_channels, int64_t classes, int64_t width, int64_t blocks_per_stage) {
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<Conv2d>(in_channels, width, 3, Conv2dOptions{.padding = 1, .bias = false}));
  m->add(std::make_shared<BatchNorm2d>(width));
  m->add(std::make_shared<ReLU>());
  int64_t c = width;
  for (int64_t stage = 0; stage < 3; ++stage) {
    int64_t out = width << stage;
    for (int64_t b = 0; b < blocks_per_stage; ++b) {
      m->add(basic_block(c, out, stage > 0 && b == 0 ? 2 : 1));
      c = out;
    }
  }
  m->add(std::make_shared<AdaptiveAvgPool2d>(std::vector<int64_t>{1, 1}));
  m->add(std::make_shared<Flatten>());
  m->add(std::make_shared<Linear>(c, classes));
  return m;
}

namespace {

// torchvision's InvertedResidual: expand (unless t == 1), depthwise, project; identity shortcut when
// the block keeps the shape.
ModulePtr conv_bn_relu6(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups) {
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(
          in, out, k, Conv2dOptions{.stride = stride, .padding = (k - 1) / 2, .groups = groups, .bias = false}),
      std::make_shared<BatchNorm2d>(out), std::make_shared<ReLU6>()});
}

ModulePtr inverted_residual(int64_t in, int64_t out, int64_t stride, int64_t expand) {
  const int64_t hidden = in * expand;
  auto body = std::make_shared<Sequential>();
  if (expand != 1) body->add(conv_bn_relu6(in, hidden, 1, 1, 1));
  body->add(conv_bn_relu6(hidden, hidden, 3, stride, hidden));
  body->add(std::make_shared<Conv2d>(hidden, out, 1, Conv2dOptions{.bias = false}))
      .add(std::make_shared<BatchNorm2d>(out));
  if (stride == 1 && in == out) return std::make_shared<Residual>(body);
  return body;
}

// Word + position + token-type(0) embeddings, then LayerNorm and dropout: (N, L) ids -> (N, L, H).
class EncoderEmbeddings : public Module {
 public:
  explicit EncoderEmbeddings(const EncoderConfig& c) : Module("EncoderEmbeddings") {
    words_ = register_module("word_embeddings", std::make_shared<Embedding>(c.vocab, c.hidden));
    positions_ = register_module("position_embeddings", std::make_shared<Embedding>(c.max_positions, c.hidden));
    types_ = register_module("token_type_embeddings", std::make_shared<Embedding>(c.token_types, c.hidden));
    norm_ = register_module("LayerNorm", std::make_shared<LayerNorm>(c.hidden, c.layer_norm_eps));
    dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
    max_positions_ = c.max_positions;
  }
  Tensor forward(const Tensor& ids) override {
    BRAID_CHECK(ids.dim() == 2, "EncoderEmbeddings: expected token ids (N, L), got shape ", shape_str(ids.shape()));
    const int64_t len = ids.size(1);
    BRAID_CHECK(len <= max_positions_, "EncoderEmbeddings: ", len, " tokens, more than the ", max_positions_,
                " positions the encoder has");
    Tensor pos = arange(len, kInt64, ids.device());
    Tensor x = (*words_)(ids) + (*positions_)(pos) + (*types_)(zeros_like(pos));
    return (*dropout_)((*norm_)(x));
  }

 private:
  std::shared_ptr<Embedding> words_, positions_, types_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Dropout> dropout_;
  int64_t max_positions_;
};

// The mean over axis 1: (N, L, H) -> (N, H).
class MeanOverTokens : public Module {
 public:
  MeanOverTokens() : Module("MeanOverTokens") {}
  Tensor forward(const Tensor& x) override { return mean(x, {1}); }
};

}  // namespace

ModulePtr mobilenet_v2(int64_t classes) {
  auto m = std::make_shared<Sequential>();
  m->add(conv_bn_relu6(3, 32, 3, 2, 1));
  int64_t c = 32;
  // (expansion t, channels c, repeats n, first stride s), the paper's Table 2.
  const int64_t settings[7][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                  {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  for (const auto& [t, out, n, s] : settings) {
    for (int64_t i = 0; i < n; ++i) {
      m->add(inverted_residual(c, out, i == 0 ? s : 1, t));
      c = out;
    }
  }
  m->add(conv_bn_relu6(c, 1280, 1, 1, 1));
  m->add(std::make_shared<AdaptiveAvgPool2d>(std::vector<int64_t>{1, 1})).add(std::make_shared<Flatten>());
  m->add(std::make_shared<Dropout>(0.2)).add(std::make_shared<Linear>(1280, classes));
  return m;
}

ModulePtr transformer_encoder(const EncoderConfig& c, int64_t classes) {
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<EncoderEmbeddings>(c));
  for (int64_t i = 0; i < c.layers; ++i)
    m->add(std::make_shared<TransformerEncoderLayer>(c.hidden, c.heads,
                                                     TransformerEncoderLayerOptions{.dim_feedforward = c.feedforward,
                                                                                    .dropout = c.dropout,
                                                                                    .activation = "gelu",
                                                                                    .layer_norm_eps = c.layer_norm_eps,
                                                                                    .batch_first = true}));
  m->add(std::make_shared<MeanOverTokens>());
  if (classes > 0) m->add(std::make_shared<Linear>(c.hidden, classes));
  return m;
}

std::vector<std::string> model_names() { return {"mlp", "cnn", "resnet"}; }

ModulePtr make_model(const std::string& name, int64_t in_channels, int64_t classes) {
  if (name == "mlp") return mlp(in_channels * 28 * 28, {256, 128}, classes);
  if (name == "cnn") return small_cnn(in_channels, classes);
  if (name == "resnet") return resnet(in_channels, classes);
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  throw ValueError(detail::cat("unknown model '", name, "'; known: ", known));
}

}  // namespace braid::zoo
