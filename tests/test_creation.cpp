// Creation ops with exact expected values: constant fills and their _like forms, ranges, tensors
// from C++ vectors, and rand_like/randn_like against rand/randn on the same generator state.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "braid/braid.h"

namespace braid {
namespace {

using F = std::vector<float>;
using D = std::vector<double>;
using I = std::vector<int64_t>;

TEST(Creation, RandLikeDrawsAsRandWithTheSameGenerator) {
  Tensor t = zeros({4, 5}, kFloat64);
  Generator a(7), b(7);
  Tensor u = rand_like(t, &a), n = randn_like(t, &a);
  EXPECT_EQ(u.shape(), t.shape());
  EXPECT_EQ(n.dtype(), kFloat64);
  EXPECT_EQ(u.to_vector<double>(), rand({4, 5}, kFloat64, &b).to_vector<double>());
  EXPECT_EQ(n.to_vector<double>(), randn({4, 5}, kFloat64, &b).to_vector<double>());
}

TEST(Creation, ConstantFills) {
  EXPECT_EQ(zeros({2, 2}).to_vector<float>(), (F{0, 0, 0, 0}));
  EXPECT_EQ(ones({3}, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(ones({3}, kInt32).dtype(), kInt32);
  EXPECT_EQ(full({2}, -2.5, kFloat64).to_vector<double>(), (D{-2.5, -2.5}));
  EXPECT_EQ(full({2}, 1, kBool).to_vector<int64_t>(), (I{1, 1}));
  Tensor like = zeros_like(full({2, 3}, 4, kInt64));
  EXPECT_EQ(like.dtype(), kInt64);
  EXPECT_EQ(like.shape(), (Shape{2, 3}));
  EXPECT_EQ(full_like(like, 9).to_vector<int64_t>(), (I{9, 9, 9, 9, 9, 9}));
  EXPECT_EQ(ones_like(tensor(D{1, 2}, {2})).to_vector<double>(), (D{1, 1}));
  EXPECT_EQ(ones_like(like, kFloat64).to_vector<double>(), (D{1, 1, 1, 1, 1, 1}));  // another dtype
  EXPECT_EQ(zeros_like(like, kBool).dtype(), kBool);
  EXPECT_EQ(full_like(like, 0.5, kFloat32).to_vector<float>(), (F{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}));
  EXPECT_EQ(scalar_tensor(3, kInt64).item(), 3.0);
  EXPECT_EQ(zeros({0, 3}).numel(), 0);
}

TEST(Creation, Ranges) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_EQ(a.to_vector<int64_t>(), (I{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(10.0, 0.0, -3.0, kInt64).to_vector<int64_t>(), (I{10, 7, 4, 1}));
  EXPECT_EQ(arange(1.0, -1.0, -0.5).to_vector<float>(), (F{1, 0.5, 0, -0.5}));
  EXPECT_EQ(arange(0.0, 1.0, 0.25, kFloat64).to_vector<double>(), (D{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(arange(0.0, 1.1, 0.25, kFloat64).numel(), 5);  // ceil(1.1 / 0.25)
  EXPECT_EQ(arange(3.0, 3.0).numel(), 0);
  EXPECT_EQ(linspace(0, 1, 5).to_vector<float>(), (F{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(linspace(2, -2, 3, kFloat64).to_vector<double>(), (D{2, 0, -2}));
  EXPECT_EQ(linspace(7, 9, 1).to_vector<float>(), (F{7}));
  EXPECT_EQ(linspace(0, 1, 0).numel(), 0);
  EXPECT_EQ(eye(3).to_vector<float>(), (F{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(eye(2, kInt64).dtype(), kInt64);
}

TEST(Creation, FromVectors) {
  Tensor b = tensor_bool({true, false, true}, {3});
  EXPECT_EQ(b.dtype(), kBool);
  EXPECT_EQ(b.to_vector<int64_t>(), (I{1, 0, 1}));
  EXPECT_EQ(tensor(std::vector<int32_t>{4, 5}, {2}).dtype(), kInt32);
  EXPECT_EQ(tensor(D{1.5}, {}).item(), 1.5);
}

}  // namespace
}  // namespace braid
