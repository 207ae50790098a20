// Pooling layers over max_pool2d / avg_pool2d / adaptive_avg_pool2d. They accept (N, C, H, W) or
// unbatched (C, H, W) input, as PyTorch's do; the ops check windows against the input size.
#include <sstream>

#include "braid/conv.h"
#include "braid/nn/layers.h"
#include "util.h"

namespace braid::nn {

using detail::check_at_least;
using detail::tuple;

namespace {

Tensor batched(const char* layer, const Tensor& x) {
  BRAID_CHECK(x.dim() == 3 || x.dim() == 4, layer, ": expected a 4-d (N, C, H, W) or 3-d (C, H, W) input, got shape ",
              shape_str(x.shape()));
  return x.dim() == 4 ? x : x.unsqueeze(0);
}

Tensor unbatch_like(const Tensor& y, const Tensor& x) { return x.dim() == 3 ? y.squeeze(0) : y; }

/// The stride that defaults to the kernel size when not given.
std::vector<int64_t> stride_or_kernel(const Ints& stride, const std::vector<int64_t>& kernel, const char* layer) {
  return stride.values().empty() ? kernel : stride.expand(2, layer, "stride");
}

}  // namespace

MaxPool2d::MaxPool2d(Ints kernel_size, const MaxPool2dOptions& o)
    : MaxPool2d(std::move(kernel_size), o.stride, o.padding, o.dilation, o.ceil_mode) {}

MaxPool2d::MaxPool2d(Ints kernel_size, Ints stride, Ints padding, Ints dilation, bool ceil_mode)
    : Module("MaxPool2d"), kernel_(kernel_size.expand(2, "MaxPool2d", "kernel_size")),
      stride_(stride_or_kernel(stride, kernel_, "MaxPool2d")), padding_(padding.expand(2, "MaxPool2d", "padding")),
      dilation_(dilation.expand(2, "MaxPool2d", "dilation")), ceil_mode_(ceil_mode) {
  check_at_least("MaxPool2d", "kernel_size", kernel_, 1);
  check_at_least("MaxPool2d", "stride", stride_, 1);
  check_at_least("MaxPool2d", "dilation", dilation_, 1);
  check_at_least("MaxPool2d", "padding", padding_, 0);
  for (int i = 0; i < 2; ++i)
    BRAID_CHECK(2 * padding_[i] <= kernel_[i], "MaxPool2d: padding ", tuple(padding_),
                " must be at most half of kernel_size ", tuple(kernel_));
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return unbatch_like(max_pool2d(batched("MaxPool2d", x), kernel_, stride_, padding_, dilation_, ceil_mode_), x);
}

std::string MaxPool2d::describe() const {
  std::ostringstream os;
  os << "MaxPool2d(kernel_size=" << tuple(kernel_) << ", stride=" << tuple(stride_) << ", padding=" << tuple(padding_)
     << ", dilation=" << tuple(dilation_) << ", ceil_mode=" << detail::py_bool(ceil_mode_) << ")";
  return os.str();
}

AvgPool2d::AvgPool2d(Ints kernel_size, const AvgPool2dOptions& o)
    : AvgPool2d(std::move(kernel_size), o.stride, o.padding, o.ceil_mode, o.count_include_pad) {}

AvgPool2d::AvgPool2d(Ints kernel_size, Ints stride, Ints padding, bool ceil_mode, bool count_include_pad)
    : Module("AvgPool2d"), kernel_(kernel_size.expand(2, "AvgPool2d", "kernel_size")),
      stride_(stride_or_kernel(stride, kernel_, "AvgPool2d")), padding_(padding.expand(2, "AvgPool2d", "padding")),
      ceil_mode_(ceil_mode), count_include_pad_(count_include_pad) {
  check_at_least("AvgPool2d", "kernel_size", kernel_, 1);
  check_at_least("AvgPool2d", "stride", stride_, 1);
  check_at_least("AvgPool2d", "padding", padding_, 0);
  for (int i = 0; i < 2; ++i)
    BRAID_CHECK(2 * padding_[i] <= kernel_[i], "AvgPool2d: padding ", tuple(padding_),
                " must be at most half of kernel_size ", tuple(kernel_));
}

Tensor AvgPool2d::forward(const Tensor& x) {
  Tensor y = avg_pool2d(batched("AvgPool2d", x), kernel_, stride_, padding_, ceil_mode_, count_include_pad_);
  return unbatch_like(y, x);
}

std::string AvgPool2d::describe() const {
  std::ostringstream os;
  os << "AvgPool2d(kernel_size=" << tuple(kernel_) << ", stride=" << tuple(stride_) << ", padding=" << tuple(padding_)
     << ", ceil_mode=" << detail::py_bool(ceil_mode_) << ", count_include_pad=" << detail::py_bool(count_include_pad_)
     << ")";
  return os.str();
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Ints output_size)
    : Module("AdaptiveAvgPool2d"), output_size_(output_size.expand(2, "AdaptiveAvgPool2d", "output_size")) {
  check_at_least("AdaptiveAvgPool2d", "output_size", output_size_, 1);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return unbatch_like(adaptive_avg_pool2d(batched("AdaptiveAvgPool2d", x), output_size_), x);
}

std::string AdaptiveAvgPool2d::describe() const {
  return "AdaptiveAvgPool2d(output_size=" + tuple(output_size_) + ")";
}

}  // namespace braid::nn
