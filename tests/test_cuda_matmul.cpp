// Matrix products on CUDA through cuBLASLt (Note [Products through cuBLASLt] in
// src/backend/cuda/matmul_lt.cpp) against the CPU backend: float32, float16 and bfloat16 operands
// (half ones into float32 and into their own dtype) in every layout the product takes,
// matmul_epilogue against its composite (the product, then the steps as CPU ops), the algorithm table, the workspace in the allocator's statistics, and the
// TF32 mode of set_float32_matmul_precision against closed forms. Under the host emulation
// (tools/cuda_emu) the emulated cuBLASLt's counters, read through weak symbols, also show which
// library ran each product; on a GPU those checks are skipped and the values are still compared.
// cuda_parity.h's helpers are internal functions of each suite; this one leaves some unused.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "braid/nn/layers.h"
#include "cuda_parity.h"

extern "C" long emu_lt_heuristic_calls() __attribute__((weak));
extern "C" long emu_lt_matmul_calls() __attribute__((weak));
extern "C" size_t emu_lt_last_workspace() __attribute__((weak));
extern "C" long emu_lt_bias_calls() __attribute__((weak));

namespace braid {
namespace {

using Step = detail::FusedKernels::EpilogueStep;
using Kind = ChainStep::Kind;

bool emulated() { return emu_lt_matmul_calls != nullptr; }
long lt_products() { return emulated() ? emu_lt_matmul_calls() : 0; }
long lt_queries() { return emulated() ? emu_lt_heuristic_calls() : 0; }

// Restores the precision a test changed.
struct PrecisionGuard {
  std::string saved = float32_matmul_precision();
  ~PrecisionGuard() { set_float32_matmul_precision(saved); }
};

Shape product_shape(const Layout& a, const Layout& b) {
  Shape s = a.shape;
  s.back() = b.shape.back();
  return s;
}

// ---- products through cuBLASLt ----

TEST(CudaMatmul, LtProductsMatchTheCpu) {
  REQUIRE_CUDA();
  struct Case {
    std::string name;
    Layout a, b;
  };
  const int64_t m = 19, k = 23, n = 17;  // odd sizes: no dimension a multiple of a tile
  const std::vector<Case> cases = {
      {"plain", {"", {m, k}, {k, 1}}, {"", {k, n}, {n, 1}}},
      {"a transposed", {"", {m, k}, {1, m}}, {"", {k, n}, {n, 1}}},
      {"b transposed", {"", {m, k}, {k, 1}}, {"", {k, n}, {1, k}}},
      {"both transposed", {"", {m, k}, {1, m}}, {"", {k, n}, {1, k}}},
      {"offset view", {"", {m, k}, {k + 3, 1}, 1}, {"", {k, n}, {n, 1}, 3}},
      {"sliced (packed)", {"", {m, k}, {2 * k, 2}, 3}, {"", {k, n}, {3 * n, 3}, 1}},
      {"M = 1", {"", {1, k}, {k, 1}}, {"", {k, n}, {n, 1}}},
      {"N = 1", {"", {m, k}, {k, 1}}, {"", {k, 1}, {1, 1}}},
      {"K = 1", {"", {m, 1}, {1, 1}}, {"", {1, n}, {n, 1}}},
      {"1 x 1 x 1", {"", {1, 1}, {1, 1}}, {"", {1, 1}, {1, 1}}},
      {"batched", {"", {3, m, k}, {m * k, k, 1}}, {"", {3, k, n}, {k * n, n, 1}}},
      {"batched, b transposed", {"", {3, m, k}, {m * k, k, 1}}, {"", {3, k, n}, {k * n, 1, k}}},
      {"shared weight (one product)", {"", {3, m, k}, {m * k, k, 1}}, {"", {3, k, n}, {0, n, 1}}},
      {"broadcast a", {"", {3, m, k}, {0, k, 1}}, {"", {3, k, n}, {k * n, n, 1}}},
      {"two batch axes, one broadcast", {"", {2, 3, m, k}, {0, m * k, k, 1}},
       {"", {2, 3, k, n}, {3 * k * n, k * n, n, 1}}},
      {"batch-transposed", {"", {3, m, k}, {k, 3 * k, 1}}, {"", {3, k, n}, {k * n, n, 1}}},
  };
  // Half operands into float32 and into their own dtype (C/D of the half type, float32 compute):
  // float32 results a few ulp apart, so halves equal or one ulp apart.
  for (const auto& [t, out_t] : std::vector<std::pair<DType, DType>>{{kFloat32, kFloat32},
                                                                     {kFloat16, kFloat32},
                                                                     {kBFloat16, kFloat32},
                                                                     {kFloat16, kFloat16},
                                                                     {kBFloat16, kBFloat16}}) {
    const Tol tol = out_t == kFloat16 ? Tol{1e-3, 1e-4} : out_t == kBFloat16 ? Tol{8e-3, 1e-4} : Tol{1e-5, 1e-5};
    for (const Case& c : cases) {
      const Operand a = operand(c.a, t, 61, {-1, 1, false}), b = operand(c.b, t, 62, {-1, 1, false});
      const long before = lt_products();
      const std::string what = "matmul " + c.name + " " + dtype_name(t) + " -> " + dtype_name(out_t);
      expect_parity(what, tol, [&](Device d) {
        Tensor out = fresh(product_shape(c.a, c.b), out_t, d);
        backend(d).matmul(a.on(d), b.on(d), out);
        return out;
      });
      if (emulated()) {
        EXPECT_GT(lt_products(), before) << what << ": not through cuBLASLt";
      }
    }
  }
}

TEST(CudaMatmul, EmptyProductsAndFloat64StayOffLt) {
  REQUIRE_CUDA();
  const long before = lt_products();
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{5, 0}, {0, 4}}, {{0, 3}, {3, 4}}, {{5, 3}, {3, 0}}}) {
    const Layout la{"", sa, {sa[1], 1}}, lb{"", sb, {sb[1], 1}};
    const Operand a = operand(la, kFloat32, 1), b = operand(lb, kFloat32, 2);
    expect_parity("empty matmul", {}, [&](Device d) {
      Tensor out = fresh(product_shape(la, lb), kFloat32, d);
      backend(d).matmul(a.on(d), b.on(d), out);
      return out;
    });
  }
  const Layout la{"", {7, 9}, {9, 1}}, lb{"", {9, 5}, {5, 1}};
  const Operand a = operand(la, kFloat64, 3, {-1, 1, false}), b = operand(lb, kFloat64, 4, {-1, 1, false});
  expect_parity("float64 matmul (cuBLAS)", {1e-13, 1e-13}, [&](Device d) {
    Tensor out = fresh({7, 5}, kFloat64, d);
    backend(d).matmul(a.on(d), b.on(d), out);
    return out;
  });
  EXPECT_EQ(lt_products(), before);
}

