// Tests of braid/conv.h against independent numbers: float64 central-difference gradient checks of
// every op and configuration; PyTorch's outputs and gradients (tests/data/conv_reference.txt and
// conv_pool_reference.txt, written by make_conv_reference.py) in float64 and float32; a direct
// loop convolution and adjoint identities at sizes where the kernels run multi-threaded; and the
// front door's error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "ops/fused.h"
#include "test_paths.h"

namespace braid {
namespace {

using testing::Fn;
using V = const std::vector<Tensor>&;

// ---- float64 central differences ----

struct GradCase {
  std::string name;
  std::vector<Shape> shapes;
  Fn f;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

std::vector<GradCase> grad_cases() {
  return {
      {"conv2d_basic", {{2, 3, 5, 4}, {4, 3, 3, 3}, {4}}, [](V x) { return conv2d(x[0], x[1], x[2]); }},
      {"conv2d_no_bias", {{2, 3, 5, 5}, {4, 3, 3, 3}}, [](V x) { return conv2d(x[0], x[1], Tensor()); }},
      {"conv2d_stride2_pad1", {{2, 3, 6, 5}, {4, 3, 3, 3}, {4}},
       [](V x) { return conv2d(x[0], x[1], x[2], {2, 2}, {1, 1}); }},
      {"conv2d_rect_stride_pad", {{1, 2, 7, 6}, {3, 2, 2, 3}, {3}},
       [](V x) { return conv2d(x[0], x[1], x[2], {2, 1}, {0, 1}); }},
      {"conv2d_dilation2", {{1, 2, 7, 7}, {2, 2, 3, 3}, {2}},
       [](V x) { return conv2d(x[0], x[1], x[2], {1}, {2}, {2}); }},
      {"conv2d_dilation_stride_mixed", {{1, 2, 8, 7}, {2, 2, 2, 3}, {2}},
       [](V x) { return conv2d(x[0], x[1], x[2], {2, 3}, {1, 2}, {3, 2}); }},
      {"conv2d_groups2", {{2, 4, 4, 4}, {4, 2, 3, 3}, {4}},
       [](V x) { return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1}, {1, 1}, 2); }},
      {"conv2d_depthwise", {{2, 3, 5, 5}, {3, 1, 3, 3}, {3}},
       [](V x) { return conv2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 1}, 3); }},
      {"conv2d_depthwise_multiplier2", {{1, 2, 4, 4}, {4, 1, 3, 3}},
       [](V x) { return conv2d(x[0], x[1], Tensor(), {1, 1}, {1, 1}, {1, 1}, 2); }},
      {"conv2d_pointwise", {{2, 3, 3, 4}, {2, 3, 1, 1}, {2}}, [](V x) { return conv2d(x[0], x[1], x[2]); }},
      {"conv2d_asymmetric_padding", {{1, 2, 4, 5}, {2, 2, 2, 3}, {2}},
       [](V x) { return conv2d(x[0], x[1], x[2], {1, 1}, {0, 1, 2, 1}); }},
      {"conv2d_padding_same_even_kernel", {{1, 2, 5, 4}, {2, 2, 4, 2}, {2}},
       [](V x) { return conv2d(x[0], x[1], x[2], {1, 1}, conv_padding_same({4, 2}, {1, 1})); }},
      {"conv2d_unbatched", {{2, 4, 4}, {3, 2, 2, 2}, {3}}, [](V x) { return conv2d(x[0], x[1], x[2]); }},
      {"conv2d_strided_input", {{2, 4, 5, 3}, {2, 3, 2, 2}},
       [](V x) { return conv2d(x[0].permute({0, 3, 1, 2}), x[1], Tensor(), {1, 1}, {1, 0}); }},
      {"conv1d_basic", {{2, 3, 7}, {4, 3, 3}, {4}}, [](V x) { return conv1d(x[0], x[1], x[2]); }},
      {"conv1d_stride_pad_dilation", {{2, 2, 9}, {3, 2, 3}, {3}},
       [](V x) { return conv1d(x[0], x[1], x[2], 2, 2, 2); }},
      {"conv1d_groups_no_bias", {{1, 4, 6}, {4, 2, 2}},
       [](V x) { return conv1d(x[0], x[1], Tensor(), 1, 1, 1, 2); }},
      {"conv1d_unbatched", {{3, 6}, {2, 3, 3}, {2}}, [](V x) { return conv1d(x[0], x[1], x[2], 1, 1); }},
      {"conv_transpose2d_basic", {{2, 3, 3, 3}, {3, 2, 3, 3}, {2}},
       [](V x) { return conv_transpose2d(x[0], x[1], x[2]); }},
      {"conv_transpose2d_stride2_outpad1", {{1, 2, 3, 3}, {2, 3, 3, 3}, {3}},
       [](V x) { return conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 1}); }},
      {"conv_transpose2d_groups2", {{1, 4, 3, 3}, {4, 1, 2, 2}, {2}},
       [](V x) { return conv_transpose2d(x[0], x[1], x[2], {2, 1}, {0, 0}, {1, 0}, 2); }},
      // Stride equal to the kernel: the tiles path (Note [Transposed convolution without overlap]).
      {"conv_transpose2d_tiles", {{2, 3, 3, 4}, {3, 2, 2, 2}, {2}},
       [](V x) { return conv_transpose2d(x[0], x[1], x[2], {2, 2}); }},
      {"conv_transpose2d_dilation", {{1, 2, 3, 3}, {2, 2, 2, 3}, {2}},
       [](V x) { return conv_transpose2d(x[0], x[1], x[2], {1, 1}, {1, 0}, {0, 0}, 1, {2, 2}); }},
      {"conv_transpose2d_outpad_below_dilation", {{1, 2, 3, 3}, {2, 2, 2, 2}},
       [](V x) { return conv_transpose2d(x[0], x[1], Tensor(), {1, 1}, {0, 0}, {2, 1}, 1, {3, 3}); }},
      {"max_pool2d_k2s2", {{2, 2, 4, 4}}, [](V x) { return max_pool2d(x[0], {2, 2}); }},
      {"max_pool2d_k3s2p1", {{1, 2, 5, 5}}, [](V x) { return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}); }},
      {"max_pool2d_overlapping", {{1, 2, 5, 4}}, [](V x) { return max_pool2d(x[0], {3, 2}, {1, 1}); }},
      {"max_pool2d_dilation", {{1, 2, 6, 5}}, [](V x) { return max_pool2d(x[0], {2, 3}, {1, 2}, {1, 1}, {2, 2}); }},
      {"max_pool2d_ceil_mode", {{1, 2, 5, 6}}, [](V x) { return max_pool2d(x[0], {3, 2}, {2, 2}, {0, 0}, {1, 1}, true); }},
      {"max_pool2d_ceil_mode_pad", {{1, 1, 6, 6}},
       [](V x) { return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true); }},
      {"max_pool2d_unbatched", {{2, 4, 4}}, [](V x) { return max_pool2d(x[0], {2}); }},
      {"avg_pool2d_k2s2", {{2, 2, 4, 4}}, [](V x) { return avg_pool2d(x[0], {2, 2}); }},
      {"avg_pool2d_include_pad", {{1, 2, 5, 4}}, [](V x) { return avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}); }},
      {"avg_pool2d_exclude_pad", {{1, 2, 5, 4}},
       [](V x) { return avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, false, false); }},
      {"avg_pool2d_ceil_include_pad", {{1, 2, 6, 5}},
       [](V x) { return avg_pool2d(x[0], {3, 2}, {2, 2}, {1, 1}, true, true); }},
      {"avg_pool2d_ceil_exclude_pad", {{1, 2, 6, 5}},
       [](V x) { return avg_pool2d(x[0], {3, 2}, {2, 2}, {1, 1}, true, false); }},
      {"adaptive_avg_pool2d_non_divisible", {{1, 2, 5, 7}}, [](V x) { return adaptive_avg_pool2d(x[0], {3, 4}); }},
      {"adaptive_avg_pool2d_divisible", {{1, 2, 6, 4}}, [](V x) { return adaptive_avg_pool2d(x[0], {3, 2}); }},
      {"adaptive_avg_pool2d_global", {{2, 3, 3, 4}}, [](V x) { return adaptive_avg_pool2d(x[0], {1}); }},
      {"adaptive_avg_pool2d_upsampling", {{1, 1, 3, 2}}, [](V x) { return adaptive_avg_pool2d(x[0], {4, 3}); }},
      {"conv_relu_pool_chain", {{1, 2, 6, 6}, {3, 2, 3, 3}, {3}},
       [](V x) { return avg_pool2d(tanh(conv2d(x[0], x[1], x[2], {1, 1}, {1, 1})), {2, 2}); }},
  };
}

class ConvGradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(ConvGradCheck, MatchesCentralDifferences) {
  const GradCase& c = GetParam();
  Generator gen(std::hash<std::string>{}(c.name));
  std::vector<Tensor> inputs;
  for (const Shape& s : c.shapes) inputs.push_back(randn(s, kFloat64, &gen));
  std::string where;
  double err = testing::gradcheck_error(c.f, inputs, 1e-6, &where);
  EXPECT_LE(err, 1e-6) << c.name << ": worst at " << where;
}

INSTANTIATE_TEST_SUITE_P(Conv, ConvGradCheck, ::testing::ValuesIn(grad_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// ---- PyTorch references ----

struct RefCase {
  std::string name;
  std::map<std::string, std::vector<int64_t>> params;
  std::map<std::string, Tensor> tensors;
  std::string op() const { return name.substr(0, name.find('/')); }
  const std::vector<int64_t>& p(const std::string& key) const { return params.at(key); }
};

void PrintTo(const RefCase& c, std::ostream* os) { *os << c.name; }

std::vector<RefCase> load_reference(const std::string& file) {
  std::ifstream in(std::string(braid::test::data_dir()) + "/" + file);
  std::vector<RefCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "case") {
      cases.emplace_back();
      ls >> cases.back().name;
    } else if (kind == "param") {
      std::string key;
      ls >> key;
      std::vector<int64_t>& v = cases.back().params[key];
      for (int64_t e; ls >> e;) v.push_back(e);
    } else if (kind == "tensor") {
      std::string key, shape_text;
      ls >> key >> shape_text;
      Shape shape;
      std::istringstream ss(shape_text);
      for (std::string d; std::getline(ss, d, ',');) shape.push_back(std::stoll(d));
      std::vector<double> values;
      for (double e; ls >> e;) values.push_back(e);
      cases.back().tensors[key] = tensor(values, shape);
    }
  }
  return cases;
}

