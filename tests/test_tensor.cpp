// Tensor core behaviour with exact expected values: dtypes, view metadata and storage sharing,
// user buffers, alignment, float16/bfloat16 conversion, the counter-based random
// streams (reproducibility and statistics), the thread knob, and dtype rules of arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "braid/braid.h"
#include "braid/optim.h"

namespace braid {
namespace {

using F = std::vector<float>;
using D = std::vector<double>;
using I = std::vector<int64_t>;

/// 0, 1, 2, ... in float32 with the given shape.
Tensor iota(const Shape& s) { return arange(0.0, static_cast<double>(shape_numel(s)), 1.0, kFloat32).reshape(s); }

bool same_storage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }

/// Restores the thread count a test changed.
class ThreadGuard {
 public:
  ThreadGuard() : saved_(get_num_threads()) {}
  ~ThreadGuard() { set_num_threads(saved_); }

 private:
  int saved_;
};

// ---- the thread knob (first, before any test changes the count) ----

TEST(Threads, DefaultComesFromBraidNumThreads) {
  const char* env = std::getenv("BRAID_NUM_THREADS");
  if (!env) GTEST_SKIP() << "BRAID_NUM_THREADS is not set (meson test sets it to 2)";
  EXPECT_EQ(get_num_threads(), std::atoi(env));
}

TEST(Threads, SetAndGet) {
  ThreadGuard guard;
  EXPECT_GE(get_num_threads(), 1);
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
  set_num_threads(1);
  EXPECT_EQ(get_num_threads(), 1);
  EXPECT_THROW(set_num_threads(0), ValueError);
  EXPECT_THROW(set_num_threads(-2), ValueError);
  EXPECT_EQ(get_num_threads(), 1) << "a refused value must leave the count unchanged";
}

TEST(Threads, ResultsDoNotDependOnThreadCount) {
  ThreadGuard guard;
  Generator g(11);
  Tensor x = rand({300001}, kFloat32, &g, -2.0, 2.0);
  set_num_threads(1);
  Tensor s1 = sum(x), e1 = exp(x), m1 = amax(x);
  set_num_threads(2);
  Tensor s2 = sum(x), e2 = exp(x), m2 = amax(x);
  EXPECT_TRUE(equal(e1, e2));
  EXPECT_TRUE(equal(m1, m2));
  EXPECT_NEAR(s1.item(), s2.item(), 1e-6 * 300001);
}

// ---- dtypes ----

TEST(DType, SizesNamesAndKinds) {
  EXPECT_EQ(dtype_size(kFloat32), 4);
  EXPECT_EQ(dtype_size(kFloat64), 8);
  EXPECT_EQ(dtype_size(kInt64), 8);
  EXPECT_EQ(dtype_size(kInt32), 4);
  EXPECT_EQ(dtype_size(kBool), 1);
  EXPECT_EQ(dtype_size(kFloat16), 2);
  EXPECT_EQ(dtype_size(kBFloat16), 2);
  EXPECT_EQ(dtype_name(kFloat32), "float32");
  EXPECT_EQ(dtype_name(kFloat64), "float64");
  EXPECT_EQ(dtype_name(kInt64), "int64");
  EXPECT_EQ(dtype_name(kInt32), "int32");
  EXPECT_EQ(dtype_name(kBool), "bool");
  EXPECT_EQ(dtype_name(kFloat16), "float16");
  EXPECT_EQ(dtype_name(kBFloat16), "bfloat16");
  EXPECT_TRUE(is_floating(kFloat16) && is_floating(kBFloat16) && is_floating(kFloat32) && is_floating(kFloat64));
  EXPECT_FALSE(is_floating(kInt64) || is_floating(kInt32) || is_floating(kBool));
  EXPECT_FALSE(is_compute_type(kFloat16) || is_compute_type(kBFloat16));
  EXPECT_TRUE(is_compute_type(kFloat32) && is_compute_type(kInt32) && is_compute_type(kBool));
  EXPECT_EQ(zeros({2}, kInt32).element_size(), 4);
}

TEST(DType, PromotionFollowsNumPy) {
  // numpy.result_type / torch.promote_types for array operands.
  EXPECT_EQ(promote_types(kInt32, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kInt64, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kFloat32, kFloat64), kFloat64);
  EXPECT_EQ(promote_types(kInt32, kInt64), kInt64);
  EXPECT_EQ(promote_types(kBool, kInt32), kInt32);
  EXPECT_EQ(promote_types(kBool, kBool), kBool);
  EXPECT_EQ(promote_types(kFloat64, kInt64), kFloat64);
  EXPECT_EQ(promote_types(kFloat16, kFloat16), kFloat16);  // more in test_half_arithmetic.cpp
}

TEST(DType, ShapeHelpers) {
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({5, 0, 3}), 0);
  EXPECT_THROW(shape_numel({2, -1}), ValueError);
  EXPECT_THROW(shape_numel({int64_t{1} << 40, int64_t{1} << 40}), ValueError);
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(cpu().str(), "cpu");
}

// ---- metadata and views ----

TEST(Tensor, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.to_string(), "Tensor(undefined)");
  EXPECT_THROW(t.shape(), ValueError);
}

TEST(Tensor, ContiguousMetadata) {
  Tensor t = zeros({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), kFloat32);
  EXPECT_EQ(t.device(), default_device());
  Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 2.5);
}

