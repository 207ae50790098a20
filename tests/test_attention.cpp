// scaled_dot_product_attention on the test device (the CPU, or the shadow device with the CUDA
// backend's capability set) against a direct double-precision loop over its definition, its
// gradients against central differences in float64, dropout against dropout() on the same seed,
// and its front-door errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "braid/braid.h"
#include "braid/nn/layers.h"
#include "gradcheck.h"
#include "ops/trace.h"
#include "test_device.h"

namespace braid {
namespace {

using V = const std::vector<Tensor>&;
const double kInf = std::numeric_limits<double>::infinity();

// The row-major batch offset of index b of shape `batch` into a tensor of batch shape `own`
// (broadcast: size-1 axes repeat; missing leading axes too).
int64_t batch_offset(const Shape& batch, const Shape& own, int64_t b) {
  int64_t off = 0, stride = 1;
  for (size_t k = batch.size(); k-- > 0;) {
    const int64_t idx = b % batch[k];
    b /= batch[k];
    const size_t shift = batch.size() - own.size();
    if (k >= shift && own[k - shift] != 1) off += idx * stride;
    if (k >= shift) stride *= own[k - shift];
  }
  return off;
}

Shape head(const Tensor& t, int64_t n) { return Shape(t.shape().begin(), t.shape().end() - n); }

// out (batch..., L, Ev) computed element by element in double: scores, bias, softmax, product.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal, double scale) {
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  const Shape batch = broadcast_shapes(broadcast_shapes(head(q, 2), head(k, 2)), head(v, 2));
  int64_t B = 1;
  for (int64_t d : batch) B *= d;
  const auto qv = q.cpu().to(kFloat64).to_vector<double>(), kv = k.cpu().to(kFloat64).to_vector<double>(),
             vv = v.cpu().to(kFloat64).to_vector<double>();
  Tensor m;
  Shape ms;
  if (mask.defined()) {
    Shape full = batch;
    full.insert(full.end(), {L, S});
    m = mask.cpu().expand(full).contiguous();
    ms = batch;
  }
  std::vector<double> mv = m.defined() ? m.to(kFloat64).to_vector<double>() : std::vector<double>();
  std::vector<double> out(static_cast<size_t>(B * L * Ev));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qo = batch_offset(batch, head(q, 2), b) * L * E, ko = batch_offset(batch, head(k, 2), b) * S * E,
                  vo = batch_offset(batch, head(v, 2), b) * S * Ev;
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(static_cast<size_t>(S));
      double mx = -kInf;
      for (int64_t j = 0; j < S; ++j) {
        double x = 0;
        for (int64_t e = 0; e < E; ++e) x += qv[qo + i * E + e] * kv[ko + j * E + e];
        x *= scale;
        if (causal && j > i) x = -kInf;
        if (m.defined()) {
          const double mb = mv[static_cast<size_t>((b * L + i) * S + j)];
          x = mask.dtype() == kBool ? (mb != 0 ? x : -kInf) : x + mb;
        }
        s[j] = x;
        mx = std::max(mx, x);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - mx));
      for (int64_t c = 0; c < Ev; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += s[j] / z * vv[vo + j * Ev + c];
        out[static_cast<size_t>((b * L + i) * Ev + c)] = acc;
      }
    }
  }
  Shape os = batch;
  os.insert(os.end(), {L, Ev});
  return tensor(out, os, Device::cpu());
}

struct Case {
  std::string name;
  Shape q, k, v, mask;  // mask empty: none
  bool bool_mask = false, causal = false;
  std::optional<double> scale;
};

