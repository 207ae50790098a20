// Convolution layers over conv1d / conv2d / conv_transpose2d, their int-or-tuple and 'same'
// padding arguments, and PyTorch's default initialisation (kaiming_uniform_ with a = sqrt(5) for
// the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias).
#include <cmath>
#include <sstream>

#include "braid/conv.h"
#include "braid/nn/init.h"
#include "braid/nn/layers.h"
#include "braid/ops.h"
#include "util.h"

namespace braid::nn {

using detail::check_at_least;
using detail::tuple;

std::vector<int64_t> Ints::expand(size_t n, const std::string& layer, const char* arg) const {
  BRAID_CHECK(values_.size() == 1 || values_.size() == n, layer, ": ", arg, " needs 1 or ", n, " values, got ",
              shape_str(values_));
  return values_.size() == n ? values_ : std::vector<int64_t>(n, values_[0]);
}

Padding::Padding(const std::string& mode) : sizes_(0) {
  BRAID_CHECK(mode == "same" || mode == "valid", "padding: expected sizes, 'same' or 'valid', got '", mode, "'");
  same_ = mode == "same";
}

namespace {

void check_channels(const std::string& layer, int64_t in, int64_t out, int64_t groups) {
  BRAID_CHECK(in > 0 && out > 0, layer, ": channel counts must be positive, got in_channels=", in,
              " out_channels=", out);
  BRAID_CHECK(groups > 0 && in % groups == 0 && out % groups == 0, layer, ": groups=", groups,
              " must divide in_channels=", in, " and out_channels=", out);
}

/// weight and bias as PyTorch's _ConvNd.reset_parameters initialises them.
void init_conv(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (!bias.defined()) return;
  auto [fan_in, fan_out] = init::calculate_fan_in_and_fan_out(weight);
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  init::uniform_(bias, -bound, bound);
}

/// x with the channel axis at -(spatial + 1) checked, and a batch axis added when unbatched.
Tensor batched_input(const std::string& layer, const Tensor& x, int64_t spatial, int64_t channels) {
  BRAID_CHECK(x.dim() == spatial + 1 || x.dim() == spatial + 2, layer, ": expected a ", spatial + 2, "-d (batched) or ",
              spatial + 1, "-d (unbatched) input, got shape ", shape_str(x.shape()));
  BRAID_CHECK(x.size(-(spatial + 1)) == channels, layer, ": expected input with ", channels,
              " channels (in_channels) at axis ", x.dim() - spatial - 1, ", got shape ", shape_str(x.shape()));
  return x.dim() == spatial + 2 ? x : x.unsqueeze(0);
}

Tensor unbatch_like(const Tensor& y, const Tensor& x, int64_t spatial) { return x.dim() == spatial + 1 ? y.squeeze(0) : y; }

}  // namespace

// 'same' padding is split as PyTorch splits it (conv_padding_same): half of d (k - 1) on each side
// and an odd remainder on the right, which conv1d cannot take, so it is padded onto the input first.
Conv1d::Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, const Conv1dOptions& o)
    : Conv1d(in_channels, out_channels, kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias) {}

Conv1d::Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride, Padding padding,
               int64_t dilation, int64_t groups, bool bias)
    : Module("Conv1d"), in_(in_channels), out_(out_channels), kernel_(kernel_size), stride_(stride),
      dilation_(dilation), groups_(groups), same_(padding.is_same()) {
  check_channels("Conv1d", in_, out_, groups_);
  check_at_least("Conv1d", "kernel_size", {kernel_}, 1);
  check_at_least("Conv1d", "stride", {stride_}, 1);
  check_at_least("Conv1d", "dilation", {dilation_}, 1);
  BRAID_CHECK(!same_ || stride_ == 1, "Conv1d: padding='same' is not supported for strided convolutions (stride=",
              stride_, ")");
  if (same_) {
    std::vector<int64_t> p = conv_padding_same({kernel_}, {dilation_});
    padding_ = p[0];
    extra_right_ = p[1] - p[0];
  } else {
    padding_ = padding.sizes().expand(1, "Conv1d", "padding")[0];
    check_at_least("Conv1d", "padding", {padding_}, 0);
  }
  weight_ = register_parameter("weight", empty({out_, in_ / groups_, kernel_}, kFloat32, default_device()));
  if (bias) bias_ = register_parameter("bias", empty({out_}, kFloat32, default_device()));
  init_conv(weight_, bias_);
}

Tensor Conv1d::forward(const Tensor& x) {
  Tensor xb = batched_input("Conv1d", x, 1, in_);
  if (extra_right_ > 0) xb = pad(xb, {0, extra_right_});
  return unbatch_like(conv1d(xb, weight_, bias_, stride_, padding_, dilation_, groups_), x, 1);
}

std::string Conv1d::describe() const {
  std::ostringstream os;
  os << "Conv1d(" << in_ << ", " << out_ << ", kernel_size=(" << kernel_ << ",), stride=(" << stride_ << ",)";
  if (same_) os << ", padding=same";
  else if (padding_ != 0) os << ", padding=(" << padding_ << ",)";
  if (dilation_ != 1) os << ", dilation=(" << dilation_ << ",)";
  if (groups_ != 1) os << ", groups=" << groups_;
  if (!bias_.defined()) os << ", bias=False";
  os << ")";
  return os.str();
}

