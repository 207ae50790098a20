// cuDNN's convolutions on the CUDA backend (Note [cuDNN convolutions] in src/backend/cuda/cudnn_conv.cpp)
// against the CPU: braid::conv2d and its gradients on cuda:0, and the FusedKernels entries called
// directly, in float32, float64 and (under autocast, or as half operands) float16 and bfloat16, on
// NCHW and channels-last activations, over strides, padding, dilation, groups, depthwise, 1x1 and
// small ResNet-50-like shapes. Half operands with half outputs (cuDNN's PSEUDO_HALF_CONFIG and
// PSEUDO_BFLOAT16_CONFIG, Note [Half outputs] in src/ops/conv.cpp) in all three passes, against
// the CPU's float32 composite of the rounded operands rounded once. Also the algorithm table, the
// benchmark setting, the workspace from the allocator, cuDNN's errors as braid::Error, and
// declining where cuDNN refuses. CI runs it against the host emulation
// (tools/cuda_emu/emu_cudnn.cpp), where the failure cases are marked.
#include <dlfcn.h>

#include <array>

#include "backend/cudnn_settings.h"
#include "cuda_parity.h"

namespace braid {
namespace {

using detail::cudnn_conv_counts;
using detail::Epilogue;

struct Geometry {
  std::string name;
  int64_t n, c, h, w, k, kh, kw, stride, pad, dilation, groups;
};

// Kept small: the emulation computes every product naively.
const std::vector<Geometry> kGeometries = {
    {"3x3", 2, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1},
    {"stride 2", 2, 3, 9, 8, 4, 3, 3, 2, 1, 1, 1},
    {"dilation 2", 1, 3, 9, 9, 5, 3, 3, 1, 2, 2, 1},
    {"groups 2", 2, 4, 6, 6, 6, 3, 3, 1, 1, 1, 2},
    {"depthwise", 2, 6, 7, 7, 12, 3, 3, 1, 1, 1, 6},
    {"1x1", 2, 8, 5, 5, 4, 1, 1, 1, 0, 1, 1},
    {"stem 7x7/2", 1, 3, 12, 12, 8, 7, 7, 2, 3, 1, 1},     // ResNet-50's first convolution, small
    {"bottleneck 1x1/2", 2, 16, 6, 6, 8, 1, 1, 2, 0, 1, 1},  // a downsampling shortcut
    {"bottleneck 3x3", 1, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1},
};

Window2d window(const Geometry& g) {
  const auto out = [&](int64_t in, int64_t k) { return (in + 2 * g.pad - g.dilation * (k - 1) - 1) / g.stride + 1; };
  return {g.h, g.w, out(g.h, g.kh), out(g.w, g.kw), g.kh, g.kw, g.stride, g.stride, g.pad, g.pad, g.dilation, g.dilation};
}

Tensor values(const Shape& s, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return draw(n, kFloat32, seed, {-1, 1, false}).view(s);
}

struct Operands {
  Tensor x, w, b;  // float32, on the CPU
};
Operands operands(const Geometry& g, uint32_t seed) {
  return {values({g.n, g.c, g.h, g.w}, seed), values({g.k, g.c / g.groups, g.kh, g.kw}, seed + 1),
          values({g.k}, seed + 2)};
}

Tensor channels_last(const Tensor& t) { return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}); }

Tensor conv(const Geometry& g, const Tensor& x, const Tensor& w, const Tensor& b) {
  return conv2d(x, w, b, {g.stride, g.stride}, {g.pad, g.pad}, {g.dilation, g.dilation}, g.groups);
}

// Sums of up to C / G * kh * kw products of values in [-1, 1]: float32's rounding of such sums.
const Tol kFloat32Sums{1e-5, 2e-5};
// A half result against the CPU's float32 one rounded once to its dtype: one ulp (the two float32
// sums may straddle a rounding boundary), and near zero the float32 sums' own difference; with a
// bias added to the rounded product (a second rounding, Note [cuDNN convolutions]) half an ulp of
// the product more, which for cancelling sums of magnitude up to ~2 is what atol allows.
Tol half_sums(DType t) { return t == kFloat16 ? Tol{1e-3, 2e-3} : Tol{8e-3, 1.6e-2}; }

int64_t ran() { return cudnn_conv_counts().ran; }

