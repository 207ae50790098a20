// index() and index_put_() (braid/indexing.h), argmax/argmin over all elements, and any/all.
// Expected values are closed forms: x = arange(60).reshape(3, 4, 5) holds x[i, j, k] = 20 i + 5 j + k,
// so every element an index picks is known from its position; errors are checked by type and by
// what their messages name.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "braid/braid.h"
#include "error_of.h"
#include "test_device.h"

namespace braid {
namespace {

using TI = TensorIndex;

Tensor x3() { return arange(60, kFloat64, test::test_device()).reshape({3, 4, 5}); }
Tensor ints(std::vector<int64_t> v, Shape s) { return tensor(v, s, test::test_device()); }
Tensor mask(std::vector<bool> v, Shape s) { return tensor_bool(v, s, test::test_device()); }
double at(int64_t i, int64_t j, int64_t k) { return static_cast<double>(20 * i + 5 * j + k); }

TEST(Index, SlicesIntegersNewAxesAndEllipsisAreViews) {
  Tensor x = x3();
  Tensor y = index(x, {TI::integer_at(1), TI::slice(), TI::slice({}, {}, 2)});  // x[1, :, ::2]
  ASSERT_EQ(y.shape(), (Shape{4, 3}));
  std::vector<double> v = y.to_vector<double>();
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(v[static_cast<size_t>(j * 3 + k)], at(1, j, 2 * k));
  y.fill_(-1.0);  // a view: the write shows in x
  EXPECT_EQ(x.to_vector<double>()[20 + 5 + 2], -1.0);

  Tensor last = index(x3(), {TI::ellipsis(), TI::integer_at(-1)});  // x[..., -1]
  ASSERT_EQ(last.shape(), (Shape{3, 4}));
  EXPECT_EQ(last.to_vector<double>()[7], at(1, 3, 4));
  EXPECT_EQ(index(x3(), {TI::new_axis(), TI::integer_at(2), TI::new_axis()}).shape(), (Shape{1, 1, 4, 5}));
  // Python's clamping: x[-2:] and x[1, 3:1] (empty), x[10:20] (empty).
  EXPECT_EQ(index(x3(), {TI::slice(-2)}).to_vector<double>()[0], at(1, 0, 0));
  EXPECT_EQ(index(x3(), {TI::integer_at(1), TI::slice(3, 1)}).shape(), (Shape{0, 5}));
  EXPECT_EQ(index(x3(), {TI::slice(10, 20)}).shape(), (Shape{0, 4, 5}));
  // A 0-d integer tensor is an integer.
  EXPECT_EQ(index(x3(), {TI::tensor(scalar_tensor(2, kInt64, test::test_device()))}).shape(), (Shape{4, 5}));
}

TEST(Index, IntegerTensorsGatherAlongTheirAxis) {
  Tensor y = index(x3(), {TI::slice(), TI::tensor(ints({3, 1, 3}, {3}))});  // x[:, [3, 1, 3]]
  ASSERT_EQ(y.shape(), (Shape{3, 3, 5}));
  std::vector<double> v = y.to_vector<double>();
  const int64_t js[] = {3, 1, 3};
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(v[static_cast<size_t>((i * 3 + j) * 5 + k)], at(i, js[j], k));
  // A 2-d index tensor puts its shape in place of the axis: x[[[0, 1], [2, -1]]] is (2, 2, 4, 5).
  Tensor z = index(x3(), {TI::tensor(ints({0, 1, 2, -1}, {2, 2}))});
  ASSERT_EQ(z.shape(), (Shape{2, 2, 4, 5}));
  std::vector<double> w = z.to_vector<double>();
  EXPECT_EQ(w[1 * 20 + 7], at(1, 1, 2));
  EXPECT_EQ(w[3 * 20 + 19], at(2, 3, 4));
}

TEST(Index, BoolMasksPickWhereTrueInRowMajorOrder) {
  Tensor x = x3();
  Tensor y = index(x, {TI::tensor(gt(x, scalar_like(x, 30.0)))});  // x[x > 30]: 31 ... 59
  ASSERT_EQ(y.shape(), (Shape{29}));
  std::vector<double> v = y.to_vector<double>();
  for (size_t p = 0; p < v.size(); ++p) EXPECT_EQ(v[p], 31.0 + static_cast<double>(p));
  // A mask over axis 1 after an integer: x[0, [True, False, True, False]] is rows 0 and 2 of x[0].
  Tensor r = index(x, {TI::integer_at(0), TI::tensor(mask({true, false, true, false}, {4}))});
  ASSERT_EQ(r.shape(), (Shape{2, 5}));
  EXPECT_EQ(r.to_vector<double>()[5 + 3], at(0, 2, 3));
  // A mask over the two leading axes flattens them: x[m] with m (3, 4) true at (0, 1) and (2, 3).
  std::vector<bool> m(12, false);
  m[1] = m[11] = true;
  Tensor two = index(x, {TI::tensor(mask(m, {3, 4}))});
  ASSERT_EQ(two.shape(), (Shape{2, 5}));
  EXPECT_EQ(two.to_vector<double>()[0], at(0, 1, 0));
  EXPECT_EQ(two.to_vector<double>()[9], at(2, 3, 4));
}

TEST(Index, ErrorsAreTypedAndNameTheProblem) {
  Tensor x = x3();
  EXPECT_NE(error_of<IndexError>([&] { index(x, {TI::integer_at(3)}); }).find("index 3 is out of bounds for axis 0 with size 3"),
            std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { index(x, {TI::integer_at(0), TI::integer_at(0), TI::integer_at(0), TI::integer_at(0)}); })
                .find("too many indices for a tensor of dimension 3"),
            std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { index(x, {TI::ellipsis(), TI::ellipsis()}); }).find("single ellipsis"),
            std::string::npos);
  EXPECT_NE(error_of<ValueError>([&] { index(x, {TI::slice({}, {}, 0)}); }).find("step must be positive"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { index(x, {TI::tensor(mask({true, false}, {2}))}); }).find("[2]"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { index(x, {TI::tensor(x)}); }).find("must be integer or bool"), std::string::npos);
  EXPECT_NE(error_of<NotImplementedError>([&] { index(x, {TI::tensor(ints({0}, {1})), TI::tensor(ints({0}, {1}))}); })
                .find("more than one"),
            std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { index(x, {TI::tensor(ints({0, 3}, {2}))}); }).find("index_select"), std::string::npos);
}

