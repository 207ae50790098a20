// float16 and bfloat16 arithmetic (Note [Half arithmetic] in src/backend/backend.h) against NumPy's
// float16 and PyTorch's bfloat16, whose kernels compute each element in float32 and round once, as
// braid's do: tests/data/half_reference.txt, made by make_half_reference.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "braid/ops.h"
#include "test_device.h"
#include "test_paths.h"

namespace braid {
namespace {

using Values = std::vector<double>;

// dtype name -> value name -> values.
const std::map<std::string, std::map<std::string, Values>>& reference() {
  static const auto ref = [] {
    std::map<std::string, std::map<std::string, Values>> m;
    for (const std::vector<std::string>& row : test::data_rows("half_reference.txt")) {
      Values& v = m[row.at(0)][row.at(1)];
      for (size_t i = 2; i < row.size(); ++i) v.push_back(std::strtod(row[i].c_str(), nullptr));
    }
    return m;
  }();
  return ref;
}

// The distance between neighbouring values of dtype near v (its ulp).
double ulp(double v, DType t) {
  const int bits = t == kBFloat16 ? 8 : 11, emin = t == kBFloat16 ? -126 : -14;
  int e = 0;
  std::frexp(v == 0 ? 1.0 : v, &e);
  return std::ldexp(1.0, std::max(e - 1, emin) - (bits - 1));
}

class HalfArithmetic : public ::testing::TestWithParam<DType> {
 protected:
  const std::map<std::string, Values>& ref() const { return reference().at(dtype_name(GetParam())); }
  Tensor grid(const std::string& name) const {
    const Values& v = ref().at(name);
    return tensor(std::vector<double>(v.begin(), v.end()), {4, 16}).to(GetParam()).to(test::test_device());
  }
  // got has the half dtype and equals the reference exactly, or within `ulps` of its ulp.
  void expect(const Tensor& got, const std::string& name, double ulps) const {
    ASSERT_EQ(got.dtype(), GetParam()) << name;
    const Values g = got.to(kFloat64).contiguous().to_vector<double>(), & want = ref().at(name);
    ASSERT_EQ(g.size(), want.size()) << name;
    for (size_t i = 0; i < g.size(); ++i)
      EXPECT_LE(std::fabs(g[i] - want[i]), ulps * ulp(want[i], GetParam())) << name << " element " << i;
  }
};

TEST_P(HalfArithmetic, CorrectlyRoundedOpsAreExact) {
  const Tensor x = grid("x"), y = grid("y");
  expect(x + y, "add", 0);
  expect(x - y, "sub", 0);
  expect(x * y, "mul", 0);
  expect(x / y, "div", 0);
  expect(maximum(x, y), "maximum", 0);
  expect(sqrt(abs(x)), "sqrt", 0);
}

// exp and tanh are float32 functions whose last bit differs between libraries; rounded to half they
// agree but where the float32 value lies within that bit of a tie.
TEST_P(HalfArithmetic, TranscendentalsAreTheFloat32FunctionRoundedOnce) {
  const Tensor x = grid("x");
  expect(exp(x), "exp", 1);
  expect(tanh(x), "tanh", 1);
}

// Reductions accumulate in float32 (a half accumulator would lose the small terms) and round once.
TEST_P(HalfArithmetic, ReductionsAccumulateInFloat32) {
  const Tensor x = grid("x");
  expect(sum(x, {1}), "sum", 1);
  expect(mean(x, {1}), "mean", 1);
  expect(amax(x, {1}), "amax", 0);
  // 2048 + 64 ones: float16's spacing at 2048 is 2, so a float16 accumulator would stay at 2048.
  const Tensor big = concat({full({1}, 2048.0, GetParam()), ones({64}, GetParam())}, 0).to(test::test_device());
  EXPECT_EQ(sum(big).to(kFloat64).item(), 2112.0);
}

// The gradient of a half op is half, and flows to a float32 leaf in float32 (the engine casts).
TEST_P(HalfArithmetic, GradientsKeepEachTensorsDtype) {
  const Tensor leaf = tensor(std::vector<float>{0.5f, -1.25f, 2.0f}, {3}).to(test::test_device()).set_requires_grad();
  const Tensor h = leaf.to(GetParam());
  const Tensor loss = sum(h * h).to(kFloat32);  // d/dleaf = 2 h
  loss.backward();
  ASSERT_EQ(leaf.grad().dtype(), kFloat32);
  EXPECT_EQ(leaf.grad().to_vector<double>(), (std::vector<double>{1.0, -2.5, 4.0}));
}

// torch.promote_types for the half types (NumPy has no bfloat16; for float16 it agrees).
TEST(HalfPromotion, FollowsTorch) {
  EXPECT_EQ(promote_types(kFloat16, kFloat16), kFloat16);
  EXPECT_EQ(promote_types(kBFloat16, kBFloat16), kBFloat16);
  EXPECT_EQ(promote_types(kFloat16, kBFloat16), kFloat32);
  EXPECT_EQ(promote_types(kBFloat16, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kFloat16, kFloat64), kFloat64);
  EXPECT_EQ(promote_types(kInt64, kBFloat16), kBFloat16);
  EXPECT_EQ(promote_types(kFloat16, kBool), kFloat16);
  EXPECT_EQ(promote_types(kInt8, kUInt8), kInt32) << "int8 and uint8 count as int32 (torch: int16)";
}

INSTANTIATE_TEST_SUITE_P(Half, HalfArithmetic, ::testing::Values(kFloat16, kBFloat16),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace braid