// The emulation's hook (tools/cuda_emu/emu_cudnn.cpp); nullptr against the real cuDNN.
using FailHook = void (*)(const char*, int);
FailHook emu_fail() { return reinterpret_cast<FailHook>(dlsym(RTLD_DEFAULT, "emu_cudnn_fail")); }
// The emulation's count of passes run in NHWC (forward, backward-data, backward-filter); zeros
// against the real cuDNN.
std::array<long, 3> nhwc_runs() {
  using Count = long (*)(int);
  const auto count = reinterpret_cast<Count>(dlsym(RTLD_DEFAULT, "emu_cudnn_nhwc_runs"));
  return count ? std::array<long, 3>{count(0), count(1), count(2)} : std::array<long, 3>{};
}
#define REQUIRE_EMULATION()                                                               \
  REQUIRE_CUDA();                                                                         \
  if (!emu_fail()) GTEST_SKIP() << "marks cuDNN failures, which only the host emulation can"

TEST(CudnnConv, ForwardMatchesTheCpuInEveryDtypeAndLayout) {
  REQUIRE_CUDA();
  uint32_t seed = 1;
  for (const Geometry& g : kGeometries)
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})
      for (bool cl : {false, true}) {
        const Operands o = operands(g, seed += 3);
        const bool half = t == kFloat16 || t == kBFloat16;
        const std::string what = g.name + " " + dtype_name(t) + (cl ? " channels-last" : "");
        const int64_t before = ran();
        // half: products of rounded operands; the GPU keeps the activation in half (half out from
        // cuDNN), the CPU returns float32, rounded once here to compare.
        expect_parity(what, t == kFloat64 ? approx(t) : half ? half_sums(t) : kFloat32Sums, [&](Device d) {
          const DType operand_type = half ? kFloat32 : t;
          Tensor x = o.x.to(operand_type).to(d), w = o.w.to(operand_type).to(d), b = o.b.to(operand_type).to(d);
          if (cl) x = channels_last(x);
          autocast scope(half ? t : kBFloat16, half);
          const Tensor y = conv(g, x, w, b).contiguous();
          return half && d.is_cpu() ? y.to(t) : y;
        });
        // float64 on channels-last activations is refused (declined, then run in NCHW): still cuDNN.
        EXPECT_GT(ran(), before) << what << ": cuDNN ran";
      }
}

TEST(CudnnConv, GradientsMatchTheCpu) {
  REQUIRE_CUDA();
  uint32_t seed = 100;
  for (const Geometry& g : kGeometries)
    for (DType t : {kFloat32, kFloat64}) {
      const Operands o = operands(g, seed += 4);
      const Window2d win = window(g);
      const Tensor gy = values({g.n, g.k, win.oh, win.ow}, seed + 3);
      Tensor grads[2][3];
      const int64_t runs = ran();
      for (int side = 0; side < 2; ++side) {
        const Device d = side ? kCuda : Device::cpu();
        Tensor x = o.x.to(t).to(d), w = o.w.to(t).to(d), b = o.b.to(t).to(d);
        for (Tensor* v : {&x, &w, &b}) *v = v->detach().set_requires_grad();
        sum(conv(g, x, w, b) * gy.to(t).to(d)).backward();
        grads[side][0] = x.grad(), grads[side][1] = w.grad(), grads[side][2] = b.grad();
      }
      EXPECT_EQ(ran() - runs, 3) << g.name << " " << dtype_name(t) << ": the three passes ran on cuDNN";
      const char* names[] = {"dx", "dw", "db"};
      for (int i = 0; i < 3; ++i) {
        // The weight's gradient sums N * oh * ow products.
        const Tol tol = t == kFloat64 ? approx(t) : Tol{1e-5, 1e-4};
        expect_match(grads[1][i], grads[0][i], tol, g.name + " " + dtype_name(t) + " " + names[i]);
      }
    }
}