TEST(IndexPut, WritesThroughSlicesAndMasks) {
  Tensor x = x3();
  index_put_(x, {TI::integer_at(2), TI::slice(1, 3)}, scalar_tensor(-7.0, kFloat64, test::test_device()));
  std::vector<double> v = x.to_vector<double>();
  for (int64_t p = 0; p < 60; ++p) {
    const int64_t i = p / 20, j = p / 5 % 4;
    EXPECT_EQ(v[static_cast<size_t>(p)], i == 2 && (j == 1 || j == 2) ? -7.0 : static_cast<double>(p)) << p;
  }
  Tensor y = x3();
  index_put_(y, {TI::tensor(lt(y, scalar_like(y, 10.0)))}, scalar_tensor(0.5, kFloat64, test::test_device()));
  std::vector<double> w = y.to_vector<double>();
  for (int64_t p = 0; p < 60; ++p) EXPECT_EQ(w[static_cast<size_t>(p)], p < 10 ? 0.5 : static_cast<double>(p));
  // A mask over the leading axis takes a row for each true position.
  Tensor z = zeros({3, 2}, kFloat64, test::test_device());
  index_put_(z, {TI::tensor(mask({true, false, true}, {3}))}, tensor(std::vector<double>{1.0, 2.0}, {2}, test::test_device()));
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{1, 2, 0, 0, 1, 2}));
  EXPECT_NE(error_of<IndexError>([&] { index_put_(z, {TI::tensor(mask({true, false}, {2}))}, scalar_like(z, 1.0)); })
                .find("does not match the leading axes"),
            std::string::npos);
  EXPECT_NE(error_of<NotImplementedError>([&] { index_put_(z, {TI::tensor(ints({0}, {1}))}, scalar_like(z, 1.0)); })
                .find("scatter_add or where"),
            std::string::npos);
}

TEST(ArgExtremum, WithoutAnAxisIndexesTheFlattenedTensor) {
  const Tensor x = tensor(std::vector<double>{3, 9, -2, 9, 0, -5}, {2, 3}, test::test_device());
  Tensor i = argmax(x);
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(i.dim(), 0);
  EXPECT_EQ(i.item(), 1.0);  // the first of the two 9s
  EXPECT_EQ(argmin(x).item(), 5.0);
  EXPECT_EQ(argmax(x, std::nullopt, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(argmax(x3()).item(), 59.0);
  EXPECT_EQ(argmin(x3()).item(), 0.0);
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));  // along an axis, as before
  EXPECT_NE(error_of<ValueError>([] { argmax(zeros({0}, kFloat64, test::test_device())); }).find("argmax"), std::string::npos);
}

TEST(AnyAll, OverEveryAxisAndAlongAxes) {
  const Device d = test::test_device();
  Tensor z = zeros({2, 3}, kFloat64, d);
  EXPECT_EQ(any(z).dtype(), kBool);
  EXPECT_EQ(any(z).dim(), 0);
  EXPECT_FALSE(any(z).item());
  EXPECT_FALSE(all(z).item());
  Tensor one = tensor(std::vector<double>{0, 0, 0, 0, 0.25, 0}, {2, 3}, d);
  EXPECT_TRUE(any(one).item());
  EXPECT_FALSE(all(one).item());
  EXPECT_TRUE(all(ones({2, 3}, kInt64, d)).item());
  // Over no elements: any is false, all is true.
  EXPECT_FALSE(any(zeros({0, 3}, kFloat32, d)).item());
  EXPECT_TRUE(all(zeros({0, 3}, kFloat32, d)).item());
  const Tensor m = tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 1}, {2, 3}, d);
  EXPECT_EQ(any(m, {1}).to_vector<bool>(), (std::vector<bool>{false, true}));
  EXPECT_EQ(any(m, {0}).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  const Tensor m2 = tensor(std::vector<int64_t>{1, 0, 1, 1, 1, 1}, {2, 3}, d);
  EXPECT_EQ(all(m2, {0}).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(all(m2, {1}).to_vector<bool>(), (std::vector<bool>{false, true}));
  EXPECT_EQ(all(m2, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(any(tensor_bool({false, true}, {2}, d)).item(), 1.0);
}

}  // namespace
}  // namespace braid
