// matmul_chain (include/braid/chain.h, Note [float32 epilogues] in src/backend/cpu/matmul_weight.cpp):
// a float32 product by a weight carried through a linear layer's steps. Against the product summed
// in double by a loop here and the steps applied in float32 (a closed form, to the product's
// rounding), and bit for bit against the steps run as ops on braid's own product (which sums in the
// same kernel). Each case runs three times with one weight, so that the weight is kept and the
// product's epilogue runs from the second call on; that the backend's epilogue ran is checked
// directly on the CPU backend where oneDNN is built in. Also: the thread count oneDNN's products run
// with on a thread other than the one that set braid's (Note [oneDNN's team size]).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "ops/fused.h"
#include "braid/config.h"
#ifdef BRAID_HAVE_DNNL
#include "backend/cpu/cpu_backend.h"
#endif

namespace braid {
namespace {

using K = ChainStep::Kind;
constexpr int C = ChainStep::kConstant, T = ChainStep::kTensor;

ChainStep step(K kind, int a, int b, float k = 0, Tensor operand = Tensor()) {
  ChainStep s;
  s.kind = kind;
  s.a = a;
  s.b = b;
  s.k = k;
  s.operand = std::move(operand);
  return s;
}

// (rows, n) = a (rows, k) times b (k, n), each sum in double, rounded once to float.
std::vector<float> reference_product(const std::vector<float>& a, const std::vector<float>& b, int64_t rows, int64_t k,
                                     int64_t n) {
  std::vector<float> p(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q)
        s += static_cast<double>(a[static_cast<size_t>(r * k + q)]) * b[static_cast<size_t>(q * n + j)];
      p[static_cast<size_t>(r * n + j)] = static_cast<float>(s);
    }
  return p;
}

TEST(MatmulChain, IsTheProductThroughTheSteps) {
  Generator gen(31);
  // 2 x 16 rows by a 64 x 48 weight: above oneDNN's size threshold on every core (2^16 multiply-adds).
  const int64_t batch = 2, m = 16, k = 64, n = 48;
  const Tensor a = randn({batch, m, k}, kFloat32, &gen), b = randn({k, n}, kFloat32, &gen) * 0.2;
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  const std::vector<float> p = reference_product(av, bv, batch * m, k, n);
  const std::vector<float> bias = randn({n}, kFloat32, &gen).to_vector<float>();
  const std::vector<float> col = (rand({n}, kFloat32, &gen) + 0.5).to_vector<float>();
  const std::vector<float> res = randn({batch, m, n}, kFloat32, &gen).to_vector<float>();
  const Tensor bias_t = tensor(bias, {n}), col_t = tensor(col, {1, n}), res_t = tensor(res, {batch, m, n});
  // Each element of the product is within k * 2^-23 * sum |a_q b_q| of its exact value (float32
  // sums in any order); the steps after it scale that by at most |col| < 1.5 or 1 / 0.5.
  std::vector<float> bound(p.size());
  for (int64_t r = 0; r < batch * m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q)
        s += std::fabs(static_cast<double>(av[static_cast<size_t>(r * k + q)]) * bv[static_cast<size_t>(q * n + j)]);
      bound[static_cast<size_t>(r * n + j)] = static_cast<float>(4.0 * k * std::ldexp(s, -23)) + 1e-6f;
    }
  struct Case {
    const char* name;
    std::vector<ChainStep> steps;
    float (*want)(float p, int64_t j, int64_t i, const std::vector<float>& bias, const std::vector<float>& col,
                  const std::vector<float>& res);
  };
  const std::vector<Case> cases = {
      {"bias (a linear layer)",
       {step(K::Add, T, 0, 0, bias_t)},
       [](float p, int64_t j, int64_t, const std::vector<float>& bias, const std::vector<float>&,
          const std::vector<float>&) { return bias[j] + p; }},
      {"bias and residual (a transformer's projection)",
       {step(K::Add, 0, T, 0, bias_t), step(K::Add, T, 1, 0, res_t)},
       [](float p, int64_t j, int64_t i, const std::vector<float>& bias, const std::vector<float>&,
          const std::vector<float>& res) { return res[i] + (p + bias[j]); }},
      {"per-column scale, division, subtraction",
       {step(K::Mul, 0, T, 0, col_t), step(K::Div, 1, C, 0.5f), step(K::Sub, 2, T, 0, bias_t)},
       [](float p, int64_t j, int64_t, const std::vector<float>& bias, const std::vector<float>& col,
          const std::vector<float>&) { return p * col[j] / 0.5f - bias[j]; }},
      {"a constant minus the product (no epilogue)",
       {step(K::Sub, C, 0, 1.5f), step(K::Add, 1, T, 0, bias_t)},
       [](float p, int64_t j, int64_t, const std::vector<float>& bias, const std::vector<float>&,
          const std::vector<float>&) { return (1.5f - p) + bias[j]; }},
      {"a later step reads the product",
       {step(K::Add, 0, T, 0, bias_t), step(K::Mul, 1, 0)},
       [](float p, int64_t j, int64_t, const std::vector<float>& bias, const std::vector<float>&,
          const std::vector<float>&) { return (p + bias[j]) * p; }},
  };
  NoGradGuard no_grad;
  for (const Case& c : cases)
    for (int call = 0; call < 3; ++call) {
      const std::vector<float> got = detail::matmul_chain(a, b, c.steps).to_vector<float>();
      const std::vector<float> ops = detail::elementwise_chain(matmul(a, b), c.steps).to_vector<float>();
      ASSERT_EQ(got.size(), p.size());
      ASSERT_EQ(got, ops) << c.name << ", call " << call << ": not the steps run as ops";
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t j = static_cast<int64_t>(i) % n;
        // The closed form on the exact product, and the closed form's own spread between the
        // product's two bounds (the steps are monotone in p over the case's range but for the last).
        const float want = c.want(p[i], j, static_cast<int64_t>(i), bias, col, res);
        const float lo = c.want(p[i] - bound[i], j, static_cast<int64_t>(i), bias, col, res);
        const float hi = c.want(p[i] + bound[i], j, static_cast<int64_t>(i), bias, col, res);
        const float tol = std::fabs(hi - lo) + 1e-5f * std::fabs(want) + 1e-5f;
        ASSERT_NEAR(got[i], want, tol) << c.name << ", call " << call << ", element " << i;
      }
    }
  // Steps after the epilogue run as a chain: GELU of the biased product, then a scale.
  std::vector<ChainStep> gelu_steps{step(K::Add, 0, T, 0, bias_t), ChainStep{}, step(K::Mul, 2, C, 0.5f)};
  gelu_steps[1].kind = K::Gelu;
  gelu_steps[1].a = 1;
  for (int call = 0; call < 3; ++call)
    EXPECT_EQ(detail::matmul_chain(a, b, gelu_steps).to_vector<float>(), (gelu(matmul(a, b) + bias_t) * 0.5).to_vector<float>())
        << "call " << call;