// Training under autocast on the GPU: half activations (Note [Autocast]), so the three passes take
// half operands into half outputs (Note [Half outputs]). Against the CPU's float32 composite of the
// rounded operands, the same output gradient, each result rounded once where the GPU's is half:
// y, x's gradient (x a half activation), w's (the half gw that the engine widens) and the bias's
// (a half sum, widened). A float32 input (a network's first layer) keeps a float32 gradient.
TEST(CudnnConv, GradientsUnderAutocastTakeHalfOutputs) {
  REQUIRE_CUDA();
  uint32_t seed = 300;
  for (const Geometry& g : kGeometries)
    for (DType t : {kFloat16, kBFloat16})
      for (bool half_x : {true, false}) {
        const Operands o = operands(g, seed += 4);
        const Window2d win = window(g);
        const Tensor gy = values({g.n, g.k, win.oh, win.ow}, seed + 3).to(t);  // what the GPU's y gets
        const std::string what = g.name + " " + dtype_name(t) + (half_x ? " half x" : " float32 x");
        Tensor got[4], want[4];
        const int64_t runs = ran();
        for (int side = 0; side < 2; ++side) {
          const Device d = side ? kCuda : Device::cpu();
          Tensor x = o.x.to(half_x ? t : kFloat32).to(d), w = o.w.to(d), b = o.b.to(d);
          for (Tensor* v : {&x, &w, &b}) *v = v->detach().set_requires_grad();
          Tensor y;
          {
            autocast scope(t);
            y = conv(g, x, w, b);
            sum(y * gy.to(d)).backward();  // the CPU's float32 y times the half gy: the same gradient
          }
          Tensor* out = side ? got : want;
          out[0] = y, out[1] = x.grad(), out[2] = w.grad(), out[3] = b.grad();
        }
        EXPECT_EQ(ran() - runs, 3) << what << ": the three passes ran on cuDNN";
        ASSERT_EQ(got[0].dtype(), t) << what << ": the activation stays half";
        const char* names[] = {"y", "dx", "dw", "db"};
        for (int i = 0; i < 4; ++i) {
          // The GPU's results that went through half: y, dw, db, and dx of a half x.
          const bool rounded = i != 1 || half_x;
          const Tensor w_i = rounded ? want[i].to(t).to(got[i].dtype()) : want[i];
          expect_match(got[i], w_i, rounded ? half_sums(t) : Tol{1e-5, 1e-4}, what + " " + names[i]);
        }
      }
}

// Training under autocast runs channels-last (Note [Channels-last training] in src/ops/conv.cpp): y
// comes out NHWC from a float32 NCHW x, BatchNorm keeps the layout, so the gradient reaches the
// convolution NHWC, and all three passes run on cuDNN in NHWC (none declined, none redone in NCHW),
// dL/dx of the float32 x included. The values are the same step's with set_channels_last(false):
// the same products, summed in another order on a GPU.
TEST(CudnnConv, TrainingUnderAutocastRunsChannelsLast) {
  REQUIRE_CUDA();
  uint32_t seed = 500;
  for (const Geometry& g : kGeometries)
    for (DType t : {kFloat16, kBFloat16}) {
      const Operands o = operands(g, seed += 4);
      const Window2d win = window(g);
      const Tensor probe = values({g.n, g.k, win.oh, win.ow}, seed + 3).to(kCuda);
      const std::string what = g.name + " " + dtype_name(t);
      Tensor got[2][3];
      for (int cl = 0; cl < 2; ++cl) {
        set_channels_last(cl == 1);
        Tensor x = o.x.to(kCuda), w = o.w.to(kCuda), gamma = ones({g.k}, kFloat32, kCuda);
        for (Tensor* v : {&x, &w, &gamma}) *v = v->detach().set_requires_grad();
        const int64_t runs = ran(), declined = cudnn_conv_counts().declined;
        const std::array<long, 3> nhwc_before = nhwc_runs();
        {
          autocast scope(t);
          const Tensor y = conv(g, x, w, Tensor());
          EXPECT_EQ(!y.is_contiguous() && y.is_channels_last(), cl == 1) << what << ": y's layout";
          sum(batch_norm_training(y, gamma, Tensor(), 1e-5)[0] * probe).backward();
          got[cl][0] = y;
        }
        EXPECT_EQ(ran() - runs, 3) << what << (cl ? " channels-last" : " NCHW") << ": three cuDNN passes";
        EXPECT_EQ(cudnn_conv_counts().declined - declined, 0) << what << ": none refused";
        if (emu_fail()) {  // the emulation also says which layout each pass ran in
          for (int p = 0; p < 3; ++p)
            EXPECT_EQ(nhwc_runs()[p] - nhwc_before[p], cl) << what << ": pass " << p << " in NHWC";
        }
        got[cl][1] = x.grad(), got[cl][2] = w.grad();
      }
      set_channels_last(true);
      const char* names[] = {"y", "dx", "dw"};
      for (int i = 0; i < 3; ++i)
        expect_match(got[1][i].contiguous(), got[0][i].contiguous(), half_sums(t), what + " " + names[i]);
    }
}