TEST(CudaMatmul, AlgorithmIsCachedPerShapeAndLayout) {
  REQUIRE_CUDA();
  const Tensor a = draw(29 * 31, kFloat32, 7, {-1, 1, false}).reshape({29, 31});
  const Tensor b = draw(31 * 37, kFloat32, 8, {-1, 1, false}).reshape({31, 37});
  const Tensor ac = a.to(kCuda), bc = b.to(kCuda);
  const long q0 = lt_queries();
  const Tensor first = matmul(ac, bc).cpu();
  const long q1 = lt_queries();
  const Tensor second = matmul(ac, bc).cpu();
  const long q2 = lt_queries();
  const Tensor transposed = matmul(ac, bc.permute({1, 0}).contiguous().permute({1, 0})).cpu();  // b column-major: another layout
  const long q3 = lt_queries();
  EXPECT_EQ(values_of(first), values_of(second));
  expect_match(matmul(ac, bc.permute({1, 0}).contiguous().permute({1, 0})), matmul(a, b), {1e-5, 1e-5}, "column-major b");
  if (emulated()) {
    EXPECT_EQ(q1 - q0, 1) << "a new shape asks the heuristic once";
    EXPECT_EQ(q2 - q1, 0) << "a repeated shape is served from the table";
    EXPECT_EQ(q3 - q2, 1) << "another layout is another entry";
  }
}