std::vector<RefCase> all_reference_cases() {
  std::vector<RefCase> cases = load_reference("conv_reference.txt");
  for (RefCase& c : load_reference("conv_pool_reference.txt")) cases.push_back(std::move(c));
  return cases;
}

Tensor run_reference_op(const RefCase& c, const std::map<std::string, Tensor>& in) {
  const Tensor& x = in.at("x");
  const Tensor w = in.count("weight") ? in.at("weight") : Tensor();
  const Tensor b = in.count("bias") ? in.at("bias") : Tensor();
  const std::string op = c.op();
  if (op == "conv2d") return conv2d(x, w, b, c.p("stride"), c.p("padding"), c.p("dilation"), c.p("groups")[0]);
  if (op == "conv2d_same")
    return conv2d(x, w, b, {1, 1}, conv_padding_same({w.size(2), w.size(3)}, c.p("dilation")), c.p("dilation"));
  if (op == "conv1d") return conv1d(x, w, b, c.p("stride")[0], c.p("padding")[0], c.p("dilation")[0], c.p("groups")[0]);
  if (op == "conv_transpose2d")
    return conv_transpose2d(x, w, b, c.p("stride"), c.p("padding"), c.p("output_padding"), c.p("groups")[0],
                            c.p("dilation"));
  if (op == "max_pool2d")
    return max_pool2d(x, c.p("kernel"), c.p("stride"), c.p("padding"), c.p("dilation"), c.p("ceil_mode")[0] != 0);
  if (op == "avg_pool2d")
    return avg_pool2d(x, c.p("kernel"), c.p("stride"), c.p("padding"), c.p("ceil_mode")[0] != 0,
                      c.p("count_include_pad")[0] != 0);
  if (op == "adaptive_avg_pool2d") return adaptive_avg_pool2d(x, c.p("output_size"));
  throw std::runtime_error("reference case " + c.name + " has an unknown op");
}

// |got - want| <= atol + rtol * |want| everywhere, reporting the first element that is not.
void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << " is undefined";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::fabs(g[i] - w[i]), atol + rtol * std::fabs(w[i]))
        << what << " element " << i << ": got " << g[i] << ", PyTorch " << w[i];
}

class ConvReference : public ::testing::TestWithParam<RefCase> {};

void check_reference(const RefCase& c, DType dtype, double rtol, double atol) {
  std::map<std::string, Tensor> inputs;
  for (const char* k : {"x", "weight", "bias"})
    if (c.tensors.count(k)) inputs[k] = c.tensors.at(k).to(dtype).set_requires_grad();
  Tensor out = run_reference_op(c, inputs);
  EXPECT_EQ(out.dtype(), dtype);
  expect_close(out, c.tensors.at("out"), rtol, atol, "out");
  out.backward(c.tensors.at("grad_out").to(dtype));
  for (const auto& [k, t] : inputs) expect_close(t.grad(), c.tensors.at("grad_" + k), rtol, atol, "grad_" + k);
}

TEST_P(ConvReference, Float64MatchesPyTorch) { check_reference(GetParam(), kFloat64, 1e-10, 1e-12); }

TEST_P(ConvReference, Float32MatchesPyTorch) { check_reference(GetParam(), kFloat32, 1e-4, 1e-4); }

INSTANTIATE_TEST_SUITE_P(Conv, ConvReference, ::testing::ValuesIn(all_reference_cases()),
                         [](const ::testing::TestParamInfo<RefCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(ConvReferenceFiles, HoldEveryCase) {
  EXPECT_EQ(load_reference("conv_reference.txt").size(), 23u);
  EXPECT_EQ(load_reference("conv_pool_reference.txt").size(), 14u);
}

// ---- larger shapes (above the CPU kernels' parallel grain of 32768 elements, so they run on all
// threads): a direct loop and adjoint identities ----

// out[n][o][y][x] = b[o] + sum over the group's channels and taps, written as the definition.
std::vector<double> direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t sh, int64_t sw, int64_t p,
                                  int64_t d, int64_t groups, int64_t oh, int64_t ow) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), co = w.size(0), cg = w.size(1);
  const int64_t kh = w.size(2), kw = w.size(3), cog = co / groups;
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(n * co * oh * ow));
  for (int64_t in = 0; in < n; ++in)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double acc = bv[o];
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = y * sh - p + i * d, ix = xx * sw - p + j * d, ch = o / cog * cg + ci;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += xv[((in * c + ch) * h + iy) * wd + ix] * wv[((o * cg + ci) * kh + i) * kw + j];
              }
          out[((in * co + o) * oh + y) * ow + xx] = acc;
        }
  return out;
}

double dot(const Tensor& a, const Tensor& b) { return sum(a * b).item(); }