// The entries called with half outputs: y, gx and gw of the operands' half dtype, each the CPU's
// float32 composite of the rounded operands rounded once; y also channels-last, with a float32
// bias (rounded to y's dtype and added to the rounded product), a half bias and a half residual.
TEST(CudnnConv, HalfOutputEntriesMatchTheCompositeRoundedOnce) {
  REQUIRE_CUDA();
  detail::FusedKernels& fused = backend(kCuda).fused();
  uint32_t seed = 500;
  for (const Geometry& g : kGeometries)
    for (DType t : {kFloat16, kBFloat16}) {
      const Window2d win = window(g);
      const Operands o = operands(g, seed += 5);
      const Tensor x = o.x.to(t), w = o.w.to(t), gy = values({g.n, g.k, win.oh, win.ow}, seed + 3).to(t);
      const Tensor r = values({g.n, g.k, win.oh, win.ow}, seed + 4).to(t);
      Tensor xf = x.to(kFloat32).detach().set_requires_grad(), wf = w.to(kFloat32).detach().set_requires_grad();
      const Tensor yf = conv(g, xf, wf, Tensor());
      sum(yf * gy.to(kFloat32)).backward();
      const std::string base = g.name + " " + dtype_name(t);
      const Tol tol = half_sums(t);
      for (bool cl : {false, true}) {
        const std::string what = base + (cl ? " channels-last" : "");
        const Tensor xd = cl ? channels_last(x.to(kCuda)) : x.to(kCuda), wd = w.to(kCuda);
        const auto out = [&] { return cl ? detail::new_channels_last(yf.shape(), t, kCuda) : fresh(yf.shape(), t, kCuda); };
        Tensor y = out();
        ASSERT_TRUE(fused.conv2d(xd, wd, Tensor(), win, g.groups, Epilogue(), y)) << what;
        expect_match(y.contiguous(), yf.detach().to(t), tol, what + " y");
        // A float32 bias (autocast's) and a half one.
        for (DType bt : {kFloat32, t}) {
          const Tensor b = o.b.to(t).to(bt);
          Tensor yb = out();
          ASSERT_TRUE(fused.conv2d(xd, wd, b.to(kCuda), win, g.groups, Epilogue(), yb)) << what;
          const Tensor want = (yf.detach().to(t).to(kFloat32) + b.to(kFloat32).view({1, g.k, 1, 1})).to(t);
          expect_match(yb.contiguous(), want, tol, what + " y + " + dtype_name(bt) + " bias");
        }
        // A half residual blended in by the pass, then ReLU.
        Epilogue e;
        e.kind = Epilogue::Kind::Relu;
        e.residual = cl ? channels_last(r.to(kCuda)) : r.to(kCuda);
        Tensor yr = out();
        ASSERT_TRUE(fused.conv2d(xd, wd, Tensor(), win, g.groups, e, yr)) << what;
        expect_match(yr.contiguous(), relu(yf.detach() + r.to(kFloat32)).to(t), tol, what + " relu(y + residual)");
      }
      Tensor gx = fresh(x.shape(), t, kCuda), gw = fresh(w.shape(), t, kCuda);
      ASSERT_TRUE(fused.conv2d_backward_input(gy.to(kCuda), w.to(kCuda), win, g.groups, gx)) << base;
      ASSERT_TRUE(fused.conv2d_backward_weight(x.to(kCuda), gy.to(kCuda), win, g.groups, gw)) << base;
      expect_match(gx, xf.grad().to(t), tol, base + " gx");
      expect_match(gw, wf.grad().to(t), tol, base + " gw");
    }
  // Mixed half dtypes, or half operands into a half output of the other type, decline.
  const Geometry& g = kGeometries[0];
  const Window2d win = window(g);
  const Tensor x = fresh({g.n, g.c, g.h, g.w}, kFloat16, kCuda), w = fresh({g.k, g.c, g.kh, g.kw}, kBFloat16, kCuda);
  EXPECT_FALSE(fused.conv2d(x, w, Tensor(), win, 1, Epilogue(), fresh({g.n, g.k, win.oh, win.ow}, kFloat16, kCuda)));
  EXPECT_FALSE(fused.conv2d(x, w.to(kFloat16), Tensor(), win, 1, Epilogue(),
                            fresh({g.n, g.k, win.oh, win.ow}, kBFloat16, kCuda)));
}

