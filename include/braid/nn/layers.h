// The feed-forward layers: linear, convolution, pooling, normalisation, activations, dropout,
// embedding, shape helpers and residual blocks. Constructor arguments, defaults, parameter and
// buffer names and default initialisations are PyTorch's, so that state dicts map 1:1 and a model
// ported from PyTorch trains alike. Attention and recurrent layers live in attention.h and recurrent.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "braid/nn/module.h"
#include "braid/random.h"

namespace braid::nn {

/// A per-axis integer argument given as one number for every axis (3) or one per axis ({3, 5}),
/// as PyTorch's int-or-tuple arguments. Empty means "the default" where a layer documents one.
class Ints {
 public:
  Ints() = default;
  Ints(int64_t v) : values_{v} {}  // NOLINT(google-explicit-constructor): 3 means {3, 3}
  Ints(std::initializer_list<int64_t> v) : values_(v) {}
  Ints(std::vector<int64_t> v) : values_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  /// The values for n axes; throws ValueError naming layer and arg unless there are 1 or n of them.
  std::vector<int64_t> expand(size_t n, const std::string& layer, const char* arg) const;
  const std::vector<int64_t>& values() const { return values_; }

 private:
  std::vector<int64_t> values_;
};

/// Convolution padding: sizes as Ints, or the string "valid" (no padding) or "same" (output size
/// equals input size; stride 1 only, extra padding on the right when the total is odd, as PyTorch).
class Padding {
 public:
  // int as well as int64_t, so that the literal 0 is an exact match and not a null const char*.
  Padding(int v) : sizes_{v} {}  // NOLINT(google-explicit-constructor)
  Padding(int64_t v) : sizes_{v} {}  // NOLINT(google-explicit-constructor)
  Padding(std::initializer_list<int64_t> v) : sizes_(v) {}
  Padding(std::vector<int64_t> v) : sizes_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  Padding(const char* mode) : Padding(std::string(mode)) {}  // NOLINT(google-explicit-constructor)
  Padding(const std::string& mode);  // NOLINT(google-explicit-constructor)
  bool is_same() const { return same_; }
  /// Padding per axis ("valid" is 0); meaningless when is_same().
  const Ints& sizes() const { return sizes_; }

 private:
  Ints sizes_;
  bool same_ = false;
};

/// x W^T + b over the last axis of x (torch.nn.functional.linear); b may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Note [Layer config]
// Every layer with settings has a public config(): the arguments it was built with, as a struct
// (the constructor's required arguments, then its options struct where it has one), as libtorch's
// module->options. Per-axis sizes come back expanded ({3, 3}, not 3). Whatever reads a layer from
// outside (the ONNX exporter, Python's repr) reads this, so layers know nothing of their readers.

struct LinearConfig {
  int64_t in_features, out_features;
  bool bias;
};

/// y = x W^T + b over the last axis. weight (out_features, in_features), bias (out_features).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  LinearConfig config() const { return {in_, out_, bias_.defined()}; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

// Note [Layer options]
// A layer with more than two optional settings takes them as an options struct, as libtorch's
// Conv2dOptions, with PyTorch's names and defaults in PyTorch's order, so that C++ reads like the
// Python call: Conv2d(1, 16, 3, {.padding = 1, .bias = false}) for nn.Conv2d(1, 16, 3, padding=1,
// bias=False) (designated initializers name the fields in declaration order). The positional
// constructors stay for release 0.1 and are deprecated: they go in 0.2; braid's own code (the
// model zoo, examples, README) uses the options. While both exist, GCC (12) takes a list of one
// field whose value is a number, {.padding = 1}, for that number and calls the call ambiguous with
// the positional constructor: name the type there, Conv2dOptions{.padding = 1}, as make_shared
// needs anyway (Clang accepts the bare list, as the standard says).

struct Conv1dOptions {
  int64_t stride = 1;
  Padding padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

struct Conv1dConfig {
  int64_t in_channels, out_channels, kernel_size;
  Conv1dOptions options;
};

/// x (N, C_in, L) -> (N, C_out, L_out). weight (C_out, C_in / groups, kernel_size). Padding mode
/// "zeros" only.
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, const Conv1dOptions& options);
  // Deprecated (Note [Layer options]): the options struct's fields in order.
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1, Padding padding = 0,
         int64_t dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  /// options.padding is "same" or the padding on each side.
  Conv1dConfig config() const;

 private:
  int64_t in_, out_, kernel_, stride_, dilation_, groups_;
  bool same_;
  int64_t padding_ = 0, extra_right_ = 0;  // padding on both sides, and more on the right ('same')
  Tensor weight_, bias_;
};

