// Binary arithmetic, where and add_ of a float32 and a float16/bfloat16 operand, which the backends
// take as they are and widen on the load (Note [Half arithmetic] in src/backend/backend.h): bit for
// bit the values of casting the half operand to float32 first (the old path; widening is exact),
// and float32 values computed independently with Python's struct (make_mixed_reference below).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "braid/autograd.h"
#include "braid/ops.h"
#include "braid/random.h"
#include "test_device.h"

namespace braid {
namespace {

std::vector<uint32_t> bits(const Tensor& t) {
  EXPECT_EQ(t.dtype(), kFloat32);
  const std::vector<float> v = t.contiguous().to_vector<float>();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

using Op = std::function<Tensor(const Tensor&, const Tensor&)>;

struct Named {
  const char* name;
  Op op;
};

const std::vector<Named>& arithmetic() {
  static const std::vector<Named> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(abs(a), b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  return ops;
}

class MixedHalf : public ::testing::TestWithParam<DType> {
 protected:
  Device dev = test::test_device();
  Tensor f32(const Shape& s, uint64_t seed) const {
    Generator g(seed);
    return randn(s, kFloat32, &g, 0.0, 2.0, dev);
  }
  Tensor half(const Shape& s, uint64_t seed) const { return f32(s, seed).to(GetParam()); }
};

// Both orders, broadcast either way, and a transposed view: the op as it is equals the op on the
// half operand cast to float32 first, bit for bit (NaN and the signed zeros included).
TEST_P(MixedHalf, ArithmeticEqualsCastingFirst) {
  const Tensor x = f32({3, 4, 5}, 1), y_full = half({3, 4, 5}, 2), y_row = half({5}, 3);
  const Tensor x_col = f32({3, 4, 1}, 4), y_t = half({3, 5, 4}, 5).transpose(1, 2);
  for (const Named& n : arithmetic()) {
    for (const Tensor& y : {y_full, y_row, y_t}) {
      const Tensor y32 = y.to(kFloat32);
      EXPECT_EQ(bits(n.op(x, y)), bits(n.op(x, y32))) << n.name << " float32 first";
      EXPECT_EQ(bits(n.op(y, x)), bits(n.op(y32, x))) << n.name << " half first";
      EXPECT_EQ(bits(n.op(x_col, y)), bits(n.op(x_col, y32))) << n.name << " float32 broadcast";
    }
  }
}

// The backend's contract itself (backend.h): binary into a float32 out from a float32 and a half
// operand of out's shape, with special values in the half operand.
TEST_P(MixedHalf, BackendTakesTheMixedPair) {
  const std::vector<float> special = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, INFINITY, -INFINITY, NAN, 3.0f};
  const Tensor y = tensor(special, {10}, dev).to(GetParam());
  const Tensor x = f32({10}, 6), y32 = y.to(kFloat32);
  detail::Backend& be = detail::backend_for(dev);
  using detail::BinaryOp;
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow, BinaryOp::Max,
                      BinaryOp::Min}) {
    for (bool half_first : {false, true}) {
      const Tensor got = zeros({10}, kFloat32, dev), want = zeros({10}, kFloat32, dev);
      be.binary(op, half_first ? y : x, half_first ? x : y, got);
      be.binary(op, half_first ? y32 : x, half_first ? x : y32, want);
      EXPECT_EQ(bits(got), bits(want)) << "op " << static_cast<int>(op) << (half_first ? " half first" : "");
    }
  }
}

// float32 arithmetic on the float16 operand's exact value, from Python's struct module (NumPy's
// float32 ufuncs give the same: + - * / of two float32 values in double, rounded once to float32,
// is correctly rounded):
//   f32 = lambda v: struct.unpack('f', struct.pack('f', v))[0]
//   f16 = lambda v: struct.unpack('e', struct.pack('e', v))[0]
//   x = [f32(v) for v in [1.0000001, -3.14159265, 1e-3, 65504.0, 7.5, -0.1]]
//   y = [f16(v) for v in [0.333, 2.5, -7.1, 1e-4, 3.0, -0.1]]
//   [f32(op(a, b)) for a, b in zip(x, y)] and [f32(op(b, a)) ...], printed with '%.9g'.
TEST(MixedHalfReference, Float16MatchesFloat32ArithmeticOnTheExactValue) {
  const Device dev = test::test_device();
  const Tensor x = tensor(std::vector<float>{1.0000001f, -3.14159265f, 1e-3f, 65504.0f, 7.5f, -0.1f}, {6}, dev);
  const Tensor y = tensor(std::vector<float>{0.333f, 2.5f, -7.1f, 1e-4f, 3.0f, -0.1f}, {6}, dev).to(kFloat16);
  const auto expect = [](const Tensor& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.dtype(), kFloat32) << what;
    EXPECT_EQ(got.to_vector<float>(), want) << what;
  };
  expect(x + y, {1.33300793f, -0.641592741f, -7.10056257f, 65504.0f, 10.5f, -0.19997558f}, "x + y");
  expect(x - y, {0.666992307f, -5.64159298f, 7.10256243f, 65504.0f, 4.5f, -2.44155526e-05f}, "x - y");
  expect(y - x, {-0.666992307f, 5.64159298f, -7.10256243f, -65504.0f, -4.5f, 2.44155526e-05f}, "y - x");
  expect(x * y, {0.333007842f, -7.85398197f, -0.00710156281f, 6.55148697f, 22.5f, 0.00999755878f}, "x * y");
  expect(x / y, {3.00293303f, -1.2566371f, -0.000140814082f, 654931328.0f, 2.5f, 1.00024426f}, "x / y");
  expect(y / x, {0.333007783f, -0.795774698f, -7101.56201f, 1.52687762e-09f, 0.400000006f, 0.999755859f}, "y / x");
}