TEST(ConvLarge, Conv2dMatchesDirectLoopAndAdjointIdentities) {
  Generator gen(11);
  for (int64_t groups : {1, 2}) {
    Tensor x = randn({4, 8, 16, 15}, kFloat64, &gen).set_requires_grad();
    Tensor w = randn({6, 8 / groups, 3, 3}, kFloat64, &gen).set_requires_grad();
    Tensor b = randn({6}, kFloat64, &gen).set_requires_grad();
    Tensor y = conv2d(x, w, b, {1, 2}, {2, 2}, {2, 2}, groups);
    ASSERT_EQ(y.shape(), (Shape{4, 6, 16, 8}));
    expect_close(y, tensor(direct_conv2d(x, w, b, 1, 2, 2, 2, groups, 16, 8), y.shape()), 1e-12, 1e-12, "conv2d");
    Tensor g = randn(y.shape(), kFloat64, &gen);
    y.backward(g);
    // y is affine in each argument: <g, y - b> = <grad_x, x> = <grad_w, w>, and grad_b = sum of g.
    NoGradGuard no_grad;
    const double gy = dot(g, y) - dot(sum(g, {0, 2, 3}), b);
    EXPECT_NEAR(dot(x.grad(), x), gy, 1e-9 * std::fabs(gy));
    EXPECT_NEAR(dot(w.grad(), w), gy, 1e-9 * std::fabs(gy));
    expect_close(b.grad(), sum(g, {0, 2, 3}), 1e-12, 1e-12, "grad_bias");
  }
}

// The forward fast paths (Note [Convolution fast paths]): depthwise (with a channel multiplier,
// stride, padding and dilation) and 1x1, against the definition; large enough to run threaded.
TEST(ConvLarge, DepthwiseAndPointwiseFastPathsMatchDirectLoop) {
  Generator gen(12);
  for (int64_t mult : {1, 2}) {
    Tensor x = randn({3, 8, 17, 16}, kFloat64, &gen);
    Tensor w = randn({8 * mult, 1, 3, 3}, kFloat64, &gen);
    Tensor b = randn({8 * mult}, kFloat64, &gen);
    Tensor y = conv2d(x, w, b, {2, 2}, {2, 2}, {2, 2}, 8);
    ASSERT_EQ(y.shape(), (Shape{3, 8 * mult, 9, 8}));
    expect_close(y, tensor(direct_conv2d(x, w, b, 2, 2, 2, 2, 8, 9, 8), y.shape()), 1e-12, 1e-12, "depthwise");
    Tensor nb = conv2d(x, w, Tensor(), {1, 1}, {1, 1}, {1, 1}, 8);
    expect_close(nb, tensor(direct_conv2d(x, w, zeros({8 * mult}, kFloat64), 1, 1, 1, 1, 8, 17, 16), nb.shape()), 1e-12,
                 1e-12, "depthwise without bias");
  }
  Tensor x = randn({3, 16, 12, 11}, kFloat64, &gen);
  Tensor w = randn({24, 16, 1, 1}, kFloat64, &gen);
  Tensor b = randn({24}, kFloat64, &gen);
  Tensor y = conv2d(x, w, b);
  expect_close(y, tensor(direct_conv2d(x, w, b, 1, 1, 0, 1, 1, 12, 11), y.shape()), 1e-12, 1e-12, "1x1");
}

TEST(ConvLarge, ConvTransposeIsTheAdjointOfConv) {
  Generator gen(12);
  Tensor x = randn({4, 6, 33, 32}, kFloat64, &gen), w = randn({6, 3, 3, 3}, kFloat64, &gen);
  Tensor z = randn({4, 6, 17, 16}, kFloat64, &gen);
  Tensor y = conv2d(x, w, Tensor(), {2, 2}, {1, 1}, {1, 1}, 2);
  ASSERT_EQ(y.shape(), z.shape());
  Tensor t = conv_transpose2d(z, w, Tensor(), {2, 2}, {1, 1}, {0, 1}, 2);  // back to x's shape
  ASSERT_EQ(t.shape(), x.shape());
  const double lhs = dot(y, z), rhs = dot(x, t);
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::fabs(lhs));
}

// ---- float32 against float64 (Note [Fused kernels]) ----
// A backend's library kernels (oneDNN's on the CPU) take float32 convolutions, forward and both
// backward passes, while float64 always runs the composite im2col + GEMM path that the gradient
// checks above verify. Every geometry below, from ResNet and MobileNet layers to the edges (odd sizes
// whose last rows no window reads, asymmetric padding, dilation, groups, one channel in, a batch of
// one), must give float32 results within float32 rounding of float64's. (The suite runs with
// BRAID_ONEDNN_MIN_MACS=0, so that these small shapes take the library kernels too.)

struct Geometry32 {
  const char* name;
  Shape x, w;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

// max |got - want| <= tol * max |want|, the float32 error of sums of many products.
void expect_float32_of(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), kFloat32) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0, err = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    scale = std::max(scale, std::fabs(w[i]));
    err = std::max(err, std::fabs(g[i] - w[i]));
  }
  EXPECT_LE(err, 2e-5 * scale) << what << ": max error " << err << " for values up to " << scale;
}

