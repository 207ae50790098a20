// The model zoo: reference models built only from braid's layers, so that the same definitions
// train on one process and, unchanged, data-parallel or pipelined across ranks.
#pragma once

#include <string>
#include <vector>

#include "braid/nn/nn.h"

namespace braid::zoo {

/// Flatten + Linear/ReLU stack for (N, C, H, W) or (N, F) input.
nn::ModulePtr mlp(int64_t in_features = 784, const std::vector<int64_t>& hidden = {256, 128}, int64_t classes = 10);
/// A LeNet-style CNN with BatchNorm for (N, 1, 28, 28) images: two conv-BN-ReLU-pool stages and
/// two Linear layers.
nn::ModulePtr small_cnn(int64_t in_channels = 1, int64_t classes = 10);
/// A ResNet-style CNN for (N, 3, 32, 32) images: a stem and three stages of residual basic blocks
/// (widths w, 2w, 4w; stride 2 between stages), global average pooling and a Linear head.
nn::ModulePtr resnet(int64_t in_channels = 3, int64_t classes = 10, int64_t width = 16, int64_t blocks_per_stage = 1);
/// ResNet-50 (He et al., torchvision's layout: a 7x7 stride-2 stem and max pooling, then stages of
/// 3, 4, 6 and 3 bottleneck blocks of widths 64 to 512 with expansion 4, the stride on each stage's
/// first 3x3 convolution) for (N, 3, H, W) images, H and W at least 32; 25,557,032 parameters
/// for 1000 classes, as torchvision.models.resnet50.
nn::ModulePtr resnet50(int64_t classes = 1000);

/// MobileNetV2 (Sandler et al., torchvision's layout at width 1.0): a 3x3 stride-2 stem, 17 inverted
/// residual blocks (1x1 expansion, 3x3 depthwise, 1x1 linear projection; an identity shortcut where
/// shapes allow), a 1x1 convolution to 1280 channels, global average pooling, dropout 0.2 and a
/// Linear head, with BatchNorm and ReLU6 throughout; 3,504,872 parameters for 1000 classes, as
/// torchvision.models.mobilenet_v2.
nn::ModulePtr mobilenet_v2(int64_t classes = 1000);

/// The shape of a BERT-style encoder; the defaults are paraphrase-MiniLM-L3-v2's.
struct EncoderConfig {
  int64_t vocab = 30522, hidden = 384, layers = 3, heads = 12, feedforward = 1536, max_positions = 512,
          token_types = 2;
  double dropout = 0.1, layer_norm_eps = 1e-12;
};
/// A BERT-style Transformer encoder in MiniLM's layout: word + position + token-type(0) embeddings
/// and LayerNorm, post-norm encoder layers with GELU, the mean over the tokens, and a Linear head
/// (none when classes is 0: the output is the pooled (N, hidden) embedding). Input: token ids
/// (N, L) int64. 17,241,984 parameters before the head with the defaults, as the MiniLM-L3 file.
nn::ModulePtr transformer_encoder(const EncoderConfig& config = EncoderConfig(), int64_t classes = 2);

/// Builds a model by name ("mlp", "cnn", "resnet") for inputs of in_channels.
nn::ModulePtr make_model(const std::string& name, int64_t in_channels, int64_t classes);
std::vector<std::string> model_names();

}  // namespace braid::zoo