std::vector<Case> cases() {
  return {
      {"plain", {2, 5, 4}, {2, 5, 4}, {2, 5, 4}, {}, false, false, std::nullopt},
      {"l_ne_s_e_ne_ev", {2, 3, 4}, {2, 6, 4}, {2, 6, 5}, {}, false, false, std::nullopt},
      {"scale", {1, 4, 3}, {1, 4, 3}, {1, 4, 2}, {}, false, false, 0.3},
      {"causal_l_lt_s", {2, 3, 4}, {2, 5, 4}, {2, 5, 3}, {}, false, true, std::nullopt},
      {"causal_l_gt_s", {2, 5, 4}, {2, 3, 4}, {2, 3, 3}, {}, false, true, std::nullopt},
      {"float_mask", {2, 4, 3}, {2, 5, 3}, {2, 5, 3}, {2, 4, 5}, false, false, std::nullopt},
      {"bool_mask_shared", {2, 2, 4, 3}, {2, 2, 5, 3}, {2, 2, 5, 2}, {4, 5}, true, false, std::nullopt},
      {"float_mask_per_batch", {2, 3, 4, 3}, {2, 3, 5, 3}, {2, 3, 5, 3}, {2, 1, 1, 5}, false, false, std::nullopt},
      {"broadcast_heads", {2, 3, 4, 3}, {1, 3, 5, 3}, {3, 5, 2}, {}, false, false, std::nullopt},
      {"unbatched", {4, 3}, {6, 3}, {6, 2}, {4, 6}, true, false, std::nullopt},
  };
}

struct Inputs {
  Tensor q, k, v, mask;
};

Inputs make(const Case& c, DType dtype, uint64_t seed) {
  Generator gen(seed);
  const Device d = test::test_device();
  Inputs in{randn(c.q, dtype, &gen, 0, 1, d), randn(c.k, dtype, &gen, 0, 1, d), randn(c.v, dtype, &gen, 0, 1, d), {}};
  if (!c.mask.empty()) {
    // Keep the first key of every row, so that no row is wholly masked.
    Tensor keep = gt(rand(c.mask, kFloat32, &gen, 0, 1, d), full({}, 0.3, kFloat32, d));
    keep = logical_or(keep, eq(arange(c.mask.back(), kInt64, d), zeros({}, kInt64, d)));
    in.mask = c.bool_mask ? keep : where(keep, randn(c.mask, dtype, &gen, 0, 1, d), full({}, -kInf, dtype, d));
  }
  return in;
}

class Sdpa : public ::testing::TestWithParam<Case> {};

TEST_P(Sdpa, MatchesDirectLoop) {
  const Case& c = GetParam();
  const Inputs in = make(c, kFloat64, 11);
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(c.q.back()));
  const Tensor got = scaled_dot_product_attention(in.q, in.k, in.v, in.mask, 0.0, c.causal, c.scale);
  ASSERT_EQ(got.device(), test::test_device());
  const Tensor want = reference(in.q, in.k, in.v, in.mask, c.causal, scale);
  ASSERT_EQ(got.shape(), want.shape());
  const auto g = got.cpu().to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-12) << c.name << " element " << i;
  // float32 follows within float32's rounding.
  const Inputs f = {in.q.to(kFloat32), in.k.to(kFloat32), in.v.to(kFloat32),
                    in.mask.defined() && in.mask.dtype() != kBool ? in.mask.to(kFloat32) : in.mask};
  const auto g32 = scaled_dot_product_attention(f.q, f.k, f.v, f.mask, 0.0, c.causal, c.scale).cpu().to_vector<float>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g32[i], w[i], 1e-5) << c.name << " float32 element " << i;
}

TEST_P(Sdpa, GradientsMatchCentralDifferences) {
  const Case& c = GetParam();
  const Inputs in = make(c, kFloat64, 12);
  const bool mask_input = in.mask.defined() && in.mask.dtype() != kBool;
  std::vector<Tensor> inputs = {in.q, in.k, in.v};
  // The float mask's -inf entries have no finite difference: its gradient is checked where finite.
  const Tensor blocked = mask_input ? eq(in.mask, full({}, -kInf, kFloat64, in.mask.device())) : Tensor();
  if (mask_input) inputs.push_back(where(blocked, zeros({}, kFloat64, in.mask.device()), in.mask));
  std::string where_;
  const double err = testing::gradcheck_error(
      [&](V x) {
        Tensor m = in.mask;
        if (mask_input) m = braid::where(blocked, full({}, -kInf, kFloat64, x[3].device()), x[3]);
        return scaled_dot_product_attention(x[0], x[1], x[2], m, 0.0, c.causal, c.scale);
      },
      inputs, 1e-6, &where_);
  EXPECT_LE(err, 1e-6) << c.name << ": worst at " << where_;
}