Conv1dConfig Conv1d::config() const {
  return {in_, out_, kernel_, {stride_, same_ ? Padding("same") : Padding(padding_), dilation_, groups_, bias_.defined()}};
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, const Conv2dOptions& o)
    : Conv2d(in_channels, out_channels, std::move(kernel_size), o.stride, o.padding, o.dilation, o.groups, o.bias) {}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, Ints stride, Padding padding,
               Ints dilation, int64_t groups, bool bias)
    : Module("Conv2d"), in_(in_channels), out_(out_channels), groups_(groups),
      kernel_(kernel_size.expand(2, "Conv2d", "kernel_size")), stride_(stride.expand(2, "Conv2d", "stride")),
      dilation_(dilation.expand(2, "Conv2d", "dilation")), same_(padding.is_same()) {
  check_channels("Conv2d", in_, out_, groups_);
  check_at_least("Conv2d", "kernel_size", kernel_, 1);
  check_at_least("Conv2d", "stride", stride_, 1);
  check_at_least("Conv2d", "dilation", dilation_, 1);
  BRAID_CHECK(!same_ || (stride_[0] == 1 && stride_[1] == 1), "Conv2d: padding='same' is not supported for strided "
              "convolutions (stride=", tuple(stride_), ")");
  // {top, bottom, left, right} for 'same', split as PyTorch splits it.
  padding_ = same_ ? conv_padding_same(kernel_, dilation_) : padding.sizes().expand(2, "Conv2d", "padding");
  check_at_least("Conv2d", "padding", padding_, 0);
  weight_ = register_parameter("weight", empty({out_, in_ / groups_, kernel_[0], kernel_[1]}, kFloat32, default_device()));
  if (bias) bias_ = register_parameter("bias", empty({out_}, kFloat32, default_device()));
  init_conv(weight_, bias_);
}

Tensor Conv2d::forward(const Tensor& x) {
  Tensor xb = batched_input("Conv2d", x, 2, in_);
  return unbatch_like(conv2d(xb, weight_, bias_, stride_, padding_, dilation_, groups_), x, 2);
}

std::string Conv2d::describe() const {
  std::ostringstream os;
  os << "Conv2d(" << in_ << ", " << out_ << ", kernel_size=" << tuple(kernel_) << ", stride=" << tuple(stride_);
  if (same_) os << ", padding=same";
  else if (padding_ != std::vector<int64_t>{0, 0}) os << ", padding=" << tuple(padding_);
  if (dilation_ != std::vector<int64_t>{1, 1}) os << ", dilation=" << tuple(dilation_);
  if (groups_ != 1) os << ", groups=" << groups_;
  if (!bias_.defined()) os << ", bias=False";
  os << ")";
  return os.str();
}

Conv2dConfig Conv2d::config() const {
  return {in_, out_, kernel_, {stride_, same_ ? Padding("same") : Padding(padding_), dilation_, groups_, bias_.defined()}};
}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, Ints kernel_size,
                                 const ConvTranspose2dOptions& o)
    : ConvTranspose2d(in_channels, out_channels, std::move(kernel_size), o.stride, o.padding, o.output_padding, o.groups,
                      o.bias, o.dilation) {}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, Ints kernel_size, Ints stride,
                                 Ints padding, Ints output_padding, int64_t groups, bool bias, Ints dilation)
    : Module("ConvTranspose2d"), in_(in_channels), out_(out_channels), groups_(groups),
      kernel_(kernel_size.expand(2, "ConvTranspose2d", "kernel_size")),
      stride_(stride.expand(2, "ConvTranspose2d", "stride")), padding_(padding.expand(2, "ConvTranspose2d", "padding")),
      output_padding_(output_padding.expand(2, "ConvTranspose2d", "output_padding")),
      dilation_(dilation.expand(2, "ConvTranspose2d", "dilation")) {
  check_channels("ConvTranspose2d", in_, out_, groups_);
  check_at_least("ConvTranspose2d", "kernel_size", kernel_, 1);
  check_at_least("ConvTranspose2d", "stride", stride_, 1);
  check_at_least("ConvTranspose2d", "dilation", dilation_, 1);
  check_at_least("ConvTranspose2d", "padding", padding_, 0);
  check_at_least("ConvTranspose2d", "output_padding", output_padding_, 0);
  for (int i = 0; i < 2; ++i)
    BRAID_CHECK(output_padding_[i] < stride_[i] || output_padding_[i] < dilation_[i],
                "ConvTranspose2d: output_padding ", tuple(output_padding_), " must be smaller than stride ",
                tuple(stride_), " or dilation ", tuple(dilation_));
  weight_ = register_parameter("weight", empty({in_, out_ / groups_, kernel_[0], kernel_[1]}, kFloat32, default_device()));
  if (bias) bias_ = register_parameter("bias", empty({out_}, kFloat32, default_device()));
  init_conv(weight_, bias_);
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  Tensor xb = batched_input("ConvTranspose2d", x, 2, in_);
  Tensor y = conv_transpose2d(xb, weight_, bias_, stride_, padding_, output_padding_, groups_, dilation_);
  return unbatch_like(y, x, 2);
}

std::string ConvTranspose2d::describe() const {
  std::ostringstream os;
  os << "ConvTranspose2d(" << in_ << ", " << out_ << ", kernel_size=" << tuple(kernel_) << ", stride=" << tuple(stride_);
  if (padding_ != std::vector<int64_t>{0, 0}) os << ", padding=" << tuple(padding_);
  if (output_padding_ != std::vector<int64_t>{0, 0}) os << ", output_padding=" << tuple(output_padding_);
  if (dilation_ != std::vector<int64_t>{1, 1}) os << ", dilation=" << tuple(dilation_);
  if (groups_ != 1) os << ", groups=" << groups_;
  if (!bias_.defined()) os << ", bias=False";
  os << ")";
  return os.str();
}

}  // namespace braid::nn