TEST(CudnnConv, EntriesMatchTheCompositeWithEpilogues) {
  REQUIRE_CUDA();
  detail::FusedKernels& fused = backend(kCuda).fused();
  const Geometry g = kGeometries[0];
  const Window2d win = window(g);
  const Operands o = operands(g, 7);
  const Tensor r = values({g.n, g.k, win.oh, win.ow}, 9);
  const Tensor base = conv(g, o.x, o.w, o.b);  // the CPU's composite
  struct Case {
    std::string name;
    Epilogue e;
    Tensor want;
  };
  const auto epilogue = [](Epilogue::Kind kind, double a, double b, const Tensor& residual) {
    Epilogue e;
    e.kind = kind, e.a = a, e.b = b, e.residual = residual;
    return e;
  };
  std::vector<Case> cases;
  cases.push_back({"none", epilogue(Epilogue::Kind::None, 0, 0, Tensor()), base});
  cases.push_back({"relu + residual", epilogue(Epilogue::Kind::Relu, 0, 0, r), relu(base + r)});
  cases.push_back({"clip", epilogue(Epilogue::Kind::Clip, -0.5, 0.25, Tensor()), clamp(base, -0.5, 0.25)});
  cases.push_back({"hardswish", epilogue(Epilogue::Kind::HardSwish, 0, 0, Tensor()), hardswish(base)});
  cases.push_back({"hardsigmoid", epilogue(Epilogue::Kind::HardSigmoid, 0.2, 0.5, Tensor()), hardsigmoid(base, 0.2, 0.5)});
  for (bool cl : {false, true})
    for (Case& c : cases) {
      const std::string what = c.name + (cl ? " channels-last" : "");
      Tensor x = o.x.to(kCuda);
      if (cl) x = channels_last(x);
      Tensor y = cl ? detail::new_channels_last(base.shape(), kFloat32, kCuda) : fresh(base.shape(), kFloat32, kCuda);
      Epilogue e = c.e;
      if (e.residual.defined()) e.residual = cl ? channels_last(r.to(kCuda)) : r.to(kCuda);
      ASSERT_TRUE(fused.conv2d(x, o.w.to(kCuda), o.b.to(kCuda), win, g.groups, e, y)) << what;
      expect_match(y.contiguous(), c.want, kFloat32Sums, what);
    }
  // The residual as the output itself (Epilogue::residual_writable).
  Tensor y = r.to(kCuda);
  Epilogue in_place = epilogue(Epilogue::Kind::Relu, 0, 0, y);
  in_place.residual_writable = true;
  ASSERT_TRUE(fused.conv2d(o.x.to(kCuda), o.w.to(kCuda), o.b.to(kCuda), win, g.groups, in_place, y));
  expect_match(y, relu(base + r), kFloat32Sums, "relu + residual in place");
  // A scale after the activation is the op's to apply.
  Epilogue scaled = epilogue(Epilogue::Kind::Relu, 0, 0, Tensor());
  scaled.scale = 2;
  EXPECT_FALSE(fused.conv2d(o.x.to(kCuda), o.w.to(kCuda), o.b.to(kCuda), win, g.groups, scaled,
                            fresh(base.shape(), kFloat32, kCuda)));
}