INSTANTIATE_TEST_SUITE_P(Attention, Sdpa, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(SdpaDropout, EqualsDropoutOfTheProbabilitiesOnTheSameSeed) {
  const Inputs in = make(cases()[5], kFloat64, 13);
  Generator g1(99), g2(99);
  const Tensor got = scaled_dot_product_attention(in.q, in.k, in.v, in.mask, 0.4, false, std::nullopt, &g1);
  const Tensor s = matmul(in.q * (1.0 / std::sqrt(3.0)), in.k.mT()) + in.mask;
  const Tensor want = matmul(nn::dropout(softmax(s, -1), 0.4, true, &g2), in.v);
  EXPECT_EQ(got.cpu().to_vector<double>(), want.cpu().to_vector<double>());
  // Its gradient, with the mask redrawn identically on every call.
  const double err = testing::gradcheck_error(
      [&](V x) {
        Generator g(5);
        return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.3, false, std::nullopt, &g);
      },
      {in.q, in.k, in.v});
  EXPECT_LE(err, 1e-6);
}

TEST(SdpaEdges, WhollyMaskedRowIsNaNAndNoKeysGiveZeros) {
  const Device d = test::test_device();
  const Tensor q = ones({1, 2, 2}, kFloat32, d), k = ones({1, 3, 2}, kFloat32, d), v = ones({1, 3, 2}, kFloat32, d);
  Tensor mask = tensor(std::vector<float>{1, 1, 1, 0, 0, 0}, {2, 3}, d).to(kBool);
  const auto out = scaled_dot_product_attention(q, k, v, mask).cpu().to_vector<float>();
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]));
  const Tensor none = scaled_dot_product_attention(q, zeros({1, 0, 2}, kFloat32, d), zeros({1, 0, 4}, kFloat32, d));
  EXPECT_EQ(none.shape(), (Shape{1, 2, 4}));
  EXPECT_EQ(none.cpu().to_vector<float>(), std::vector<float>(8, 0.0f));
}

TEST(SdpaTrace, TracesAsItsCompositeOps) {
  const Device d = test::test_device();
  const Tensor q = ones({2, 3}, kFloat32, d);
  detail::Trace trace;
  {
    detail::TraceScope scope(&trace);
    const Tensor out = scaled_dot_product_attention(q, q, q);
    EXPECT_EQ(out.shape(), q.shape());
  }
  std::vector<std::string> ops;
  for (const auto& e : trace.entries) ops.push_back(e.op);
  EXPECT_NE(std::find(ops.begin(), ops.end(), "softmax"), ops.end());
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "matmul"), 2);
}

TEST(SdpaErrors, NameShapesAndDtypes) {
  const Device d = test::test_device();
  const Tensor q = zeros({2, 3, 4}, kFloat32, d);
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THROW(scaled_dot_product_attention(q, zeros({2, 5, 3}, kFloat32, d), zeros({2, 5, 4}, kFloat32, d)),
               ValueError);
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, zeros({2, 5, 3}, kFloat32, d), q); }).find("[2, 5, 3]"),
            std::string::npos);
  EXPECT_THROW(scaled_dot_product_attention(q, q, q.to(kFloat64)), TypeError);
  EXPECT_THROW(scaled_dot_product_attention(q.to(kInt32), q.to(kInt32), q.to(kInt32)), TypeError);
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, zeros({3, 3}, kInt64, d)), TypeError);
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, zeros({2, 4}, kFloat32, d)), ValueError);
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, zeros({3, 3}, kFloat32, d), 0.0, true), ValueError);
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, Tensor(), 1.5), ValueError);
  EXPECT_THROW(scaled_dot_product_attention(zeros({3}, kFloat32, d), q, q), ValueError);
}

}  // namespace
}  // namespace braid