TEST(ConvFloat32, MatchesFloat64ForwardAndBackward) {
  const std::vector<Geometry32> cases = {
      {"resnet_3x3", {4, 32, 14, 14}, {64, 32, 3, 3}, {1}, {1}, {1}, 1, false},
      {"resnet_3x3_stride2", {2, 64, 15, 15}, {32, 64, 3, 3}, {2}, {1}, {1}, 1, true},
      {"stem_7x7", {2, 3, 40, 40}, {16, 3, 7, 7}, {2}, {3}, {1}, 1, false},
      {"one_channel_in", {3, 1, 28, 28}, {8, 1, 5, 5}, {1}, {2}, {1}, 1, true},
      {"pointwise", {2, 48, 9, 9}, {24, 48, 1, 1}, {1}, {0}, {1}, 1, true},
      {"pointwise_stride2", {2, 16, 9, 9}, {32, 16, 1, 1}, {2}, {0}, {1}, 1, false},
      {"depthwise", {2, 32, 13, 13}, {32, 1, 3, 3}, {1}, {1}, {1}, 32, true},
      {"depthwise_stride2_multiplier", {2, 16, 12, 12}, {32, 1, 5, 5}, {2}, {2}, {1}, 16, false},
      {"groups4", {2, 32, 10, 9}, {16, 8, 3, 3}, {1}, {1}, {1}, 4, true},
      {"dilation2", {2, 16, 17, 16}, {16, 16, 3, 3}, {1}, {2}, {2}, 1, true},
      {"unread_last_rows", {2, 8, 9, 10}, {16, 8, 2, 2}, {2}, {0}, {1}, 1, true},
      {"asymmetric_padding", {1, 16, 11, 12}, {8, 16, 3, 2}, {1, 2}, {0, 1, 2, 1}, {1}, 1, true},
      {"batch_of_one", {1, 24, 7, 7}, {24, 24, 3, 3}, {1}, {1}, {1}, 1, false},
  };
  Generator gen(21);
  for (const Geometry32& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = randn(c.x, kFloat64, &gen), w = randn(c.w, kFloat64, &gen);
    const Tensor b = c.bias ? randn({c.w[0]}, kFloat64, &gen) : Tensor();
    std::map<DType, std::vector<Tensor>> got;
    std::vector<std::string> names = {"output", "grad_input", "grad_weight"};
    if (c.bias) names.push_back("grad_bias");
    Tensor g;
    for (DType dt : {kFloat64, kFloat32}) {
      Tensor xs = x.to(dt).detach().set_requires_grad(), ws = w.to(dt).detach().set_requires_grad();
      Tensor bs = c.bias ? b.to(dt).detach().set_requires_grad() : Tensor();
      Tensor y = conv2d(xs, ws, bs, c.stride, c.padding, c.dilation, c.groups);
      if (!g.defined()) g = randn(y.shape(), kFloat64, &gen);
      y.backward(g.to(dt));
      got[dt] = {y, xs.grad(), ws.grad()};
      if (c.bias) got[dt].push_back(bs.grad());
      if (c.padding.size() == 4) continue;
      // conv_transpose2d of the output gradient with the same weight: the backward-data kernel run
      // forward, where it gives back x's shape (no output_padding needed).
      Tensor t = conv_transpose2d(g.to(dt), ws.detach(), Tensor(), c.stride, c.padding, {0}, c.groups, c.dilation);
      if (t.shape() != xs.shape()) continue;
      got[dt].push_back(t);
      if (dt == kFloat64) names.push_back("conv_transpose2d");
    }
    ASSERT_EQ(got[kFloat32].size(), got[kFloat64].size());
    for (size_t i = 0; i < got[kFloat32].size(); ++i) expect_float32_of(got[kFloat32][i], got[kFloat64][i], names[i]);
  }
}

TEST(ConvLarge, PoolingMatchesDirectLoopAndAdjoints) {
  Generator gen(13);
  Tensor x = randn({8, 16, 16, 15}, kFloat64, &gen).set_requires_grad();
  Tensor m = max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
  Tensor a = avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false, false);
  ASSERT_EQ(m.shape(), x.shape());
  std::vector<double> xv = x.to_vector<double>(), mv = m.to_vector<double>(), av = a.to_vector<double>();
  const int64_t h = 16, w = 15;
  for (int64_t plane = 0; plane < 8 * 16; plane += 7)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t xx = 0; xx < w; ++xx) {
        double mx = -INFINITY, total = 0;
        int count = 0;
        for (int64_t iy = std::max<int64_t>(0, y - 1); iy <= std::min(h - 1, y + 1); ++iy)
          for (int64_t ix = std::max<int64_t>(0, xx - 1); ix <= std::min(w - 1, xx + 1); ++ix) {
            mx = std::max(mx, xv[(plane * h + iy) * w + ix]);
            total += xv[(plane * h + iy) * w + ix];
            ++count;
          }
        ASSERT_EQ(mv[(plane * h + y) * w + xx], mx);
        ASSERT_NEAR(av[(plane * h + y) * w + xx], total / count, 1e-14);
      }
  Tensor gm = randn(m.shape(), kFloat64, &gen), ga = randn(a.shape(), kFloat64, &gen);
  m.backward(gm);
  Tensor grad_max = x.grad();
  x.set_grad(Tensor());
  a.backward(ga);
  Tensor grad_avg = x.grad();
  // Max pooling is linear in x near x (each output is one element of x), average pooling is linear.
  NoGradGuard no_grad;
  EXPECT_NEAR(dot(grad_max, x), dot(gm, m), 1e-10 * std::fabs(dot(gm, m)));
  EXPECT_NEAR(dot(grad_avg, x), dot(ga, a), 1e-10 * std::fabs(dot(ga, a)));
}