TEST(Views, ReshapeOfContiguousIsAView) {
  Tensor x = iota({2, 6});
  Tensor r = x.reshape({3, 4});
  EXPECT_TRUE(same_storage(x, r));
  EXPECT_EQ(r.strides(), (Shape{4, 1}));
  Tensor r2 = x.reshape({-1, 2, 3});
  EXPECT_EQ(r2.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(same_storage(x, r2));
  Tensor v = x.view({12});
  EXPECT_TRUE(same_storage(x, v));
  EXPECT_EQ(v.to_vector<float>(), (F{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(Views, ReshapeOfTransposedCopiesAndViewThrows) {
  Tensor x = iota({3, 4});
  Tensor t = x.transpose(0, 1);  // (4, 3), strides (1, 4)
  EXPECT_EQ(t.strides(), (Shape{1, 4}));
  EXPECT_FALSE(t.is_contiguous());
  Tensor r = t.reshape({12});
  EXPECT_FALSE(same_storage(t, r)) << "a transposed tensor cannot be flattened without a copy";
  EXPECT_EQ(r.to_vector<float>(), (F{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_THROW(t.view({12}), ValueError);
  // Splitting the first axis of the transpose needs no copy: strides (2, 1, 4).
  Tensor v = t.view({2, 2, 3});
  EXPECT_TRUE(same_storage(t, v));
  EXPECT_EQ(v.strides(), (Shape{2, 1, 4}));
  EXPECT_EQ(v.to_vector<float>(), (F{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

TEST(Views, ViewOfSteppedSliceKeepsStride) {
  Tensor x = iota({3, 4});
  Tensor s = x.slice(1, 0, 4, 2);  // columns 0 and 2: shape (3, 2), strides (4, 2)
  EXPECT_EQ(s.strides(), (Shape{4, 2}));
  Tensor v = s.view({6});  // 0, 2, 4, ... is one arithmetic sequence: stride 2
  EXPECT_TRUE(same_storage(x, v));
  EXPECT_EQ(v.strides(), (Shape{2}));
  EXPECT_EQ(v.to_vector<float>(), (F{0, 2, 4, 6, 8, 10}));
  Tensor n = x.narrow(1, 0, 2);  // (3, 2) with strides (4, 1): not one sequence
  EXPECT_THROW(n.view({6}), ValueError);
  Tensor c = n.reshape({6});
  EXPECT_FALSE(same_storage(x, c));
  EXPECT_EQ(c.to_vector<float>(), (F{0, 1, 4, 5, 8, 9}));
}

TEST(Views, PermuteAndTranspose) {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_TRUE(same_storage(x, p));
  // p[k][i][j] = x[i][j][k] = 12 i + 4 j + k.
  std::vector<float> want;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) want.push_back(static_cast<float>(12 * i + 4 * j + k));
  EXPECT_EQ(p.to_vector<float>(), want);
  Tensor q = x.permute({-1, -3, -2});
  EXPECT_TRUE(equal(p, q));
  Tensor m = x.mT();
  EXPECT_EQ(m.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(m.strides(), (Shape{12, 1, 4}));
  EXPECT_EQ(transpose(x, 0, 2).shape(), (Shape{4, 3, 2}));
}

TEST(Views, NarrowSliceSelect) {
  Tensor x = iota({4, 5});
  Tensor n = x.narrow(0, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 5}));
  EXPECT_EQ(n.offset(), 5);
  EXPECT_TRUE(same_storage(x, n));
  EXPECT_EQ(n.to_vector<float>(), (F{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}));
  Tensor n2 = x.narrow(1, -2, 2);  // negative start counts from the end
  EXPECT_EQ(n2.to_vector<float>(), (F{3, 4, 8, 9, 13, 14, 18, 19}));

  Tensor s = x.slice(1, 1, 5, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_EQ(s.strides(), (Shape{5, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.to_vector<float>(), (F{1, 3, 6, 8, 11, 13, 16, 18}));
  Tensor s3 = x.slice(1, 0, 5, 3);  // columns 0 and 3: ceil(5 / 3) = 2
  EXPECT_EQ(s3.shape(), (Shape{4, 2}));
  EXPECT_EQ(s3.to_vector<float>(), (F{0, 3, 5, 8, 10, 13, 15, 18}));
  // Python semantics: negative bounds count from the end, out-of-range bounds clamp.
  EXPECT_EQ(x.slice(0, -1, 100).to_vector<float>(), (F{15, 16, 17, 18, 19}));
  EXPECT_EQ(x.slice(0, 3, 1).numel(), 0);

  Tensor row = x.select(0, 2);
  EXPECT_EQ(row.shape(), (Shape{5}));
  EXPECT_EQ(row.offset(), 10);
  EXPECT_EQ(row.to_vector<float>(), (F{10, 11, 12, 13, 14}));
  Tensor col = x.select(1, -1);
  EXPECT_EQ(col.strides(), (Shape{5}));
  EXPECT_EQ(col.to_vector<float>(), (F{4, 9, 14, 19}));
  EXPECT_TRUE(same_storage(x, col));
}

TEST(Views, ExpandHasStrideZero) {
  Tensor x = tensor(F{1, 2, 3}, {3, 1});
  Tensor e = x.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(same_storage(x, e));
  EXPECT_EQ(e.sum().item(), 2 * 4 * (1 + 2 + 3));
  Tensor e2 = x.expand({-1, 2});
  EXPECT_EQ(e2.to_vector<float>(), (F{1, 1, 2, 2, 3, 3}));
  // Flattening an expanded (stride 0) tensor must copy.
  Tensor flat = e2.reshape({6});
  EXPECT_EQ(flat.to_vector<float>(), (F{1, 1, 2, 2, 3, 3}));
}

TEST(Views, SqueezeUnsqueezeFlatten) {
  Tensor x = iota({1, 3, 1, 2});
  EXPECT_EQ(x.squeeze().shape(), (Shape{3, 2}));
  EXPECT_EQ(x.squeeze(2).shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(x.squeeze(1).shape(), (Shape{1, 3, 1, 2})) << "squeezing a non-1 axis is a no-op, as in torch";
  EXPECT_TRUE(same_storage(x, x.squeeze()));
  EXPECT_EQ(x.unsqueeze(0).shape(), (Shape{1, 1, 3, 1, 2}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{1, 3, 1, 2, 1}));
  EXPECT_TRUE(same_storage(x, x.unsqueeze(4)));
  Tensor y = iota({2, 3, 4});
  EXPECT_EQ(y.flatten().shape(), (Shape{24}));
  EXPECT_EQ(y.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(y.flatten(0, 1).shape(), (Shape{6, 4}));
  EXPECT_TRUE(same_storage(y, y.flatten(1)));
}

TEST(Views, ContiguousAndClone) {
  Tensor x = iota({3, 4});
  EXPECT_TRUE(x.contiguous().is_same(x)) << "contiguous() of a contiguous tensor is the tensor itself";
  Tensor t = x.mT();
  Tensor c = t.contiguous();
  EXPECT_FALSE(same_storage(t, c));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{3, 1}));
  EXPECT_EQ(c.to_vector<float>(), (F{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  Tensor k = x.clone();
  EXPECT_FALSE(same_storage(x, k));
  EXPECT_TRUE(equal(x, k));
  k.fill_(0);
  EXPECT_EQ(x.sum().item(), 66.0) << "writing the clone leaves the original";
  // Size-1 axes do not count against contiguity.
  Tensor u = x.narrow(0, 1, 1);
  EXPECT_TRUE(u.is_contiguous());
}

TEST(Views, SplitAndChunkAreViews) {
  Tensor x = iota({4, 6});
  std::vector<Tensor> parts = split(x, {2, 4}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_TRUE(same_storage(x, parts[0]) && same_storage(x, parts[1]));
  EXPECT_EQ(parts[1].offset(), 2);
  std::vector<Tensor> ch = chunk(x, 3, 0);  // sizes 2, 2 (torch.chunk)
  ASSERT_EQ(ch.size(), 2u);
  EXPECT_EQ(ch[1].to_vector<float>()[0], 12.0f);
}

TEST(Views, WritesThroughViewsReachTheBase) {
  Tensor base = zeros({3, 4});
  base.narrow(1, 1, 2).fill_(5);
  EXPECT_EQ(base.to_vector<float>(), (F{0, 5, 5, 0, 0, 5, 5, 0, 0, 5, 5, 0}));
  base.select(0, 2).copy_(tensor(F{1, 2, 3, 4}, {4}));
  EXPECT_EQ(base.to_vector<float>(), (F{0, 5, 5, 0, 0, 5, 5, 0, 1, 2, 3, 4}));
  base.mT().select(0, 0).fill_(-1);  // column 0 through a transposed view
  EXPECT_EQ(base.to_vector<float>(), (F{-1, 5, 5, 0, -1, 5, 5, 0, -1, 2, 3, 4}));
  base.slice(1, 1, 4, 2).copy_(tensor(F{7, 8}, {2}));  // columns 1 and 3, broadcast over rows
  EXPECT_EQ(base.to_vector<float>(), (F{-1, 7, 5, 8, -1, 7, 5, 8, -1, 7, 3, 8}));
  base.reshape({12}).narrow(0, 10, 2).zero_();
  EXPECT_EQ(base.to_vector<float>(), (F{-1, 7, 5, 8, -1, 7, 5, 8, -1, 7, 0, 0}));
  // copy_ converts the dtype (float -> int truncates toward zero).
  Tensor ints = zeros({3}, kInt64);
  ints.copy_(tensor(F{2.9f, -2.9f, 0.5f}, {3}));
  EXPECT_EQ(ints.to_vector<int64_t>(), (I{2, -2, 0}));
}

TEST(Views, InPlaceArithmetic) {
  Tensor a = tensor(F{1, 2, 3, 4}, {2, 2});
  a.add_(tensor(F{10, 20}, {2}));
  EXPECT_EQ(a.to_vector<float>(), (F{11, 22, 13, 24}));
  a.add_(ones({2, 2}), -2.0);
  EXPECT_EQ(a.to_vector<float>(), (F{9, 20, 11, 22}));
  a.mul_(0.5);
  EXPECT_EQ(a.to_vector<float>(), (F{4.5, 10, 5.5, 11}));
  Tensor col = a.mT().select(0, 1);  // column 1: 10, 11
  col.mul_(2);
  EXPECT_EQ(a.to_vector<float>(), (F{4.5, 20, 5.5, 22}));
  Tensor i = full({3}, 7, kInt64);
  i.fill_(-3);
  EXPECT_EQ(i.to_vector<int64_t>(), (I{-3, -3, -3}));
}

TEST(Views, InPlaceWithOverlappingSourceIsRightOrRefused) {
  // The source is a transposed view of the destination's own memory: an elementwise loop that
  // writes as it reads gives a silently wrong answer. Torch refuses (partial overlap); the right
  // values or a braid::Error are both acceptable, garbage is not.
  Tensor a = tensor(F{1, 2, 3, 4}, {2, 2});
  try {
    a.copy_(a.mT());
    EXPECT_EQ(a.to_vector<float>(), (F{1, 3, 2, 4})) << "copy_ from an overlapping transposed view";
  } catch (const Error&) {
  }
  Tensor b = tensor(F{1, 2, 3, 4}, {2, 2});
  try {
    b.add_(b.mT());
    EXPECT_EQ(b.to_vector<float>(), (F{2, 5, 5, 8})) << "add_ of an overlapping transposed view";
  } catch (const Error&) {
  }
  // Exact aliasing (each element reads only itself) is well defined: x += x doubles.
  Tensor c = tensor(F{1, 2, 3, 4}, {2, 2});
  c.add_(c);
  EXPECT_EQ(c.to_vector<float>(), (F{2, 4, 6, 8}));
}

// ---- user buffers and storage ----

TEST(Storage, FromBufferCopiesFromBlobAliases) {
  float buf[6] = {1, 2, 3, 4, 5, 6};
  Tensor copied = from_buffer(buf, {2, 3}, kFloat32);
  Tensor aliased = from_blob(buf, {2, 3}, kFloat32);
  EXPECT_TRUE(copied.storage()->owns_memory());
  EXPECT_FALSE(aliased.storage()->owns_memory());
  EXPECT_EQ(aliased.raw_data(), static_cast<void*>(buf));
  buf[0] = 100;
  EXPECT_EQ(copied.to_vector<float>()[0], 1.0f) << "from_buffer must copy";
  EXPECT_EQ(aliased.to_vector<float>()[0], 100.0f) << "from_blob must alias";
  aliased.select(1, 2).fill_(-1);  // writes land in the user's buffer
  EXPECT_EQ(buf[2], -1.0f);
  EXPECT_EQ(buf[5], -1.0f);
  int64_t ib[3] = {5, 6, 7};
  EXPECT_EQ(from_blob(ib, {3}, kInt64).sum().item(), 18.0);
}

TEST(Storage, SixtyFourByteAlignment) {
  for (int64_t n : {1, 3, 17, 1000, 4097}) {
    Tensor t = empty({n}, kFloat32);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.storage()->data()) % 64, 0u) << n << " elements";
    EXPECT_EQ(t.storage()->nbytes() % 64, 0) << "rounded to whole cache lines";
    EXPECT_GE(t.storage()->nbytes(), n * 4);
    Tensor d = zeros({n, 3}, kFloat64).mT().contiguous();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d.storage()->data()) % 64, 0u);
  }
  auto s = Storage::allocate(100);
  EXPECT_EQ(s->nbytes(), 128);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % 64, 0u);
}

TEST(Storage, LiveBytesCountsOwnedMemory) {
  const int64_t before = memory_allocated(default_device());
  {
    Tensor t = empty({1000}, kFloat64);  // 8000 bytes, rounded to 8000 (125 lines)
    EXPECT_EQ(memory_allocated(default_device()) - before, 8000);
    Tensor v = t.narrow(0, 0, 10);  // a view allocates nothing
    EXPECT_EQ(memory_allocated(default_device()) - before, 8000);
    float buf[4];
    Tensor w = from_blob(buf, {4}, kFloat32);  // wrapped memory is not counted
    EXPECT_EQ(memory_allocated(default_device()) - before, 8000);
  }
  EXPECT_EQ(memory_allocated(default_device()), before);
}

// ---- float16 and bfloat16 ----

uint16_t to_half_bits(float f) {
  Tensor h = tensor(F{f}, {1}).to(kFloat16);
  EXPECT_EQ(h.dtype(), kFloat16);
  return h.cpu().data<detail::Half>()[0].bits;
}

uint16_t to_bf16_bits(float f) {
  Tensor h = tensor(F{f}, {1}).to(kBFloat16);
  EXPECT_EQ(h.dtype(), kBFloat16);
  return h.cpu().data<detail::BFloat16>()[0].bits;
}

TEST(HalfTypes, Float16BitPatterns) {
  // IEEE binary16: sign | 5 exponent bits (bias 15) | 10 mantissa bits. Hand-computed; they agree
  // with numpy.float16(x).view(numpy.uint16).
  EXPECT_EQ(to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(to_half_bits(0.5f), 0x3800);
  EXPECT_EQ(to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(to_half_bits(65504.0f), 0x7BFF);          // the largest half
  EXPECT_EQ(to_half_bits(65519.0f), 0x7BFF);          // below the midpoint 65520: stays finite
  EXPECT_EQ(to_half_bits(65520.0f), 0x7C00);          // the midpoint rounds to even = inf
  EXPECT_EQ(to_half_bits(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(to_half_bits(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie to even = 0
  EXPECT_EQ(to_half_bits(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 * 2^-24 rounds up
  EXPECT_EQ(to_half_bits(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie: to even (down)
  EXPECT_EQ(to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie: to even (up)
  EXPECT_EQ(to_half_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);  // above the tie
  EXPECT_EQ(to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(to_half_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(to_half_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(to_half_bits(1e6f), 0x7C00);
  const uint16_t nan = to_half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0) << "NaN must stay NaN, not become inf";
}

TEST(HalfTypes, Float16ToFloatIsExactForEveryPattern) {
  // value = (-1)^s 2^(e-15) (1 + m/1024) for normals, (-1)^s 2^-14 (m/1024) for subnormals.
  std::vector<uint16_t> bits(65536);
  std::iota(bits.begin(), bits.end(), 0);
  Tensor h = from_buffer(bits.data(), {65536}, kFloat16);
  std::vector<float> got = h.to(kFloat32).to_vector<float>();
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const int s = b >> 15, e = (b >> 10) & 0x1F, m = b & 0x3FF;
    float want;
    if (e == 31) want = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    else if (e == 0) want = std::ldexp(static_cast<float>(m), -24);
    else want = std::ldexp(1.0f + static_cast<float>(m) / 1024.0f, e - 15);
    if (s) want = -want;
    const bool ok = std::isnan(want) ? std::isnan(got[b]) : (got[b] == want && std::signbit(got[b]) == std::signbit(want));
    if (!ok && bad++ < 5) ADD_FAILURE() << "half 0x" << std::hex << b << std::dec << ": got " << got[b] << " want " << want;
  }
  EXPECT_EQ(bad, 0);
  // And back: every non-NaN pattern survives float16 -> float32 -> float16.
  std::vector<float> back(got);
  Tensor again = tensor(back, {65536}).to(kFloat16).contiguous().cpu();
  const auto* p = again.data<detail::Half>();
  int changed = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const bool is_nan = ((b >> 10) & 0x1F) == 31 && (b & 0x3FF);
    if (!is_nan && p[b].bits != b) ++changed;
  }
  EXPECT_EQ(changed, 0);
}

TEST(HalfTypes, Float16RoundsMidpointsToEven) {
  // For every pair of adjacent positive halves h, h+1 (h finite), the float32 midpoint rounds to
  // whichever has an even pattern, and one float32 ulp either side rounds to the nearer one.
  std::vector<float> mids, above, below;
  std::vector<uint16_t> lo;
  for (uint32_t b = 0; b < 0x7C00; ++b) {
    const float a = b == 0 ? 0.0f
                           : ((b >> 10) == 0 ? std::ldexp(static_cast<float>(b & 0x3FF), -24)
                                             : std::ldexp(1.0f + static_cast<float>(b & 0x3FF) / 1024.0f,
                                                          static_cast<int>(b >> 10) - 15));
    const uint32_t n = b + 1;
    const float c = (n >> 10) == 31 ? 65536.0f  // the "next" value above 65504 in the binary16 grid
                                    : ((n >> 10) == 0 ? std::ldexp(static_cast<float>(n & 0x3FF), -24)
                                                      : std::ldexp(1.0f + static_cast<float>(n & 0x3FF) / 1024.0f,
                                                                   static_cast<int>(n >> 10) - 15));
    const float mid = (a + c) / 2;  // exact: 12 significant bits
    mids.push_back(mid);
    above.push_back(std::nextafter(mid, c));
    below.push_back(std::nextafter(mid, a));
    lo.push_back(static_cast<uint16_t>(b));
  }
  const int64_t n = static_cast<int64_t>(mids.size());
  auto cast_bits = [&](const std::vector<float>& v) {
    Tensor h = tensor(v, {n}).to(kFloat16).contiguous().cpu();
    const auto* p = h.data<detail::Half>();
    std::vector<uint16_t> out(v.size());
    for (size_t k = 0; k < v.size(); ++k) out[k] = p[k].bits;
    return out;
  };
  std::vector<uint16_t> m = cast_bits(mids), u = cast_bits(above), d = cast_bits(below);
  int bad = 0;
  for (size_t k = 0; k < lo.size(); ++k) {
    const uint16_t even = (lo[k] & 1) ? lo[k] + 1 : lo[k];
    if (m[k] != even || u[k] != lo[k] + 1 || d[k] != lo[k]) {
      if (bad++ < 5)
        ADD_FAILURE() << "between 0x" << std::hex << lo[k] << " and 0x" << lo[k] + 1 << std::dec << ": mid "
                      << mids[k] << " -> " << m[k] << ", above -> " << u[k] << ", below -> " << d[k];
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(HalfTypes, BFloat16BitPatterns) {
  // bfloat16 is the top half of a float32 (1 sign, 8 exponent, 7 mantissa bits), rounded to even.
  EXPECT_EQ(to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(to_bf16_bits(1.00390625f), 0x3F80);   // 1 + 2^-8: a tie, to even (down)
  EXPECT_EQ(to_bf16_bits(1.01171875f), 0x3F82);   // 1 + 3 * 2^-8: a tie, to even (up)
  EXPECT_EQ(to_bf16_bits(1.005859375f), 0x3F81);  // 1 + 1.5 * 2^-8: above the tie
  EXPECT_EQ(to_bf16_bits(1.0078125f), 0x3F81);    // exact
  EXPECT_EQ(to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80) << "rounds up past the largest bfloat16";
  EXPECT_EQ(to_bf16_bits(-0.0f), 0x8000);
  const uint16_t nan = to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0) << "NaN must stay NaN (naive rounding can carry it into inf)";
  // A NaN whose payload sits only in the low 16 bits must not truncate to inf either.
  const uint16_t low_nan = to_bf16_bits(std::bit_cast<float>(0x7F800001u));
  EXPECT_NE(low_nan & 0x007F, 0) << "NaN 0x7F800001 became 0x" << std::hex << low_nan;
  // Reading back is exact: the bits shifted up by 16.
  std::vector<uint16_t> bits = {0x3F80, 0x4049, 0xC2F7, 0x0001, 0x7F7F};
  std::vector<float> got = from_buffer(bits.data(), {5}, kBFloat16).to(kFloat32).to_vector<float>();
  for (size_t k = 0; k < bits.size(); ++k)
    EXPECT_EQ(std::bit_cast<uint32_t>(got[k]), static_cast<uint32_t>(bits[k]) << 16);
}

TEST(HalfTypes, CastsBetweenHalfAndOtherTypes) {
  // float64 -> float16 -> int64, and int64 -> bfloat16 -> float64 (256 -> 256, 257 -> 256 by ties-to-even).
  EXPECT_EQ(tensor(D{2.75, -1.5}, {2}).to(kFloat16).to(kInt64).to_vector<int64_t>(), (I{2, -1}));
  EXPECT_EQ(tensor(I{256, 257, 259}, {3}).to(kBFloat16).to(kFloat64).to_vector<double>(), (D{256, 256, 260}));
  // Half tensors keep their views: a transposed half tensor converts in the right order.
  Tensor h = iota({2, 3}).to(kFloat16).mT();
  EXPECT_EQ(h.to(kFloat32).to_vector<float>(), (F{0, 3, 1, 4, 2, 5}));
}

// ---- random streams ----

TEST(Random, SameSeedSameNumbers) {
  Generator a(42), b(42), c(43);
  Tensor x = rand({1000}, kFloat32, &a), y = rand({1000}, kFloat32, &b), z = rand({1000}, kFloat32, &c);
  EXPECT_TRUE(equal(x, y));
  EXPECT_FALSE(equal(x, z));
  Tensor x2 = rand({1000}, kFloat32, &a);
  EXPECT_FALSE(equal(x, x2)) << "a second draw continues the stream";
  EXPECT_GT(a.offset(), 0u);
  manual_seed(7);
  Tensor d1 = randn({10, 10});
  manual_seed(7);
  Tensor d2 = randn({10, 10});
  EXPECT_TRUE(equal(d1, d2));
  EXPECT_EQ(default_generator().seed(), 7u);
}

TEST(Random, IndependentOfThreadCount) {
  ThreadGuard guard;
  const Shape s = {1000, 1000};
  auto draws = [&](int threads) {
    set_num_threads(threads);
    Generator g(2024);
    return std::vector<Tensor>{rand(s, kFloat32, &g), randn(s, kFloat32, &g), bernoulli(s, 0.3, kFloat32, &g),
                               randn(s, kFloat64, &g), randint(0, 1000, s, kInt64, &g)};
  };
  std::vector<Tensor> one = draws(1), two = draws(2), four = draws(4);
  for (size_t k = 0; k < one.size(); ++k) {
    EXPECT_TRUE(equal(one[k], two[k])) << "draw " << k << " differs between 1 and 2 threads";
    EXPECT_TRUE(equal(one[k], four[k])) << "draw " << k << " differs between 1 and 4 threads";
  }
}

TEST(Random, GeneratorStateRestoresTheStream) {
  Generator g(99);
  Tensor first = randn({257}, kFloat32, &g);
  const uint64_t seed = g.seed(), offset = g.offset();
  Tensor second = rand({100}, kFloat64, &g);
  Tensor third = bernoulli({50}, 0.5, kFloat32, &g);
  g.set_state(seed, offset);
  EXPECT_TRUE(equal(rand({100}, kFloat64, &g), second));
  EXPECT_TRUE(equal(bernoulli({50}, 0.5, kFloat32, &g), third));
  g.manual_seed(99);
  EXPECT_EQ(g.offset(), 0u);
  EXPECT_TRUE(equal(randn({257}, kFloat32, &g), first));
}

// Statistical bounds are five standard errors: a correct generator fails one with probability ~6e-7.
TEST(Random, UniformMoments) {
  Generator g(1);
  const double n = 1e6;
  std::vector<double> u = rand({1000000}, kFloat64, &g).to_vector<double>();
  double mean = 0, m2 = 0;
  for (double v : u) mean += v;
  mean /= n;
  for (double v : u) m2 += (v - mean) * (v - mean);
  const double var = m2 / (n - 1);
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  // Var of the sample variance of U(0,1): (mu4 - sigma^4) / n = (1/80 - 1/144) / n.
  EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / n));
  EXPECT_GE(*std::min_element(u.begin(), u.end()), 0.0);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 1.0);
  // float32 draws on [low, high).
  std::vector<float> f = rand({1000000}, kFloat32, &g, -2.0, 3.0).to_vector<float>();
  double fm = std::accumulate(f.begin(), f.end(), 0.0) / n;
  EXPECT_NEAR(fm, 0.5, 5 * 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_GE(*std::min_element(f.begin(), f.end()), -2.0f);
  EXPECT_LT(*std::max_element(f.begin(), f.end()), 3.0f);
  // Ten equal bins each hold 1/10 of the draws.
  std::vector<int> bins(10);
  for (double v : u) ++bins[std::min(9, static_cast<int>(v * 10))];
  for (int b : bins) EXPECT_NEAR(b / n, 0.1, 5 * std::sqrt(0.1 * 0.9 / n));
}

TEST(Random, NormalMoments) {
  Generator g(2);
  const double n = 1e6;
  std::vector<double> x = randn({1000000}, kFloat64, &g).to_vector<double>();
  double mean = 0, m2 = 0, within1 = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) {
    m2 += (v - mean) * (v - mean);
    within1 += std::fabs(v) < 1;
  }
  EXPECT_NEAR(mean, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(m2 / (n - 1), 1.0, 5 * std::sqrt(2 / n));
  // P(|Z| < 1) = erf(1/sqrt 2) = 0.682689492...
  const double p1 = std::erf(1 / std::sqrt(2.0));
  EXPECT_NEAR(within1 / n, p1, 5 * std::sqrt(p1 * (1 - p1) / n));
  // mean and std parameters, float32.
  std::vector<float> y = randn({1000000}, kFloat32, &g, 3.0, 2.0).to_vector<float>();
  double ym = std::accumulate(y.begin(), y.end(), 0.0) / n, yv = 0;
  for (float v : y) yv += (v - ym) * (v - ym);
  EXPECT_NEAR(ym, 3.0, 5 * 2 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(yv / (n - 1)), 2.0, 5 * 2 * std::sqrt(0.5 / n));
}

TEST(Random, BernoulliFrequency) {
  Generator g(3);
  const double n = 1e6;
  std::vector<float> b = bernoulli({1000000}, 0.3, kFloat32, &g).to_vector<float>();
  double ones = 0;
  for (float v : b) {
    ASSERT_TRUE(v == 0.0f || v == 1.0f) << v;
    ones += v;
  }
  EXPECT_NEAR(ones / n, 0.3, 5 * std::sqrt(0.3 * 0.7 / n));
  EXPECT_EQ(bernoulli({1000}, 0.0, kFloat32, &g).sum().item(), 0.0);
  EXPECT_EQ(bernoulli({1000}, 1.0, kFloat32, &g).sum().item(), 1000.0);
  Tensor bb = bernoulli({10}, 0.5, kBool, &g);
  EXPECT_EQ(bb.dtype(), kBool);
}

TEST(Random, RandintRangeAndUniformity) {
  Generator g(4);
  const int64_t n = 800000;
  Tensor r = randint(-3, 5, {n}, kInt64, &g);
  EXPECT_EQ(r.dtype(), kInt64);
  std::vector<int64_t> v = r.to_vector<int64_t>();
  std::vector<int64_t> count(8);
  for (int64_t x : v) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 5);
    ++count[x + 3];
  }
  for (int64_t c : count) EXPECT_NEAR(static_cast<double>(c) / n, 0.125, 5 * std::sqrt(0.125 * 0.875 / n));
  Tensor r32 = randint(0, 2, {1000}, kInt32, &g);
  EXPECT_EQ(r32.dtype(), kInt32);
  EXPECT_EQ(randint(7, 8, {5}, kInt64, &g).to_vector<int64_t>(), (I{7, 7, 7, 7, 7}));
}

TEST(Random, RandpermIsAPermutation) {
  Generator g(5);
  std::vector<int64_t> p = randperm(1000, &g).to_vector<int64_t>();
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> want(1000);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(sorted, want);
  EXPECT_NE(p, want) << "the identity has probability 1/1000!";
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += p[i] == i;
  EXPECT_LT(fixed, 10) << "a uniform permutation has ~1 fixed point (Poisson(1)); 10 has p < 1e-7";
  Generator h(5);
  EXPECT_EQ(randperm(1000, &h).to_vector<int64_t>(), p);
  EXPECT_EQ(randperm(0, &g).numel(), 0);
  EXPECT_EQ(randperm(1, &g).to_vector<int64_t>(), (I{0}));
  // Every one of the 6 permutations of 3 appears, each about 1/6 of the time.
  std::map<std::vector<int64_t>, int> seen;
  for (int k = 0; k < 6000; ++k) ++seen[randperm(3, &g).to_vector<int64_t>()];
  EXPECT_EQ(seen.size(), 6u);
  for (const auto& [perm, c] : seen) EXPECT_NEAR(c / 6000.0, 1.0 / 6, 5 * std::sqrt(5.0 / 36 / 6000));
}

// ---- element access ----

TEST(Access, ItemToVectorToString) {
  EXPECT_EQ(tensor(F{2.5f}, {1, 1}).item(), 2.5);
  EXPECT_EQ(tensor(I{-7}, {}).item(), -7.0);
  EXPECT_THROW(tensor(F{1, 2}, {2}).item(), ValueError);
  Tensor x = tensor(D{1.5, -2.5, 3.75}, {3});
  EXPECT_EQ(x.to_vector<double>(), (D{1.5, -2.5, 3.75}));
  EXPECT_EQ(x.to_vector<int64_t>(), (I{1, -2, 3})) << "conversion truncates toward zero";
  EXPECT_EQ(x.to_vector<float>(), (F{1.5f, -2.5f, 3.75f}));
  EXPECT_EQ(tensor_bool({true, false}, {2}).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ(iota({2, 3}).mT().to_vector<float>(), (F{0, 3, 1, 4, 2, 5})) << "row-major order of the view";
  const std::string s = tensor(F{1, 2.5f, -3, 4}, {2, 2}).to_string();
  EXPECT_NE(s.find("shape=[2, 2]"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=float32"), std::string::npos) << s;
  EXPECT_NE(s.find("1, 2.5, -3, 4"), std::string::npos) << s;
  const std::string big = arange(100).to_string();
  EXPECT_NE(big.find("(100 values)"), std::string::npos) << big;
  EXPECT_NE(arange(3).to_string().find("dtype=int64"), std::string::npos);
}

TEST(Access, EqualAndAllclose) {
  Tensor a = tensor(F{1, 2, 3}, {3});
  EXPECT_TRUE(equal(a, tensor(F{1, 2, 3}, {3})));
  EXPECT_FALSE(equal(a, tensor(D{1, 2, 3}, {3}))) << "equal compares dtypes";
  EXPECT_FALSE(equal(a, tensor(F{1, 2, 3}, {1, 3}))) << "equal compares shapes";
  EXPECT_TRUE(allclose(a, tensor(F{1, 2, 3.00001f}, {3})));
  EXPECT_FALSE(allclose(a, tensor(F{1, 2, 3.1f}, {3})));
  EXPECT_FALSE(allclose(tensor(F{NAN}, {1}), tensor(F{NAN}, {1})));
}

// ---- dtype rules of arithmetic and the operators ----

TEST(Arithmetic, IntegerOpsKeepInt64) {
  Tensor a = arange(5) * 2;
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_EQ(a.to_vector<int64_t>(), (I{0, 2, 4, 6, 8}));
  Tensor b = arange(5) + arange(5);
  EXPECT_EQ(b.dtype(), kInt64);
  EXPECT_EQ((arange(5) - 7).to_vector<int64_t>(), (I{-7, -6, -5, -4, -3}));
  EXPECT_EQ(sum(arange(5)).dtype(), kInt64);
  EXPECT_EQ(sum(arange(5)).item(), 10.0);
  // Large int64 values stay exact (no detour through float or double).
  const int64_t big = (int64_t{1} << 53) + 1;
  Tensor c = tensor(I{big}, {1}) + tensor(I{2}, {1});
  EXPECT_EQ(c.to_vector<int64_t>(), (I{big + 2}));
  // A non-integral scalar makes an integer tensor float32 (torch: int tensor * 2.5 is float32).
  Tensor d = arange(3) * 2.5;
  EXPECT_EQ(d.dtype(), kFloat32);
  EXPECT_EQ(d.to_vector<float>(), (F{0, 2.5, 5}));
}

TEST(Arithmetic, TypePromotion) {
  Tensor i32 = tensor(std::vector<int32_t>{1, 2}, {2});
  Tensor i64 = tensor(I{3, 4}, {2});
  Tensor f32 = tensor(F{0.5f, 0.25f}, {2});
  Tensor f64 = tensor(D{0.125, 1.0}, {2});
  Tensor b = tensor_bool({true, false}, {2});
  EXPECT_EQ((i32 + f32).dtype(), kFloat32);
  EXPECT_EQ((i32 + f32).to_vector<float>(), (F{1.5f, 2.25f}));
  EXPECT_EQ((i64 + b).dtype(), kInt64);
  EXPECT_EQ((i64 + b).to_vector<int64_t>(), (I{4, 4}));
  EXPECT_EQ((f32 + f64).dtype(), kFloat64);
  EXPECT_EQ((f32 + f64).to_vector<double>(), (D{0.625, 1.25}));
  EXPECT_EQ((i32 + i64).dtype(), kInt64);
  EXPECT_EQ((i32 * i32).dtype(), kInt32);
  Tensor q = i64 / tensor(I{2, 8}, {2});
  EXPECT_EQ(q.dtype(), kFloat32) << "integer true division gives float32, as torch.div";
  EXPECT_EQ(q.to_vector<float>(), (F{1.5f, 0.5f}));
  EXPECT_EQ((i32 / 4.0).dtype(), kFloat32);
  EXPECT_EQ((f32 * 2.0).dtype(), kFloat32) << "a scalar does not promote a float32 tensor";
  EXPECT_EQ((f64 * 2.0).dtype(), kFloat64);
  EXPECT_EQ(exp(i64).dtype(), kFloat32);
  EXPECT_EQ(eq(i64, f32).dtype(), kBool);
  EXPECT_EQ(matmul(i32.reshape({1, 2}), f64.reshape({2, 1})).dtype(), kFloat64);
}

TEST(Arithmetic, OperatorOverloads) {
  Tensor a = tensor(F{1, 2, 4}, {3});
  Tensor b = tensor(F{0.5f, -1, 8}, {3});
  EXPECT_EQ((a + b).to_vector<float>(), (F{1.5f, 1, 12}));
  EXPECT_EQ((a - b).to_vector<float>(), (F{0.5f, 3, -4}));
  EXPECT_EQ((a * b).to_vector<float>(), (F{0.5f, -2, 32}));
  EXPECT_EQ((a / b).to_vector<float>(), (F{2, -2, 0.5f}));
  EXPECT_EQ((-a).to_vector<float>(), (F{-1, -2, -4}));
  EXPECT_EQ((a + 1.5).to_vector<float>(), (F{2.5f, 3.5f, 5.5f}));
  EXPECT_EQ((a - 1.0).to_vector<float>(), (F{0, 1, 3}));
  EXPECT_EQ((a * 2.0).to_vector<float>(), (F{2, 4, 8}));
  EXPECT_EQ((a / 4.0).to_vector<float>(), (F{0.25f, 0.5f, 1}));
  EXPECT_EQ((1.5 + a).to_vector<float>(), (F{2.5f, 3.5f, 5.5f}));
  EXPECT_EQ((2.0 - a).to_vector<float>(), (F{1, 0, -2}));
  EXPECT_EQ((3.0 * a).to_vector<float>(), (F{3, 6, 12}));
  EXPECT_EQ((1.0 / a).to_vector<float>(), (F{1, 0.5f, 0.25f}));
  // Broadcasting through the operators.
  Tensor m = tensor(F{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ((m + a).to_vector<float>(), (F{2, 4, 7, 5, 7, 10}));
  EXPECT_EQ((m * tensor(F{10, 100}, {2, 1})).to_vector<float>(), (F{10, 20, 30, 400, 500, 600}));
  EXPECT_EQ(m.matmul(a).to_vector<float>(), (F{1 + 4 + 12, 4 + 10 + 24}));  // (2, 3) @ (3,)
  EXPECT_EQ(m.sum({1}).to_vector<float>(), (F{6, 15}));
  EXPECT_EQ(m.mean({0}, true).to_vector<float>(), (F{2.5f, 3.5f, 4.5f}));
  EXPECT_EQ(m.mean({0}, true).shape(), (Shape{1, 3}));
}

// Note [Storage versions]: every in-place write counts in the storage's version, through a view
// too; ops that make new tensors leave their inputs' versions alone, and so does reading.
TEST(StorageVersion, InPlaceWritesAndOptimizerStepsBumpIt) {
  Tensor t = zeros({4, 3});
  const auto version = [&] { return t.storage()->version(); };
  uint64_t v = version();
  t.fill_(2.0);
  EXPECT_EQ(version(), ++v);
  t.add_(ones({3}));
  EXPECT_EQ(version(), ++v);
  t.mul_(0.5);
  EXPECT_EQ(version(), ++v);
  t.narrow(0, 1, 2).copy_(full({2, 3}, 7.0));  // a view's write is the base's
  EXPECT_EQ(version(), ++v);
  t.zero_();
  EXPECT_EQ(version(), ++v);
  Tensor sum_of = t + 1.0;  // a new tensor, and a read
  (void)t.sum().item();
  EXPECT_EQ(version(), v);
  EXPECT_EQ(sum_of.storage()->version(), 0u);
  // An optimizer's step writes its parameters in place, fused or not.
  Tensor p = full({5}, 1.0, kFloat32);
  p.set_requires_grad(true);
  optim::Adam adam({p});
  (p * p).sum().backward();
  const uint64_t before = p.storage()->version();
  adam.step();
  EXPECT_GT(p.storage()->version(), before);
  EXPECT_LT(amax(p.detach()).item(), 1.0);  // and it did move
}

}  // namespace
}  // namespace braid

// item() reads a one-element view in place on the CPU: the element at the view's offset, in every
// dtype, as the converting copy (to_vector) gives it.
TEST(Tensor, ItemReadsTheViewsElementInEveryDType) {
  using namespace braid;
  const std::vector<double> values{3, 7, 0, 1, 100};
  for (DType t : {kFloat32, kFloat64, kInt64, kInt32, kBool, kFloat16, kBFloat16, kInt8, kUInt8}) {
    const Tensor x = cast(tensor(values, {5}), t);
    for (int64_t i = 0; i < 5; ++i) {
      const Tensor one = x.select(0, i);
      const double v = values[static_cast<size_t>(i)];
      EXPECT_EQ(one.item(), t == kBool ? (v != 0 ? 1 : 0) : v) << dtype_name(t) << " element " << i;
      EXPECT_EQ(one.item(), one.to_vector<double>()[0]) << dtype_name(t);
    }
  }
  for (DType t : {kFloat32, kFloat64, kInt64, kInt32, kInt8})
    EXPECT_EQ(cast(tensor(std::vector<double>{-3.0}, {1}), t).item(), -3.0) << dtype_name(t);
  EXPECT_EQ(tensor(std::vector<float>{0.25f, -1.5f}, {2}).select(0, 1).item(), -1.5);
}

// A float32 product by a weight (B shared by every row: an nn::Linear's or an ONNX MatMul's
// initializer) runs oneDNN's matmul on B as it lies the first time and on B reordered into the
// kernel's layout from the second product at the same version on (Note [Products by a weight
// through oneDNN's matmul] in src/backend/cpu/matmul_weight.cpp). Each product is the float64 one
// within float32 rounding, and bit for bit the same whether or not the weight was seen before (a
// resumed run must equal the uninterrupted one): as written, through a transposed view, with
// batched activations, and for a weight written in place.
TEST(Matmul, AWeightGivesTheSameBitsSeenOrNot) {
  using namespace braid;
  Generator gen(31);
  NoGradGuard no_grad;
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{40, 96, 80}, {32, 384, 160}, {8, 1536, 64}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n));
    Tensor w = randn({k, n}, kFloat32, &gen);
    const Tensor x = randn({m, k}, kFloat32, &gen), xb = randn({3, m, k}, kFloat32, &gen);
    const Tensor xt = randn({m, n}, kFloat32, &gen);
    const Tensor want = matmul(x.to(kFloat64), w.to(kFloat64));
    const Tensor want_t = matmul(xt.to(kFloat64), w.to(kFloat64).transpose(0, 1));
    const Tensor first = matmul(x, w), first_b = matmul(xb, w), first_t = matmul(xt, w.transpose(0, 1));
    EXPECT_TRUE(allclose(first.to(kFloat64), want, 1e-5, 1e-4));
    EXPECT_TRUE(allclose(first_t.to(kFloat64), want_t, 1e-5, 1e-4));
    for (int call = 0; call < 3; ++call) {  // seen: from here on the kept layout
      SCOPED_TRACE(call);
      EXPECT_TRUE(equal(matmul(x, w), first));
      EXPECT_TRUE(equal(matmul(xb, w), first_b));
      EXPECT_TRUE(equal(matmul(xt, w.transpose(0, 1)), first_t));
    }
    w.mul_(0.5);  // in place: the kept copies are stale
    EXPECT_TRUE(allclose(matmul(x, w).to(kFloat64), want * 0.5, 1e-5, 1e-4));
    EXPECT_TRUE(equal(matmul(x, w), first * 0.5));  // halving is exact
    EXPECT_TRUE(equal(matmul(xt, w.transpose(0, 1)), first_t * 0.5));
  }
}