TEST(CudaMatmul, WorkspaceComesFromTheCachingAllocator) {
  REQUIRE_CUDA();
  const Tensor a = draw(41 * 43, kFloat32, 9, {-1, 1, false}).reshape({41, 43}).to(kCuda);
  const Tensor b = draw(43 * 47, kFloat32, 10, {-1, 1, false}).reshape({43, 47}).to(kCuda);
  Tensor out = fresh({41, 47}, kFloat32, kCuda);
  synchronize(kCuda);
  const int64_t live = memory_allocated(kCuda);
  reset_peak_memory_stats(kCuda);
  backend(kCuda).matmul(a, b, out);
  synchronize(kCuda);
  EXPECT_EQ(memory_allocated(kCuda), live) << "the workspace is returned after the product";
  if (emulated()) {
    ASSERT_GT(emu_lt_last_workspace(), 0u);
    EXPECT_GE(max_memory_allocated(kCuda) - live, static_cast<int64_t>(emu_lt_last_workspace()))
        << "the workspace is a block of the caching allocator, counted in the statistics";
  }
}

TEST(CudaMatmul, FallsBackToCublasWhereLtHasNoAlgorithm) {
  REQUIRE_CUDA();
  if (!emulated()) GTEST_SKIP() << "needs the emulated cuBLASLt, whose heuristic can be made to find nothing";
  setenv("EMU_LT_DECLINE", "1", 1);
  const long before = lt_products();
  const Layout la{"", {11, 13}, {13, 1}}, lb{"", {13, 3}, {3, 1}};  // shapes no other test asks for
  for (const auto& [t, out_t] : std::vector<std::pair<DType, DType>>{
           {kFloat32, kFloat32}, {kFloat16, kFloat32}, {kFloat16, kFloat16}, {kBFloat16, kBFloat16}}) {
    const Operand a = operand(la, t, 12, {-1, 1, false}), b = operand(lb, t, 13, {-1, 1, false});
    const Tol tol = out_t == kFloat16 ? Tol{1e-3, 1e-4} : out_t == kBFloat16 ? Tol{8e-3, 1e-4} : Tol{1e-5, 1e-5};
    expect_parity("matmul through cuBLAS " + dtype_name(t) + " -> " + dtype_name(out_t), tol, [&](Device d) {
      Tensor out = fresh({11, 3}, out_t, d);
      backend(d).matmul(a.on(d), b.on(d), out);
      return out;
    });
  }
  const Tensor x = draw(11 * 13, kFloat32, 14, {-1, 1, false}).reshape({11, 13});
  const Tensor w = draw(13 * 3, kFloat32, 15, {-1, 1, false}).reshape({13, 3});
  const Tensor bias = draw(3, kFloat32, 16, {-1, 1, false});
  Tensor out = fresh({11, 3}, kFloat32, kCuda);
  const bool done = backend(kCuda).fused().matmul_epilogue(x.to(kCuda), w.to(kCuda), {Step{Kind::Add, bias.to(kCuda), 0}}, out);
  unsetenv("EMU_LT_DECLINE");
  ASSERT_TRUE(done);
  expect_match(out, matmul(x, w) + bias, {1e-5, 1e-5}, "matmul_epilogue through cuBLAS");
  EXPECT_EQ(lt_products(), before);
}

// ---- matmul_epilogue ----

// The composite: the product, then each step as a float32 op on the CPU.
Tensor composite(const Tensor& a, const Tensor& b, const std::vector<Step>& steps) {
  Tensor y = matmul(a, b);
  const int64_t n = y.size(1);
  for (const Step& s : steps) {
    const Tensor x = !s.operand.defined()      ? full({}, s.k, kFloat32)
                     : s.operand.numel() == 1  ? s.operand.reshape({})
                     : s.operand.numel() == n  ? s.operand.reshape({n})
                                               : s.operand.reshape(y.shape());
    y = s.kind == Kind::Add ? y + x : s.kind == Kind::Sub ? y - x : s.kind == Kind::Mul ? y * x : y / x;
  }
  return y;
}