struct Conv2dOptions {
  Ints stride = 1;
  Padding padding = 0;
  Ints dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

struct Conv2dConfig {
  int64_t in_channels, out_channels;
  std::vector<int64_t> kernel_size;
  Conv2dOptions options;
};

/// x (N, C_in, H, W) -> (N, C_out, H_out, W_out). weight (C_out, C_in / groups, kH, kW); groups ==
/// C_in == C_out is a depthwise convolution. Padding mode "zeros" only.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, const Conv2dOptions& options);
  // Deprecated (Note [Layer options]): the options struct's fields in order.
  Conv2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, Ints stride = 1, Padding padding = 0,
         Ints dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  /// options.padding is "same" (conv_padding_same() gives the sides) or the padding per axis.
  Conv2dConfig config() const;

 private:
  int64_t in_, out_, groups_;
  std::vector<int64_t> kernel_, stride_, dilation_;
  bool same_;
  std::vector<int64_t> padding_;  // {h, w}, or {top, bottom, left, right} for 'same'
  Tensor weight_, bias_;
};

struct ConvTranspose2dOptions {
  Ints stride = 1;
  Ints padding = 0;
  Ints output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Ints dilation = 1;
};

struct ConvTranspose2dConfig {
  int64_t in_channels, out_channels;
  std::vector<int64_t> kernel_size;
  ConvTranspose2dOptions options;
};

/// The gradient of Conv2d with respect to its input, as a layer (upsampling). weight
/// (C_in, C_out / groups, kH, kW).
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, const ConvTranspose2dOptions& options);
  // Deprecated (Note [Layer options]): the options struct's fields in order.
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, Ints stride = 1, Ints padding = 0,
                  Ints output_padding = 0, int64_t groups = 1, bool bias = true, Ints dilation = 1);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  ConvTranspose2dConfig config() const {
    return {in_, out_, kernel_, {stride_, padding_, output_padding_, groups_, bias_.defined(), dilation_}};
  }

 private:
  int64_t in_, out_, groups_;
  std::vector<int64_t> kernel_, stride_, padding_, output_padding_, dilation_;
  Tensor weight_, bias_;
};

struct MaxPool2dOptions {
  Ints stride = {};  // empty: kernel_size
  Ints padding = 0;
  Ints dilation = 1;
  bool ceil_mode = false;
};

struct MaxPool2dConfig {
  std::vector<int64_t> kernel_size;
  MaxPool2dOptions options;  // stride resolved
};

/// Max over windows. stride defaults to kernel_size. (PyTorch's return_indices is not offered, so
/// ceil_mode is the fifth argument.)
class MaxPool2d : public Module {
 public:
  MaxPool2d(Ints kernel_size, const MaxPool2dOptions& options);
  // Deprecated beyond kernel_size (Note [Layer options]): the options struct's fields in order.
  MaxPool2d(Ints kernel_size, Ints stride = {}, Ints padding = 0, Ints dilation = 1, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  MaxPool2dConfig config() const { return {kernel_, {stride_, padding_, dilation_, ceil_mode_}}; }

 private:
  std::vector<int64_t> kernel_, stride_, padding_, dilation_;
  bool ceil_mode_;
};

struct AvgPool2dOptions {
  Ints stride = {};  // empty: kernel_size
  Ints padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
};

struct AvgPool2dConfig {
  std::vector<int64_t> kernel_size;
  AvgPool2dOptions options;  // stride resolved
};

/// Mean over windows. stride defaults to kernel_size; count_include_pad counts padded zeros in the divisor.
class AvgPool2d : public Module {
 public:
  AvgPool2d(Ints kernel_size, const AvgPool2dOptions& options);
  // Deprecated beyond kernel_size (Note [Layer options]): the options struct's fields in order.
  AvgPool2d(Ints kernel_size, Ints stride = {}, Ints padding = 0, bool ceil_mode = false,
            bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  AvgPool2dConfig config() const { return {kernel_, {stride_, padding_, ceil_mode_, count_include_pad_}}; }

 private:
  std::vector<int64_t> kernel_, stride_, padding_;
  bool ceil_mode_, count_include_pad_;
};

struct AdaptiveAvgPool2dConfig {
  std::vector<int64_t> output_size;
};

/// Mean over the windows that split (H, W) into output_size cells, as PyTorch's adaptive pooling.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Ints output_size);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  AdaptiveAvgPool2dConfig config() const { return {output_size_}; }