// The backward entries on half operands (conv_transpose2d's forward under autocast hands
// conv2d_backward_input those): float32 results equal to the composite on the widened operands.
TEST(CudnnConv, BackwardEntriesTakeHalfOperands) {
  REQUIRE_CUDA();
  detail::FusedKernels& fused = backend(kCuda).fused();
  for (const Geometry& g : {kGeometries[1], kGeometries[3], kGeometries[4]})
    for (DType t : {kFloat16, kBFloat16}) {
      const Window2d win = window(g);
      const Operands o = operands(g, 21);
      const Tensor x = o.x.to(t), w = o.w.to(t), gy = values({g.n, g.k, win.oh, win.ow}, 23).to(t);
      // The composite's values: the gradients of the float32 convolution of the rounded operands.
      Tensor xf = x.to(kFloat32).detach().set_requires_grad(), wf = w.to(kFloat32).detach().set_requires_grad();
      sum(conv(g, xf, wf, Tensor()) * gy.to(kFloat32)).backward();
      const std::string what = g.name + " " + dtype_name(t);
      Tensor gx = fresh(x.shape(), kFloat32, kCuda), gw = fresh(w.shape(), kFloat32, kCuda);
      ASSERT_TRUE(fused.conv2d_backward_input(gy.to(kCuda), w.to(kCuda), win, g.groups, gx)) << what;
      ASSERT_TRUE(fused.conv2d_backward_weight(x.to(kCuda), gy.to(kCuda), win, g.groups, gw)) << what;
      expect_match(gx, xf.grad(), kFloat32Sums, what + " gx");
      expect_match(gw, wf.grad(), Tol{1e-5, 1e-4}, what + " gw");
    }
  // conv_transpose2d under autocast runs conv2d_backward_input on its rounded operands: into a half
  // output without a bias, into float32 with one (added, then rounded once); the GPU keeps the
  // activation half, the CPU's float32 is rounded here to compare.
  const Tensor x = values({2, 4, 5, 5}, 31), w = values({4, 3, 3, 3}, 32), b = values({3}, 33);
  for (bool with_bias : {true, false})
    expect_parity(with_bias ? "conv_transpose2d under autocast" : "conv_transpose2d under autocast, no bias",
                  half_sums(kFloat16), [&](Device d) {
                    autocast scope(kFloat16);
                    const Tensor y = conv_transpose2d(x.to(d), w.to(d), with_bias ? b.to(d) : Tensor(), {2, 2},
                                                      {1, 1}, {1, 1});
                    return d.is_cpu() ? y.to(kFloat16) : y;
                  });
}

TEST(CudnnConv, ChannelsLastIsPreferredForHalfOperands) {
  REQUIRE_CUDA();
  detail::FusedKernels& fused = backend(kCuda).fused();
  const Geometry& g = kGeometries[0];
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const Tensor x = fresh({g.n, g.c, g.h, g.w}, t, kCuda), w = fresh({g.k, g.c, g.kh, g.kw}, t, kCuda);
    for (bool training : {false, true})  // Note [Channels-last training]: the same in both
      EXPECT_EQ(fused.conv2d_prefers_channels_last(x, w, window(g), 1, training), t == kFloat16 || t == kBFloat16)
          << dtype_name(t) << (training ? " training" : " inference");
  }
}

// One geometry's plan is made once and then found in the table, by heuristics or, with the
// benchmark setting on, by timing; a geometry of its own per case, so that no other test made it.
TEST(CudnnConv, PlansAreMadeOncePerGeometryByHeuristicsOrTiming) {
  REQUIRE_CUDA();
  ASSERT_FALSE(cudnn_benchmark()) << "BRAID_CUDNN_BENCHMARK is off by default";
  for (bool timed : {false, true}) {
    const Geometry g{"plan", 1, 3, 5 + (timed ? 1 : 0), 11, 2, 2, 2, 1, 0, 1, 1};
    const Operands o = operands(g, 41);
    set_cudnn_benchmark(timed);
    const int64_t heuristic = cudnn_conv_counts().heuristic, benchmarked = cudnn_conv_counts().benchmarked,
                  reused = cudnn_conv_counts().reused;
    for (int call = 0; call < 2; ++call)
      expect_parity(timed ? "timed" : "heuristic", kFloat32Sums,
                    [&](Device d) { return conv(g, o.x.to(d), o.w.to(d), o.b.to(d)); });
    set_cudnn_benchmark(false);
    EXPECT_EQ(cudnn_conv_counts().heuristic - heuristic, timed ? 0 : 1);
    EXPECT_EQ(cudnn_conv_counts().benchmarked - benchmarked, timed ? 1 : 0);
    EXPECT_EQ(cudnn_conv_counts().reused - reused, 1) << "the second call finds the plan";
  }
}

// The workspace is a tensor of the device's pool: the peak of the memory statistics holds it.
TEST(CudnnConv, TheWorkspaceComesFromTheAllocator) {
  REQUIRE_EMULATION();
  const Geometry g{"workspace", 2, 3, 9, 10, 5, 3, 3, 1, 1, 1, 1};
  const Operands o = operands(g, 51);
  const Tensor x = o.x.to(kCuda), w = o.w.to(kCuda);
  synchronize(kCuda);
  const int64_t before = memory_allocated(kCuda);
  reset_peak_memory_stats(kCuda);
  const int64_t runs = ran();
  const Tensor y = conv(g, x, w, Tensor());
  const auto held = [](int64_t nbytes) { return (nbytes + 63) / 64 * 64; };  // storage.cpp's rounding
  const int64_t y_bytes = held(y.numel() * 4);
  EXPECT_EQ(ran() - runs, 1);
  // The emulated algorithm the heuristics choose asks for 4096 bytes + 4 per output element.
  EXPECT_GE(max_memory_allocated(kCuda) - before, y_bytes + held(4096 + y.numel() * 4));
  EXPECT_EQ(memory_allocated(kCuda) - before, y_bytes) << "the workspace is given back";
}