TEST(CudaMatmul, EpilogueMatchesItsComposite) {
  REQUIRE_CUDA();
  const int64_t m = 21, k = 18, n = 13;
  const Tensor a = draw(m * k, kFloat32, 21, {-1, 1, false}).reshape({m, k});
  const Tensor b = draw(k * n, kFloat32, 22, {-1, 1, false}).reshape({k, n});
  // Operands in [0.5, 2]: divisors away from zero.
  const Tensor one = draw(1, kFloat32, 23, {0.5, 2, false}), column = draw(n, kFloat32, 24, {0.5, 2, false});
  const Tensor whole = draw(m * n, kFloat32, 25, {0.5, 2, false});
  std::vector<std::pair<std::string, std::vector<Step>>> cases;
  for (Kind kind : {Kind::Add, Kind::Sub, Kind::Mul, Kind::Div}) {
    const std::string name = kind == Kind::Add ? "add" : kind == Kind::Sub ? "sub" : kind == Kind::Mul ? "mul" : "div";
    cases.push_back({name + " a number", {Step{kind, Tensor(), 1.75f}}});
    cases.push_back({name + " one value", {Step{kind, one, 0}}});
    cases.push_back({name + " per column", {Step{kind, column, 0}}});
    cases.push_back({name + " whole", {Step{kind, whole, 0}}});
  }
  cases.push_back({"bias, residual, scale", {Step{Kind::Add, column, 0}, Step{Kind::Add, whole, 0}, Step{Kind::Mul, Tensor(), 0.125f}}});
  cases.push_back({"bias, then bias again", {Step{Kind::Add, column, 0}, Step{Kind::Add, column, 0}}});
  cases.push_back({"scale, then bias", {Step{Kind::Div, one, 0}, Step{Kind::Add, column, 0}, Step{Kind::Sub, whole, 0}}});
  for (const auto& [name, steps] : cases) {
    expect_parity("matmul_epilogue " + name, {1e-5, 1e-5}, [&](Device d) {
      if (d.is_cpu()) return composite(a, b, steps);
      std::vector<Step> on_device;
      for (const Step& s : steps) on_device.push_back({s.kind, s.operand.defined() ? s.operand.to(d) : Tensor(), s.k});
      Tensor out = fresh({m, n}, kFloat32, d);
      EXPECT_TRUE(backend(d).fused().matmul_epilogue(a.to(d), b.to(d), on_device, out)) << name;
      return out;
    });
  }
}

TEST(CudaMatmul, EpilogueBiasIsAddedOnceAfterTheProduct) {
  REQUIRE_CUDA();
  // Whole numbers: the product and the bias are exact, so the result is the composite bit for bit.
  const Tensor a = round(draw(9 * 5, kFloat32, 31, {-4, 4, false})).reshape({9, 5});
  const Tensor b = round(draw(5 * 6, kFloat32, 32, {-4, 4, false})).reshape({5, 6});
  const Tensor bias = round(draw(6, kFloat32, 33, {-50, 50, false}));
  Tensor out = fresh({9, 6}, kFloat32, kCuda);
  const long before = lt_products();
  ASSERT_TRUE(backend(kCuda).fused().matmul_epilogue(a.to(kCuda), b.to(kCuda), {Step{Kind::Add, bias.to(kCuda), 0}}, out));
  expect_match(out, matmul(a, b) + bias, {}, "product + bias");
  if (emulated()) {
    EXPECT_EQ(lt_products() - before, 1) << "the bias rides in cuBLASLt's epilogue";
  }
}

TEST(CudaMatmul, EpilogueDeclinesWhatItDoesNotTake) {
  REQUIRE_CUDA();
  const Tensor a = fresh({4, 3}, kFloat64, kCuda), b = fresh({3, 2}, kFloat64, kCuda);
  Tensor out = fresh({4, 2}, kFloat64, kCuda);
  EXPECT_FALSE(backend(kCuda).fused().matmul_epilogue(a, b, {Step{Kind::Add, Tensor(), 1}}, out));
  const Tensor af = fresh({4, 0}, kFloat32, kCuda), bf = fresh({0, 2}, kFloat32, kCuda);
  Tensor outf = fresh({4, 2}, kFloat32, kCuda);
  EXPECT_FALSE(backend(kCuda).fused().matmul_epilogue(af, bf, {Step{Kind::Add, Tensor(), 1}}, outf));
}