// ---- closed forms ----

TEST(ConvPaddingSame, SplitsTheSpanWithTheExtraAfter) {
  EXPECT_EQ(conv_padding_same({3, 4}, {1, 1}), (std::vector<int64_t>{1, 1, 1, 2}));
  EXPECT_EQ(conv_padding_same({4, 3}, {2, 3}), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(conv_padding_same({2}, {1}), (std::vector<int64_t>{0, 1}));
}

TEST(ConvClosedForm, MaxPoolRoutesGradientToTheWinner) {
  Tensor x = tensor(std::vector<double>{1, 5, 2, 0, 3, 4, 9, 8, 7, 6, -1, -2, 0, 0, 0, 0}, {1, 1, 4, 4})
                 .set_requires_grad();
  Tensor y = max_pool2d(x, {2, 2});
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{5, 9, 7, 0}));
  y.backward(tensor(std::vector<double>{10, 20, 30, 40}, {1, 1, 2, 2}));
  // The last window's maximum 0 is tied; the first of the tie (row 3, column 2) takes it, as in PyTorch.
  EXPECT_EQ(x.grad().to_vector<double>(),
            (std::vector<double>{0, 10, 0, 0, 0, 0, 20, 0, 30, 0, 0, 0, 0, 0, 40, 0}));
}

TEST(ConvClosedForm, MaxPoolPropagatesNaN) {
  Tensor x = tensor(std::vector<double>{1, NAN, 2, 3}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(x, {2, 2}).item()));
}

// In inference max pooling keeps no positions and takes a vectorised path: the same values as the
// path that tracks them (which the direct loop above checks), NaN included, for float32 and
// float64 and the windows of ResNet-18 (3x3, stride 2, padding 1) and of an overlapping pooling.
TEST(ConvClosedForm, MaxPoolValuesAloneEqualThePathWithPositions) {
  Generator gen(21);
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = randn({2, 3, 17, 20}, dt, &gen);
    x.view({-1}).narrow(0, 100, 1).fill_(NAN);
    x.view({-1}).narrow(0, 1500, 1).fill_(NAN);
    for (const auto& [k, st, pad] : std::vector<std::array<int64_t, 3>>{{3, 2, 1}, {3, 1, 1}, {2, 1, 0}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " kernel " << k << " stride " << st << " pad " << pad);
      const Tensor values = max_pool2d(x, {k, k}, {st, st}, {pad, pad});
      Tensor tracked_x = x.detach().clone().set_requires_grad();
      const Tensor tracked = max_pool2d(tracked_x, {k, k}, {st, st}, {pad, pad}).detach();
      const auto a = values.to_vector<double>(), b = tracked.to_vector<double>();
      ASSERT_EQ(a.size(), b.size());
      int64_t nans = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) {
          ++nans;
          EXPECT_TRUE(std::isnan(a[i])) << i;
        } else {
          EXPECT_EQ(a[i], b[i]) << i;
        }
      }
      EXPECT_GT(nans, 0);
    }
  }
}

TEST(ConvClosedForm, Conv2dRecordsOneNode) {
  Tensor x = randn({1, 2, 4, 4}, kFloat64).set_requires_grad();
  Tensor w = randn({3, 2, 3, 3}, kFloat64).set_requires_grad();
  EXPECT_EQ(conv2d(x, w, Tensor()).grad_fn_name(), "conv2d");
}

// ---- front-door errors ----

template <typename E, typename F>
void expect_error(F&& f, const std::string& expected) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected: " << expected;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << "message: " << e.what();
  }
}

TEST(ConvErrors, ChannelMismatchNamesShapes) {
  expect_error<ValueError>([] { conv2d(zeros({2, 3, 8, 8}), zeros({6, 4, 3, 3}), Tensor()); },
                           "conv2d: input has 3 channels but weight expects 4 (groups=1), input shape [2, 3, 8, 8], "
                           "weight shape [6, 4, 3, 3]");
  expect_error<ValueError>([] { conv1d(zeros({2, 3, 8}), zeros({6, 2, 3}), Tensor(), 1, 0, 1, 2); },
                           "conv1d: input has 3 channels but weight expects 4 (groups=2)");
  expect_error<ValueError>([] { conv_transpose2d(zeros({1, 3, 4, 4}), zeros({4, 2, 3, 3}), Tensor()); },
                           "conv_transpose2d: input has 3 channels but weight expects 4");
}

TEST(ConvErrors, KernelLargerThanPaddedInput) {
  expect_error<ValueError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 3}), Tensor(), {1}, {0, 0}); },
                           "conv2d: the kernel (spanning [5, 3] with dilation [1, 1]) is larger than the padded "
                           "input [4, 4]");
  expect_error<ValueError>([] { conv1d(zeros({1, 1, 4}), zeros({1, 1, 3}), Tensor(), 1, 0, 2); },
                           "conv1d: the kernel (spanning [5] with dilation [2]) is larger than the padded input [4]");
}