 private:
  std::vector<int64_t> output_size_;
};

/// Batch normalisation over all axes but the channel axis 1. Training normalises with the batch's
/// biased variance and updates running_mean and running_var (with the unbiased variance) by
/// momentum, or by a cumulative average when momentum is nullopt; eval uses the running statistics.
/// Parameters weight and bias (affine), buffers running_mean, running_var and num_batches_tracked
/// (track_running_stats).
/// y = (x - mean) / sqrt(var + eps) * weight + bias, with per-channel mean and var already shaped
/// for broadcasting ((1, C, 1, ...)); weight and bias may be undefined. Computed as one scale and
/// shift per channel (Note [BatchNorm as scale and shift]). Shared by BatchNorm and SyncBatchNorm.
Tensor batch_norm_apply(const Tensor& x, const Tensor& mean_c, const Tensor& var_c, const Tensor& weight,
                        const Tensor& bias, double eps);

struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: a cumulative moving average
  bool affine = true;
  bool track_running_stats = true;
};

struct BatchNormConfig {
  int64_t num_features;
  BatchNormOptions options;
};

class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  BatchNormConfig config() const { return {num_features_, {eps_, momentum_, affine_, track_}}; }
  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  std::optional<double> momentum() const { return momentum_; }
  bool affine() const { return affine_; }
  bool track_running_stats() const { return track_; }

 protected:
  BatchNorm(std::string type, std::vector<int64_t> ranks, int64_t num_features, double eps,
            std::optional<double> momentum, bool affine, bool track_running_stats);

 private:
  std::vector<int64_t> ranks_;  // the input ranks this variant accepts
  int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  bool affine_, track_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

/// x (N, C) or (N, C, L).
class BatchNorm1d : public BatchNorm {
 public:
  BatchNorm1d(int64_t num_features, const BatchNormOptions& options);
  // Deprecated beyond num_features (Note [Layer options]): the options struct's fields in order.
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
};

/// x (N, C, H, W).
class BatchNorm2d : public BatchNorm {
 public:
  BatchNorm2d(int64_t num_features, const BatchNormOptions& options);
  // Deprecated beyond num_features (Note [Layer options]): the options struct's fields in order.
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
};

struct LayerNormConfig {
  std::vector<int64_t> normalized_shape;
  double eps;
  bool elementwise_affine;
};

/// Normalises over the trailing axes given by normalized_shape (population variance).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Ints normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  LayerNormConfig config() const { return {shape_, eps_, affine_}; }

 private:
  std::vector<int64_t> shape_;
  double eps_;
  bool affine_;
  Tensor weight_, bias_;
};

struct GroupNormConfig {
  int64_t num_groups, num_channels;
  double eps;
  bool affine;
};

/// Normalises x (N, C, *) over groups of C / num_groups channels; per-channel affine.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  GroupNormConfig config() const { return {groups_, channels_, eps_, affine_}; }

 private:
  int64_t groups_, channels_;
  double eps_;
  bool affine_;
  Tensor weight_, bias_;
};

/// Dropout as a function (torch.nn.functional.dropout): x unchanged unless training and p > 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

struct DropoutConfig {
  double p;
};

/// Zeroes each element with probability p in training and scales the rest by 1 / (1 - p); the
/// identity in eval. Draws from gen (which must outlive the layer) or default_generator().
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  DropoutConfig config() const { return {p_}; }

 private:
  double p_;
  Generator* gen_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

struct LeakyReLUConfig {
  double negative_slope;
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : Module("LeakyReLU"), slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  LeakyReLUConfig config() const { return {slope_}; }

 private:
  double slope_;
};

struct GELUConfig {
  std::string approximate;
};

/// approximate: "none" (erf) or "tanh".
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  GELUConfig config() const { return {approximate_}; }

 private:
  std::string approximate_;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

/// min(max(x, 0), 6), as in MobileNetV2.
class ReLU6 : public Module {
 public:
  ReLU6() : Module("ReLU6") {}
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

struct SoftmaxConfig {
  int64_t dim;
};

/// Softmax along dim (negative counts from the end).
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  SoftmaxConfig config() const { return {dim_}; }

 private:
  int64_t dim_;
};

/// Rows of weight (num_embeddings, embedding_dim) chosen by integer indices of any shape:
/// (*) -> (*, embedding_dim). The row at padding_idx (negative counts from the end) starts at zero
/// and receives no gradient.
struct EmbeddingConfig {
  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  std::string describe() const override;
  EmbeddingConfig config() const { return {num_, dim_, padding_idx_}; }
  const Tensor& weight() const { return weight_; }

 private:
  int64_t num_, dim_;
  std::optional<int64_t> padding_idx_;
  Tensor weight_;
};

struct FlattenConfig {
  int64_t start_dim, end_dim;
};

/// Merges axes start_dim..end_dim into one.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  FlattenConfig config() const { return {start_, end_}; }

 private:
  int64_t start_, end_;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

/// body(x) + shortcut(x), or body(x) + x without a shortcut (children "body" and "shortcut").
class Residual : public Module {
 public:
  explicit Residual(ModulePtr body, ModulePtr shortcut = nullptr);
  Tensor forward(const Tensor& x) override;

 private:
  bool has_shortcut_;
};

}  // namespace braid::nn