// ---- a linear layer's bias in the epilogue (Note [Linear as one node] in src/ops/linalg.cpp) ----

// Whole numbers: products of [-4, 4] over K = 5 and a bias in [-50, 50] stay within 130, exact in
// float32, float16 and bfloat16 alike, so the entry (the bias added before the one rounding) must
// give the composite's values bit for bit, into float32 and into the operands' half dtype.
TEST(CudaMatmul, LinearBiasRidesInTheEpilogue) {
  REQUIRE_CUDA();
  const Tensor x = round(draw(9 * 5, kFloat32, 41, {-4, 4, false})).reshape({9, 5});
  const Tensor w = round(draw(6 * 5, kFloat32, 42, {-4, 4, false})).reshape({6, 5});
  const Tensor bias = round(draw(6, kFloat32, 43, {-50, 50, false}));
  for (DType t : {kFloat32, kFloat16, kBFloat16})
    for (DType out_t : {t, kFloat32}) {
      const std::string what = dtype_name(t) + " into " + dtype_name(out_t);
      Tensor out = fresh({9, 6}, out_t, kCuda);
      const long before = lt_products();
      ASSERT_TRUE(backend(kCuda).fused().linear_bias(x.to(t).to(kCuda), w.to(t).to(kCuda), bias.to(out_t).to(kCuda), out))
          << what;
      expect_match(out, (matmul(x, w.mT()) + bias).to(out_t), {}, what);
      if (emulated()) {
        EXPECT_EQ(lt_products() - before, 1) << what << ": one cuBLASLt product, the bias in its epilogue";
      }
    }
  Tensor out = fresh({9, 6}, kFloat32, kCuda);  // a bias of another dtype than out's is declined
  EXPECT_FALSE(backend(kCuda).fused().linear_bias(x.to(kCuda), w.to(kCuda), bias.to(kFloat16).to(kCuda), out));
}

// nn::linear with a bias trains through the entry on CUDA (one node: forward in the epilogue,
// backward the product's gradients and the bias's sum) against the CPU's composite: in float32, and
// under autocast, where the GPU's output is half (its gradient too) and the CPU's float32: the CPU's
// y rounded once to compare, its gradients against the GPU's within the half rounding of y's gradient.
TEST(CudaMatmul, LinearLayerTrainsThroughTheEntry) {
  REQUIRE_CUDA();
  const Tensor x0 = draw(2 * 7 * 5, kFloat32, 51, {-1, 1, false}).reshape({2, 7, 5});
  const Tensor w0 = draw(6 * 5, kFloat32, 52, {-1, 1, false}).reshape({6, 5}), b0 = draw(6, kFloat32, 53, {-1, 1, false});
  const Tensor probe = draw(2 * 7 * 6, kFloat32, 54, {-1, 1, false}).reshape({2, 7, 6});
  for (DType t : {kFloat32, kBFloat16, kFloat16}) {
    const bool amp = t != kFloat32;
    const std::string what = amp ? "autocast " + dtype_name(t) : std::string("float32");
    Tensor got[4], want[4];
    long bias_products = 0;
    for (int side = 0; side < 2; ++side) {
      const Device d = side ? kCuda : Device::cpu();
      Tensor x = x0.to(d), w = w0.to(d), b = b0.to(d);
      for (Tensor* v : {&x, &w, &b}) *v = v->detach().set_requires_grad();
      const long before = emu_lt_bias_calls ? emu_lt_bias_calls() : 0;
      Tensor y;
      {
        autocast scope(amp ? t : kBFloat16, amp);
        y = nn::linear(x, w, b);
      }
      if (side) bias_products = (emu_lt_bias_calls ? emu_lt_bias_calls() : 0) - before;
      sum(y.to(kFloat32) * probe.to(d)).backward();
      Tensor* out = side ? got : want;
      out[0] = y, out[1] = x.grad(), out[2] = w.grad(), out[3] = b.grad();
    }
    if (emu_lt_bias_calls) {
      EXPECT_EQ(bias_products, 1) << what << ": the forward's bias rode in the epilogue";
    }
    EXPECT_EQ(got[0].dtype(), t) << what << ": the GPU keeps the activation in " << dtype_name(t);
    const Tol tol = !amp ? Tol{1e-5, 1e-5} : t == kFloat16 ? Tol{2e-3, 2e-3} : Tol{1.6e-2, 1.6e-2};
    const char* names[] = {"y", "dx", "dw", "db"};
    for (int i = 0; i < 4; ++i)
      expect_match(got[i], i == 0 ? want[i].to(t) : want[i], tol, what + " " + names[i]);
  }
}