TEST(ConvErrors, BadArguments) {
  expect_error<ValueError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {0, 1}); },
                           "conv2d: stride must be positive, got [0, 1]");
  expect_error<ValueError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {1}, {-1}); },
                           "conv2d: padding must be non-negative");
  expect_error<ValueError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {1, 1, 1}); },
                           "conv2d: stride must have 1 or 2 values, got 3");
  expect_error<ValueError>([] { conv2d(zeros({1, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), {1}, {0}, {1}, 2); },
                           "conv2d: weight has 3 output channels, not divisible by groups=2");
  expect_error<ValueError>([] { conv2d(zeros({1, 4, 5, 5}), zeros({4, 4, 3, 3}), Tensor(), {1}, {0}, {1}, 0); },
                           "conv2d: groups must be positive, got 0");
  expect_error<ValueError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), zeros({3})); },
                           "conv2d: bias must have shape [2], got [3]");
  expect_error<ValueError>([] { conv2d(zeros({4, 4}), zeros({2, 1, 3, 3}), Tensor()); },
                           "conv2d: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape [4, 4]");
  expect_error<ValueError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3}), Tensor()); },
                           "conv2d: expected a 4-d weight, got shape [2, 1, 3]");
  expect_error<ValueError>(
      [] { conv_transpose2d(zeros({1, 2, 4, 4}), zeros({2, 2, 3, 3}), Tensor(), {2, 2}, {0, 0}, {2, 0}); },
      "conv_transpose2d: output_padding [2, 0] must be smaller than either stride [2, 2] or dilation [1, 1]");
}

TEST(ConvErrors, DtypesAreTypeErrors) {
  expect_error<TypeError>([] { conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}, kFloat64), Tensor()); },
                          "conv2d: input is float32 but weight is float64");
  expect_error<TypeError>([] { conv2d(zeros({1, 1, 4, 4}, kInt64), zeros({1, 1, 3, 3}, kInt64), Tensor()); },
                          "conv2d: input must be floating-point, got int64");
  expect_error<TypeError>([] { max_pool2d(zeros({1, 1, 4, 4}, kInt32), {2}); },
                          "max_pool2d: input must be floating-point, got int32");
}

TEST(ConvErrors, PoolingArguments) {
  expect_error<ValueError>([] { max_pool2d(zeros({1, 1, 6, 6}), {3, 3}, {1, 1}, {2, 2}); },
                           "max_pool2d: padding [2, 2] must be at most half the kernel size [3, 3]");
  expect_error<ValueError>([] { avg_pool2d(zeros({1, 1, 2, 2}), {3, 3}); },
                           "avg_pool2d: input shape [1, 1, 2, 2] is too small for kernel [3, 3]");
  expect_error<ValueError>([] { max_pool2d(zeros({1, 1, 1, 4}), {2, 1}, {1, 1}, {1, 0}, {2, 1}); },
                           "max_pool2d: window 0 along axis 2 covers only padding");
  expect_error<ValueError>([] { max_pool2d(zeros({1, 1, 4, 4}), {0, 2}); },
                           "max_pool2d: kernel_size must be positive");
  expect_error<ValueError>([] { adaptive_avg_pool2d(zeros({1, 1, 4, 4}), {-1, 2}); },
                           "adaptive_avg_pool2d: output_size must be non-negative, got [-1, 2]");
  // An output size of 0 gives an empty result, as in PyTorch.
  EXPECT_EQ(adaptive_avg_pool2d(zeros({1, 1, 4, 4}), {0, 2}).shape(), Shape({1, 1, 0, 2}));
}

// conv2d_activation: each epilogue, with and without the affine map after it, fused (nothing
// records: oneDNN's post-ops where the suite sends every float32 convolution) against the same
// composition of braid's ops; with gradients recording it is that composition.
TEST(ConvActivation, FusedEpiloguesEqualTheComposition) {
  Generator gen(21);
  const Tensor x = randn({2, 8, 9, 10}, kFloat32, &gen) * 2.0, b = randn({16}, kFloat32, &gen);
  // A 3x3 convolution, and a 1x1 one under oneDNN's threshold (Note [Small pointwise convolutions]).
  for (const auto& [k, stride, pad] : {std::tuple<int64_t, int64_t, int64_t>{3, 2, 1}, {1, 1, 0}}) {
    SCOPED_TRACE(std::to_string(k) + "x" + std::to_string(k));
    const Tensor w = randn({16, 8, k, k}, kFloat32, &gen, 0, 0.3);
    const Tensor z = conv2d(x.to(kFloat64), w.to(kFloat64), b.to(kFloat64), {stride, 1}, {pad, pad}).to(kFloat32);
    struct Case {
      std::string name;
      double a, b;
      Tensor want;
    };
    const std::vector<Case> cases = {{"relu", 0, 0, relu(z)},
                                     {"clip", -0.5, 0.75, clamp(z, -0.5, 0.75)},
                                     {"hardswish", 0, 0, z * clamp(z + 3.0, 0.0, 6.0) / 6.0},
                                     {"hardsigmoid", 0.25, 0.4, clamp(z * 0.25 + 0.4, 0.0, 1.0)}};
    for (const Case& c : cases)
      for (bool affine : {false, true}) {
        SCOPED_TRACE(c.name + (affine ? " then * 1.5 - 0.25" : ""));
        const double scale = affine ? 1.5 : 1.0, shift = affine ? -0.25 : 0.0;
        const Tensor want = affine ? c.want * 1.5 - 0.25 : c.want;
        const Tensor fused = [&] {
          NoGradGuard no_grad;
          return detail::conv2d_activation(x, w, b, {stride, 1}, {pad, pad}, {1, 1}, 1, c.name, c.a, c.b, scale, shift);
        }();
        EXPECT_TRUE(allclose(fused, want, 1e-5, 1e-5)) << "max |diff| " << amax(abs(fused - want)).item();
        Tensor wg = w.clone().set_requires_grad(true);
        const Tensor recorded =
            detail::conv2d_activation(x, wg, b, {stride, 1}, {pad, pad}, {1, 1}, 1, c.name, c.a, c.b, scale, shift);
        EXPECT_TRUE(recorded.requires_grad());
        EXPECT_TRUE(allclose(recorded.detach(), want, 1e-5, 1e-5));
      }
  }
}

