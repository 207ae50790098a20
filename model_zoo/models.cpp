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
        std::make_shared<Conv2d>(in, out, 3, 1, 1, 1, 1, false), std::make_shared<BatchNorm2d>(out),
        std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2)});
  };
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      stage(in_channels, 16), stage(16, 32), std::make_shared<Flatten>(), std::make_shared<Linear>(32 * 7 * 7, 128),
      std::make_shared<ReLU>(), std::make_shared<Linear>(128, classes)});
}

namespace {
ModulePtr basic_block(int64_t in, int64_t out, int64_t stride) {
  auto body = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(in, out, 3, stride, 1, 1, 1, false), std::make_shared<BatchNorm2d>(out),
      std::make_shared<ReLU>(), std::make_shared<Conv2d>(out, out, 3, 1, 1, 1, 1, false),
      std::make_shared<BatchNorm2d>(out)});
  ModulePtr shortcut;
  if (stride != 1 || in != out)
    shortcut = std::make_shared<Sequential>(std::vector<ModulePtr>{
        std::make_shared<Conv2d>(in, out, 1, stride, 0, 1, 1, false), std::make_shared<BatchNorm2d>(out)});
  return std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Residual>(body, shortcut), std::make_shared<ReLU>()});
}
ModulePtr bottleneck(int64_t in, int64_t width, int64_t stride) {
  const int64_t out = width * 4;
  auto body = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(in, width, 1, 1, 0, 1, 1, false), std::make_shared<BatchNorm2d>(width),
      std::make_shared<ReLU>(), std::make_shared<Conv2d>(width, width, 3, stride, 1, 1, 1, false),
      std::make_shared<BatchNorm2d>(width), std::make_shared<ReLU>(),
      std::make_shared<Conv2d>(width, out, 1, 1, 0, 1, 1, false), std::make_shared<BatchNorm2d>(out)});
  ModulePtr shortcut;
  if (stride != 1 || in != out)
    shortcut = std::make_shared<Sequential>(std::vector<ModulePtr>{
        std::make_shared<Conv2d>(in, out, 1, stride, 0, 1, 1, false), std::make_shared<BatchNorm2d>(out)});
  return std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Residual>(body, shortcut), std::make_shared<ReLU>()});
}
}  // namespace

ModulePtr resnet50(int64_t classes) {
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<Conv2d>(3, 64, 7, 2, 3, 1, 1, false));
  m->add(std::make_shared<BatchNorm2d>(64));
  m->add(std::make_shared<ReLU>());
  m->add(std::make_shared<MaxPool2d>(3, 2, 1));
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
  m->add(std::make_shared<Conv2d>(in_channels, width, 3, 1, 1, 1, 1, false));
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