TEST(CudnnConv, CudnnErrorsNameTheOpShapesDtypesAndStatus) {
  REQUIRE_EMULATION();
  const Geometry g{"error", 1, 2, 4, 5, 3, 3, 3, 1, 1, 1, 1};
  const Operands o = operands(g, 61);
  emu_fail()("cudnnConvolutionForward", 5000);  // CUDNN_STATUS_EXECUTION_FAILED
  const std::string msg = error_of([&] { conv(g, o.x.to(kCuda), o.w.to(kCuda), o.b.to(kCuda)); });
  for (const std::string& part : {std::string("conv2d"), std::string("cudnnConvolutionForward"),
                                  std::string("CUDNN_STATUS_EXECUTION_FAILED"), shape_str({1, 2, 4, 5}),
                                  shape_str({3, 2, 3, 3}), std::string("float32"), std::string("groups 1")})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' in: " << msg;
  // The backward passes name theirs.
  const Window2d win = window(g);
  emu_fail()("cudnnConvolutionBackwardFilter", 4000);  // CUDNN_STATUS_INTERNAL_ERROR
  const std::string bw = error_of([&] {
    backend(kCuda).fused().conv2d_backward_weight(o.x.to(kCuda), fresh({1, 3, win.oh, win.ow}, kFloat32, kCuda), win,
                                                  1, fresh(o.w.shape(), kFloat32, kCuda));
  });
  EXPECT_NE(bw.find("conv2d_backward_weight: cuDNN's cudnnConvolutionBackwardFilter returned "
                    "CUDNN_STATUS_INTERNAL_ERROR"),
            std::string::npos)
      << bw;
}

// Where cuDNN says NOT_SUPPORTED the entry declines and the op's composite runs.
TEST(CudnnConv, RefusedCasesDeclineToTheComposite) {
  REQUIRE_EMULATION();
  const Geometry g{"refused", 2, 3, 6, 5, 4, 3, 3, 1, 1, 1, 1};
  const Window2d win = window(g);
  const Operands o = operands(g, 71);
  const int64_t declined = cudnn_conv_counts().declined;
  emu_fail()("cudnnGetConvolutionForwardAlgorithm_v7", 3000);  // CUDNN_STATUS_NOT_SUPPORTED
  EXPECT_FALSE(backend(kCuda).fused().conv2d(o.x.to(kCuda), o.w.to(kCuda), o.b.to(kCuda), win, 1, Epilogue(),
                                             fresh({g.n, g.k, win.oh, win.ow}, kFloat32, kCuda)));
  EXPECT_EQ(cudnn_conv_counts().declined - declined, 1);
  // The refusal is kept for the geometry: the op runs im2col + matmul, with the CPU's values.
  expect_parity("refused geometry", kFloat32Sums, [&](Device d) { return conv(g, o.x.to(d), o.w.to(d), o.b.to(d)); });
  EXPECT_EQ(cudnn_conv_counts().declined - declined, 2);
  // float64 has no NHWC kernels: declined, and conv2d runs it in NCHW.
  const Tensor x64 = channels_last(o.x.to(kFloat64).to(kCuda));
  EXPECT_FALSE(backend(kCuda).fused().conv2d(x64, o.w.to(kFloat64).to(kCuda), Tensor(), win, 1, Epilogue(),
                                             detail::new_channels_last({g.n, g.k, win.oh, win.ow}, kFloat64, kCuda)));
  // Uneven padding (conv_padding_same of an even kernel) is not cuDNN's: declined before any call.
  Window2d uneven = win;
  uneven.oh += 1;
  EXPECT_FALSE(backend(kCuda).fused().conv2d(o.x.to(kCuda), o.w.to(kCuda), Tensor(), uneven, 1, Epilogue(),
                                             fresh({g.n, g.k, uneven.oh, win.ow}, kFloat32, kCuda)));
}

}  // namespace
}  // namespace braid