// A 1x1 convolution at one pixel (a classifier's head after global pooling), batch 3, run by the
// CPU's pointwise kernel (HardSigmoid with an affine after it stays off oneDNN): rows of x by the
// transposed weight, twice (the second product reads the kept weight), against float64.
TEST(ConvActivation, PointwiseAtOnePixelMatchesFloat64) {
  Generator gen(23);
  const Tensor x = randn({3, 128, 1, 1}, kFloat32, &gen), w = randn({192, 128, 1, 1}, kFloat32, &gen, 0, 0.1);
  const Tensor b = randn({192}, kFloat32, &gen);
  const Tensor z = conv2d(x.to(kFloat64), w.to(kFloat64), b.to(kFloat64));
  const Tensor want = clamp(z * 0.25 + 0.4, 0.0, 1.0) * 1.5 - 0.25;
  NoGradGuard no_grad;
  const Tensor first = detail::conv2d_activation(x, w, b, {1, 1}, {0, 0}, {1, 1}, 1, "hardsigmoid", 0.25, 0.4, 1.5, -0.25);
  EXPECT_TRUE(allclose(first.to(kFloat64), want, 1e-5, 1e-5)) << amax(abs(first.to(kFloat64) - want)).item();
  const Tensor again = detail::conv2d_activation(x, w, b, {1, 1}, {0, 0}, {1, 1}, 1, "hardsigmoid", 0.25, 0.4, 1.5, -0.25);
  EXPECT_TRUE(equal(again, first));
}

// Note [Reordered weights kept]: a forward convolution large enough for oneDNN keeps its weight in
// the kernel's layout between calls, and an in-place change to the weight (a version bump) is
// seen by the next call. Against float64 convolutions of the same numbers.
TEST(ConvActivation, KeptWeightsFollowInPlaceChanges) {
  Generator gen(12);
  const Tensor x = randn({1, 16, 32, 32}, kFloat32, &gen);  // 4.7 M multiply-adds: oneDNN's
  Tensor w = randn({32, 16, 3, 3}, kFloat32, &gen, 0, 0.2);
  const Tensor b = randn({32}, kFloat32, &gen);
  NoGradGuard no_grad;
  const auto reference = [&] { return conv2d(x.to(kFloat64), w.to(kFloat64), b.to(kFloat64), {1, 1}, {1, 1}); };
  for (int run = 0; run < 2; ++run) {
    const Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
    EXPECT_TRUE(allclose(y.to(kFloat64), reference(), 1e-4, 1e-4)) << "run " << run;
  }
  w.mul_(-1.5);
  EXPECT_TRUE(allclose(conv2d(x, w, b, {1, 1}, {1, 1}).to(kFloat64), reference(), 1e-4, 1e-4));
  w.narrow(0, 3, 1).fill_(0.25);  // through a view
  const Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
  EXPECT_TRUE(allclose(y.to(kFloat64), reference(), 1e-4, 1e-4));
  // A view of the weight at another offset is another weight, not the kept one.
  Tensor both = randn({64, 16, 3, 3}, kFloat32, &gen, 0, 0.2);
  const Tensor top = both.narrow(0, 0, 32), bottom = both.narrow(0, 32, 32);
  const Tensor y_top = conv2d(x, top, b, {1, 1}, {1, 1}), y_bottom = conv2d(x, bottom, b, {1, 1}, {1, 1});
  EXPECT_TRUE(allclose(y_top.to(kFloat64), conv2d(x.to(kFloat64), top.to(kFloat64), b.to(kFloat64), {1, 1}, {1, 1}),
                       1e-4, 1e-4));
  EXPECT_TRUE(allclose(y_bottom.to(kFloat64),
                       conv2d(x.to(kFloat64), bottom.to(kFloat64), b.to(kFloat64), {1, 1}, {1, 1}), 1e-4, 1e-4));
}

}  // namespace
}  // namespace braid