// ---- TF32 ----

// a (m, k) = 1 + {0, 1, 3} * 2^-12 and b (k, n) small whole numbers: every sum is exact in float32
// with the operands as given and with them rounded to TF32 (10 bits: 1 + 2^-12 -> 1 and
// 1 + 3 * 2^-12 -> 1 + 2^-10 to nearest; both -> 1 truncated), so each setting has a closed form.
TEST(CudaMatmul, Tf32RoundsTheOperandsOfFloat32Products) {
  REQUIRE_CUDA();
  PrecisionGuard guard;
  const int64_t m = 6, k = 16, n = 5;
  std::vector<float> av(m * k), bv(k * n);
  std::vector<double> exact(m * n, 0.0), nearest(m * n, 0.0), truncated(m * n, 0.0);
  const double offsets[] = {0, 0x1p-12, 3 * 0x1p-12}, rounded[] = {0, 0, 0x1p-10};
  for (int64_t i = 0; i < m * k; ++i) av[i] = static_cast<float>(1 + offsets[i % 3]);
  for (int64_t i = 0; i < k * n; ++i) bv[i] = static_cast<float>(1 + i % 3);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) {
        const double bb = bv[l * n + j];
        exact[i * n + j] += av[i * k + l] * bb;
        nearest[i * n + j] += (1 + rounded[(i * k + l) % 3]) * bb;
        truncated[i * n + j] += bb;
      }
  const Tensor a = tensor(av, {m, k}, Device::cpu()), b = tensor(bv, {k, n}, Device::cpu());
  set_float32_matmul_precision("highest");
  EXPECT_EQ(values_of(matmul(a.to(kCuda), b.to(kCuda))), exact);
  EXPECT_EQ(values_of(matmul(a, b)), exact);
  for (const char* p : {"high", "medium"}) {
    set_float32_matmul_precision(p);
    const std::vector<double> got = values_of(matmul(a.to(kCuda), b.to(kCuda)));
    EXPECT_NE(got, exact) << p;
    if (emulated()) {
      EXPECT_EQ(got, nearest) << p << ": operands rounded to TF32, to nearest";
    } else {
      EXPECT_TRUE(got == nearest || got == truncated) << p << ": operands rounded to TF32";
    }
    EXPECT_EQ(values_of(matmul(a, b)), exact) << p << ": the CPU's float32 products are unchanged";
    // Through cuBLAS too, where cuBLASLt has no algorithm.
    if (emulated()) {
      setenv("EMU_LT_DECLINE", "1", 1);
      const Tensor a2 = tensor(av, {m, k}, Device::cpu()).reshape({2, m / 2, k});  // another shape: not cached
      const std::vector<double> via_cublas = values_of(matmul(a2.to(kCuda), b.to(kCuda)));
      unsetenv("EMU_LT_DECLINE");
      EXPECT_EQ(via_cublas, nearest) << p << " through cuBLAS";
    }
    // The setting leaves products of float16 operands alone.
    expect_parity(std::string("float16 matmul under ") + p, {}, [&](Device d) {
      Tensor out = fresh({m, n}, kFloat32, d);
      backend(d).matmul(a.to(kFloat16).to(d), b.to(kFloat16).to(d), out);
      return out;
    });
  }
}

TEST(CudaMatmul, PrecisionSetterRefusesOtherValues) {
  PrecisionGuard guard;
  for (const char* bad : {"fast", "", "HIGH", "tf32"}) {
    const std::string msg = error_of<ValueError>([&] { set_float32_matmul_precision(bad); });
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("highest, high or medium"), std::string::npos) << msg;
  }
  EXPECT_EQ(float32_matmul_precision(), guard.saved);
}

}  // namespace
}  // namespace braid