TEST_P(MixedHalf, WhereEqualsCastingFirst) {
  const Tensor x = f32({4, 6}, 7), y = half({4, 6}, 8), y_row = half({6}, 9);
  const Tensor cond = gt(f32({4, 6}, 10), zeros({}, kFloat32, dev));
  for (const Tensor& h : {y, y_row}) {
    const Tensor h32 = h.to(kFloat32);
    const Tensor a = where(cond, x, h), b = where(cond, h, x);
    EXPECT_EQ(a.dtype(), kFloat32);
    EXPECT_EQ(bits(a), bits(where(cond, x, h32)));
    EXPECT_EQ(bits(b), bits(where(cond, h32, x)));
  }
}

// In-place accumulation of a half tensor into a float32 one (a gradient into a float32 buffer).
TEST_P(MixedHalf, AddInPlaceEqualsCastingFirst) {
  const Tensor y = half({3, 5}, 11), y_row = half({5}, 12);
  for (const Tensor& h : {y, y_row}) {
    for (double alpha : {1.0, 0.5}) {
      Tensor got = f32({3, 5}, 13), want = f32({3, 5}, 13);
      got.add_(h, alpha);
      want.add_(h.to(kFloat32), alpha);
      EXPECT_EQ(bits(got), bits(want)) << "alpha " << alpha;
    }
  }
}

// The gradients keep each operand's dtype and equal the cast path's: each op's float32 gradient for
// the half operand is rounded once to its dtype (the engine casts), as the recorded cast's backward
// rounds it. (A half tensor used twice accumulates its rounded gradients in its dtype, as PyTorch's.)
// Not pow: its formula computes b - 1 and log(a) in the operand's own dtype, before this change too.
TEST_P(MixedHalf, GradientsKeepEachDtype) {
  for (const Named& n : arithmetic()) {
    if (std::string(n.name) == "pow") continue;
    for (bool half_first : {false, true}) {
      const Tensor x = f32({2, 3}, 14).set_requires_grad(), y = half({2, 3}, 15).set_requires_grad();
      sum(half_first ? n.op(y, x) : n.op(x, y)).backward();
      ASSERT_EQ(y.grad().dtype(), GetParam()) << n.name;
      ASSERT_EQ(x.grad().dtype(), kFloat32) << n.name;
      const Tensor x2 = x.detach().clone().set_requires_grad(), y2 = y.detach().clone().set_requires_grad();
      const Tensor y32 = y2.to(kFloat32);
      sum(half_first ? n.op(y32, x2) : n.op(x2, y32)).backward();
      EXPECT_EQ(bits(x.grad()), bits(x2.grad())) << n.name << (half_first ? " half first" : "");
      EXPECT_EQ(bits(y.grad().to(kFloat32)), bits(y2.grad().to(kFloat32))) << n.name << (half_first ? " half first" : "");
    }
  }
}

// Comparisons of the mixed pair still compute in float32 (the ops cast the half operand first).
TEST_P(MixedHalf, ComparisonsStillPromote) {
  const Tensor x = tensor(std::vector<float>{1.0f + 0x1p-20f, 1.0f}, {2}, dev);
  const Tensor y = tensor(std::vector<float>{1.0f, 1.0f}, {2}, dev).to(GetParam());
  EXPECT_EQ(gt(x, y).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ(eq(y, x).to_vector<bool>(), (std::vector<bool>{false, true}));
}

INSTANTIATE_TEST_SUITE_P(Half, MixedHalf, ::testing::Values(kFloat16, kBFloat16),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace braid