#ifdef BRAID_HAVE_DNNL
  // The weight has been seen: the CPU backend's epilogue takes the bias and the residual.
  const Tensor out = empty({batch * m, n});
  const std::vector<detail::FusedKernels::EpilogueStep> epilogue{{K::Add, bias_t, 0},
                                                            {K::Add, res_t.reshape({batch * m * n}), 0}};
  ASSERT_TRUE(detail::cpu_backend().fused().matmul_epilogue(a.reshape({batch * m, k}), b, epilogue, out));
  EXPECT_EQ(out.reshape({batch, m, n}).to_vector<float>(), ((matmul(a, b) + bias_t) + res_t).to_vector<float>());
#endif
}

// matmul_chain of what is no product by a weight (b not 2-D, int32 operands) is the ops'.
TEST(MatmulChain, OtherOperandsRunAsTheOps) {
  Generator gen(32);
  const Tensor a = randn({3, 4, 5}, kFloat32, &gen), b = randn({3, 5, 6}, kFloat32, &gen);
  const std::vector<ChainStep> steps{step(K::Mul, 0, C, 2.0f)};
  NoGradGuard no_grad;
  EXPECT_EQ(detail::matmul_chain(a, b, steps).to_vector<float>(), (matmul(a, b) * 2.0).to_vector<float>());
  const Tensor ai = tensor(std::vector<int32_t>{1, 2, 3, 4}, {2, 2}),
               bi = tensor(std::vector<int32_t>{5, 6, 7, 8}, {2, 2});
  // (1 2; 3 4)(5 6; 7 8) = (19 22; 43 50), converted to float32 by the chain, then doubled.
  EXPECT_EQ(detail::matmul_chain(ai, bi, steps).to_vector<float>(), (std::vector<float>{38, 44, 86, 100}));
}

#ifdef BRAID_HAVE_DNNL
// The threads of this process (Linux: one entry each under /proc/self/task).
size_t process_threads() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

// Note [oneDNN's team size]: with braid told to use one thread, a product through oneDNN on a fresh
// thread (whose OpenMP setting is every core until told otherwise) starts no OpenMP worker, and
// leaves that thread's OpenMP count at braid's.
TEST(MatmulThreads, AFreshThreadsProductUsesBraidsThreadCount) {
  if (omp_get_num_procs() < 2) GTEST_SKIP() << "one core: every team is one thread";
  const int saved = get_num_threads();
  set_num_threads(1);
  Generator gen(33);
  const Tensor a = randn({64, 256}, kFloat32, &gen), b = randn({256, 256}, kFloat32, &gen);
  const std::vector<float> want = matmul(a, b).to_vector<float>();
  size_t before = 0, after = 0;
  int team = 0;
  std::vector<float> got;
  std::thread([&] {
    NoGradGuard no_grad;
    before = process_threads();
    for (int call = 0; call < 3; ++call) got = matmul(a, b).to_vector<float>();  // the weight kept from the second
    after = process_threads();
    team = omp_get_max_threads();
  }).join();
  set_num_threads(saved);
  EXPECT_EQ(after, before) << "an OpenMP worker was started for a one-thread product";
  EXPECT_EQ(team, 1);
  EXPECT_EQ(got, want);
}
#endif

}  // namespace
}  // namespace braid
