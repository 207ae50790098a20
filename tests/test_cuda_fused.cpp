// The CUDA backend's fused kernels for training (src/backend/cuda/fused.cu) against the CPU: each
// entry called directly (it must take the case, returning true, and match the CPU's kernel, itself
// held to its composite by tests/test_fused_values.cpp), then through the ops that call it
// (BatchNorm forward and backward, Adam and AdamW with amsgrad, softmax, layer normalisation,
// channels-last max pooling), with the entries' declines (dtypes, layouts) checked too.
#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "cuda_parity.h"

namespace braid {
namespace {

using detail::Window2d;

detail::FusedKernels& fused(Device d) { return backend(d).fused(); }

// x of shape, dtype t, drawn from seed without the special values (or with them).
Tensor values(const Shape& shape, DType t, uint32_t seed, Device d, bool specials = false, double lo = -3,
              double hi = 3) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return draw(n, t, seed, {lo, hi, specials, false}).reshape(shape).to(d);
}

// Sums of about n values in double, compared with a float32 or float64 tolerance.
Tol sums(DType t) { return t == kFloat64 ? Tol{1e-12, 1e-12} : Tol{2e-6, 2e-6}; }

struct Ncs {
  int64_t n, c, s;
};
// A single value, S = 1 (channels-last as (N * H * W, C, 1)), the split path (many values per
// channel, few channels), and a small odd case.
const Ncs kChannelShapes[] = {{1, 1, 1}, {37, 16, 1}, {2, 3, 5000}, {3, 7, 13}};

TEST(CudaFused, BatchNormPassesMatchTheCpu) {
  REQUIRE_CUDA();
  for (DType t : {kFloat32, kFloat64})
    for (const Ncs& d : kChannelShapes) {
      const std::string what = dtype_name(t) + " (" + std::to_string(d.n) + ", " + std::to_string(d.c) + ", " +
                               std::to_string(d.s) + ")";
      // Values far from 0 against their spread: the two-pass variance must not cancel.
      auto moments = [&](Device dev) {
        Tensor x = values({d.n, d.c, d.s}, t, 11, dev, false, 100, 101);
        Tensor m = detail::new_tensor({d.c}, t, dev), v = detail::new_tensor({d.c}, t, dev);
        EXPECT_TRUE(fused(dev).channel_moments(x, m, v)) << what;
        return concat({m, v});
      };
      expect_parity("channel_moments " + what, sums(t), moments);
      auto grad_sums = [&](Device dev) {
        Tensor x = values({d.n, d.c, d.s}, t, 12, dev), g = values({d.n, d.c, d.s}, t, 13, dev);
        Tensor m = values({d.c}, t, 14, dev), sg = detail::new_tensor({d.c}, t, dev);
        Tensor sgx = detail::new_tensor({d.c}, t, dev);
        EXPECT_TRUE(fused(dev).channel_grad_sums(g, x, m, sg, sgx)) << what;
        return concat({sg, sgx});
      };
      expect_parity("channel_grad_sums " + what, sums(t), grad_sums);
      for (bool with_b : {false, true}) {
        auto affine = [&](Device dev) {
          Tensor a = values({d.n, d.c, d.s}, t, 15, dev, true), b = with_b ? values({d.n, d.c, d.s}, t, 16, dev) : Tensor();
          Tensor sa = values({d.c}, t, 17, dev), shift = values({d.c}, t, 18, dev);
          Tensor bm = with_b ? values({d.c}, t, 19, dev) : Tensor(), sb = with_b ? values({d.c}, t, 20, dev) : Tensor();
          Tensor out = detail::new_tensor({d.n, d.c, d.s}, t, dev);
          EXPECT_TRUE(fused(dev).channel_affine(a, sa, shift, b, bm, sb, out)) << what;
          return out;
        };
        expect_parity("channel_affine " + what + (with_b ? " with b" : ""), Tol{}, affine);  // elementwise: bitwise
      }
    }
}

// A half x (g, a, b, out) with float32 per-channel tensors, the mixed dtypes of backend.h, against
// the CPU's float32 pass on the widened operands (the CPU declines the mixed dtypes), out rounded
// once: the statistics to float32 sums' rounding, out bitwise (the float32 passes agree bitwise).
TEST(CudaFused, HalfBatchNormPassesMatchTheCpuInFloat32) {
  REQUIRE_CUDA();
  for (DType t : {kFloat16, kBFloat16})
    for (const Ncs& d : kChannelShapes) {
      const std::string what = dtype_name(t) + " (" + std::to_string(d.n) + ", " + std::to_string(d.c) + ", " +
                               std::to_string(d.s) + ")";
      // The half operand as the device takes it: widened on the CPU.
      const auto in = [&](const Tensor& h, Device dev) { return dev.is_cpu() ? h.to(kFloat32) : h; };
      const auto stats = [&](Device dev) { return detail::new_tensor({d.c}, kFloat32, dev); };
      auto moments = [&](Device dev) {
        Tensor x = in(values({d.n, d.c, d.s}, t, 11, dev, false, 100, 101), dev), m = stats(dev), v = stats(dev);
        EXPECT_TRUE(fused(dev).channel_moments(x, m, v)) << what;
        return concat({m, v});
      };
      expect_parity("half channel_moments " + what, sums(kFloat32), moments);
      auto grad_sums = [&](Device dev) {
        Tensor x = in(values({d.n, d.c, d.s}, t, 12, dev), dev), g = in(values({d.n, d.c, d.s}, t, 13, dev), dev);
        Tensor m = values({d.c}, kFloat32, 14, dev), sg = stats(dev), sgx = stats(dev);
        EXPECT_TRUE(fused(dev).channel_grad_sums(g, x, m, sg, sgx)) << what;
        return concat({sg, sgx});
      };
      expect_parity("half channel_grad_sums " + what, sums(kFloat32), grad_sums);
      for (bool with_b : {false, true}) {
        auto affine = [&](Device dev) {
          Tensor a = in(values({d.n, d.c, d.s}, t, 15, dev, true), dev);
          Tensor b = with_b ? in(values({d.n, d.c, d.s}, t, 16, dev), dev) : Tensor();
          Tensor sa = values({d.c}, kFloat32, 17, dev), shift = values({d.c}, kFloat32, 18, dev);
          Tensor bm = with_b ? values({d.c}, kFloat32, 19, dev) : Tensor();
          Tensor sb = with_b ? values({d.c}, kFloat32, 20, dev) : Tensor();
          Tensor out = detail::new_tensor({d.n, d.c, d.s}, a.dtype(), dev);
          EXPECT_TRUE(fused(dev).channel_affine(a, sa, shift, b, bm, sb, out)) << what;
          return out.to(t);  // the CPU's float32 out rounded once
        };
        expect_parity("half channel_affine " + what + (with_b ? " with b" : ""), Tol{}, affine);
      }
    }
}

// Channels-last x reaches the passes as (N * H * W, C, 1) rows: 40 channels are two blocks of the
// row kernel, the second one partly idle.
TEST(CudaFused, BatchNormTrainingStepMatchesTheCpu) {
  REQUIRE_CUDA();
  for (const Shape& shape : {Shape{4, 6, 5, 7}, Shape{3, 40, 4, 5}})
    for (bool channels_last : {false, true}) {
      const int64_t c = shape[1];
      auto step = [&](Device dev) {
        Tensor x = values(shape, kFloat32, 21, dev);
        if (channels_last) x = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
        x.set_requires_grad(true);
        Tensor w = values({c}, kFloat32, 22, dev).set_requires_grad(true), b = values({c}, kFloat32, 23, dev);
        b.set_requires_grad(true);
        std::vector<Tensor> r = batch_norm_training(x, w, b, 1e-5);
        EXPECT_EQ(!r[0].is_contiguous() && r[0].is_channels_last(), channels_last) << "y keeps x's layout";
        (r[0] * values(shape, kFloat32, 24, dev)).sum().backward();
        return concat({r[0].reshape({-1}), r[1], r[2], x.grad().reshape({-1}), w.grad(), b.grad()});
      };
      expect_parity(std::string(channels_last ? "batch_norm channels-last " : "batch_norm ") + std::to_string(c) +
                        " channels",
                    Tol{2e-5, 2e-5}, step);
    }
}

// A half x through the op: cuda's half passes (the node keeping the half x) against the CPU's
// float32 node on a float32 copy, y and dL/dx rounded once. Statistics that differ in float32's last
// bits may move a rounding: y and dL/dx to a half ulp (and a little room where dL/dx cancels).
TEST(CudaFused, HalfBatchNormTrainingStepMatchesTheCpu) {
  REQUIRE_CUDA();
  for (DType t : {kFloat16, kBFloat16})
    for (bool channels_last : {false, true}) {
      auto step = [&](Device dev) {
        Tensor x = values({4, 6, 5, 7}, t, 21, dev);
        if (channels_last) x = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
        x.set_requires_grad(true);
        Tensor w = values({6}, kFloat32, 22, dev).set_requires_grad(true), b = values({6}, kFloat32, 23, dev);
        b.set_requires_grad(true);
        std::vector<Tensor> r = batch_norm_training(x, w, b, 1e-5);
        EXPECT_EQ(r[0].dtype(), t);
        EXPECT_EQ(!r[0].is_contiguous() && r[0].is_channels_last(), channels_last) << "y keeps x's layout";
        EXPECT_EQ(r[1].dtype(), kFloat32);
        (r[0] * values({4, 6, 5, 7}, t, 24, dev)).sum().backward();
        EXPECT_EQ(x.grad().dtype(), t);
        return concat({r[0].to(kFloat32).reshape({-1}), r[1], r[2], x.grad().to(kFloat32).reshape({-1}), w.grad(),
                       b.grad()});
      };
      expect_parity("half batch_norm " + dtype_name(t) + (channels_last ? " channels-last" : ""),
                    t == kFloat16 ? Tol{1e-3, 2e-3} : Tol{8e-3, 2e-2}, step);
    }
}

TEST(CudaFused, AdamStepMatchesTheCpuBitForBit) {
  REQUIRE_CUDA();
  for (DType t : {kFloat32, kFloat64})
    for (bool amsgrad : {false, true}) {
      const std::string what = dtype_name(t) + (amsgrad ? " amsgrad" : "");
      auto entry = [&](Device dev) {
        Tensor p = values({1000}, t, 31, dev), g = values({1000}, t, 32, dev), m = values({1000}, t, 33, dev);
        Tensor v = values({1000}, t, 34, dev, false, 0, 2), mv = amsgrad ? values({1000}, t, 35, dev, false, 0, 2) : Tensor();
        EXPECT_TRUE(fused(dev).adam_step(p, g, m, v, mv, {0.99, 0.9, 0.999, 0.01, 0.3, 1e-8})) << what;
        return amsgrad ? concat({p, m, v, mv}) : concat({p, m, v});
      };
      expect_parity("adam_step " + what, Tol{}, entry);  // elementwise, the same operations: bitwise
      for (bool decoupled : {false, true}) {
        auto steps = [&](Device dev) {
          Tensor p = values({7, 9}, t, 36, dev).set_requires_grad(true);
          std::unique_ptr<optim::Optimizer> opt;
          if (decoupled)
            opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                                 optim::AdamWOptions{0.01, {0.9, 0.999}, 1e-8, 0.1, amsgrad, false});
          else
            opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                                optim::AdamOptions{0.01, {0.9, 0.999}, 1e-8, 0.1, amsgrad, false});
          for (uint32_t k = 0; k < 3; ++k) {
            opt->zero_grad();
            (p * p * values({7, 9}, t, 37 + k, dev)).sum().backward();
            opt->step();
          }
          return p.detach();
        };
        expect_parity(std::string(decoupled ? "AdamW " : "Adam ") + what, Tol{}, steps);
      }
    }
}

TEST(CudaFused, MultiTensorAdamMatchesTheCpuBitForBit) {
  REQUIRE_CUDA();
  // More parameters than one launch takes (Note [Multi-tensor Adam]), empty and one-element ones
  // among them, so that the walk over the list crosses empty tensors and launch boundaries.
  std::vector<int64_t> sizes;
  for (int k = 0; k < 53; ++k) sizes.push_back(k % 7 == 0 ? 0 : k % 5 == 0 ? 1 : 37 * k % 300 + 1);
  for (bool amsgrad : {false, true}) {
    auto entry = [&](Device dev) {
      std::vector<detail::AdamTensors> list;
      std::vector<Tensor> out;
      uint32_t seed = 80;
      for (int64_t n : sizes) {
        detail::AdamTensors t{values({n}, kFloat32, seed++, dev), values({n}, kFloat32, seed++, dev),
                              values({n}, kFloat32, seed++, dev), values({n}, kFloat32, seed++, dev, false, 0, 2),
                              amsgrad ? values({n}, kFloat32, seed++, dev, false, 0, 2) : Tensor()};
        list.push_back(t);
        for (const Tensor& u : {t.p, t.m, t.v, t.max_v})
          if (u.defined()) out.push_back(u);
      }
      EXPECT_TRUE(fused(dev).adam_steps(list, {1, 0.9, 0.999, 0.02, 0.7, 1e-8}));
      return concat(out);
    };
    expect_parity(std::string("adam_steps") + (amsgrad ? " amsgrad" : ""), Tol{}, entry);
    // Through the optimizer, with a parameter that has no gradient on the second step, so that the
    // steps' numbers differ and the run splits.
    auto steps = [&](Device dev) {
      std::vector<Tensor> params;
      uint32_t seed = 300;
      for (int64_t n : sizes) params.push_back(values({n}, kFloat64, seed++, dev).set_requires_grad(true));
      optim::Adam opt(params, optim::AdamOptions{0.01, {0.9, 0.999}, 1e-8, 0.01, amsgrad, false});
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        Tensor loss = zeros({}, kFloat64, dev);
        for (size_t k = 0; k < params.size(); ++k)
          if (!(step == 1 && k == 3)) loss = loss + (params[k] * params[k]).sum() * static_cast<double>(k + 1);
        loss.backward();
        opt.step();
      }
      return concat(params).detach();
    };
    expect_parity(std::string("Adam over 53 parameters") + (amsgrad ? " amsgrad" : ""), Tol{}, steps);
  }
}

// Note [Multi-tensor SGD] (src/backend/cuda/sgd.cu): the entry against SGD's composite written as
// CPU ops in its order, then the optimizer over 53 parameters (empty and one-element ones among
// them, more than one launch takes), whose first step makes the buffers one by one and whose later
// steps go through the entry; each of torch.optim.SGD's options; bitwise, as Adam's.
TEST(CudaFused, MultiTensorSgdMatchesTheCpuBitForBit) {
  REQUIRE_CUDA();
  struct Case {
    const char* name;
    double momentum, dampening, weight_decay;
    bool nesterov, maximize;
  };
  const Case cases[] = {{"momentum, weight decay", 0.9, 0, 1e-2, false, false},
                        {"nesterov", 0.9, 0, 0, true, false},
                        {"dampening, maximize", 0.8, 0.1, 1e-2, false, true},
                        {"no momentum", 0, 0, 1e-2, false, false}};
  for (const Case& c : cases)
    for (DType t : {kFloat32, kFloat64}) {
      const std::string what = std::string(c.name) + " " + dtype_name(t);
      const detail::SgdStep s{0.05, c.momentum, c.dampening, c.weight_decay, c.nesterov, c.maximize};
      // The entry: p, g, buf of 40 and 7 values.
      auto entry = [&](Device dev) {
        std::vector<detail::SgdTensors> list;
        std::vector<Tensor> out;
        uint32_t seed = 400;
        for (int64_t n : {40, 7}) {
          detail::SgdTensors q{values({n}, t, seed++, dev), values({n}, t, seed++, dev),
                               c.momentum != 0 ? values({n}, t, seed++, dev) : Tensor()};
          list.push_back(q);
          out.push_back(q.p);
          if (q.buf.defined()) out.push_back(q.buf);
        }
        if (dev.is_cpu()) {  // the composite's operations, in its order (SGD::update)
          NoGradGuard no_grad;
          for (detail::SgdTensors& q : list) {
            Tensor d = c.maximize ? (c.weight_decay != 0 ? q.p * c.weight_decay - q.g : -q.g)
                                  : (c.weight_decay != 0 ? q.p * c.weight_decay + q.g : q.g);
            if (c.momentum != 0) {
              q.buf.mul_(c.momentum);
              q.buf.add_(c.dampening != 0 ? d * (1 - c.dampening) : d);
              d = c.nesterov ? q.buf * c.momentum + d : q.buf;
            }
            q.p.add_(d * -s.lr);
          }
        } else {
          EXPECT_TRUE(fused(dev).sgd_steps(list, s)) << what;
        }
        return concat(out);
      };
      expect_parity("sgd_steps " + what, Tol{}, entry);
      std::vector<int64_t> sizes;
      for (int k = 0; k < 53; ++k) sizes.push_back(k % 7 == 0 ? 0 : k % 5 == 0 ? 1 : 37 * k % 300 + 1);
      auto steps = [&](Device dev) {
        std::vector<Tensor> params;
        uint32_t seed = 500;
        for (int64_t n : sizes) params.push_back(values({n}, t, seed++, dev).set_requires_grad(true));
        optim::SGD opt(params, optim::SGDOptions{0.05, c.momentum, c.dampening, c.weight_decay, c.nesterov, c.maximize});
        for (int step = 0; step < 3; ++step) {
          opt.zero_grad();
          Tensor loss = zeros({}, t, dev);
          for (size_t k = 0; k < params.size(); ++k)
            if (!(step == 1 && k == 3)) loss = loss + (params[k] * params[k]).sum() * static_cast<double>(k + 1);
          loss.backward();
          opt.step();
        }
        return concat(params).detach();
      };
      expect_parity("SGD over 53 parameters, " + what, Tol{}, steps);
    }
}

TEST(CudaFused, SoftmaxRowsMatchTheCpu) {
  REQUIRE_CUDA();
  // One value, short rows, rows longer than a block, specials (NaN rows, infinities, -inf rows).
  for (const Shape& shape : std::vector<Shape>{{1}, {5, 1}, {3, 7}, {2, 3, 1000}, {4, 300}})
    for (bool specials : {false, true}) {
      auto run = [&](Device dev) {
        Tensor x = values(shape, kFloat32, 41, dev, specials, -20, 20);
        Tensor out = detail::new_tensor(shape, kFloat32, dev);
        EXPECT_TRUE(fused(dev).softmax_rows(x, out));
        return out;
      };
      expect_parity("softmax_rows " + shape_str(shape) + (specials ? " with specials" : ""), Tol{3e-6, 1e-7}, run);
    }
  expect_parity("softmax op", Tol{3e-6, 1e-7}, [](Device dev) { return softmax(values({6, 50}, kFloat32, 42, dev)); });
  for (const Shape& shape : std::vector<Shape>{{1}, {5, 1}, {3, 7}, {2, 3, 1000}})
    for (bool specials : {false, true}) {
      auto run = [&](Device dev) {
        Tensor x = values(shape, kFloat32, 44, dev, specials, -20, 20), out = detail::new_tensor(shape, kFloat32, dev);
        EXPECT_TRUE(fused(dev).log_softmax_rows(x, out));
        Tensor g = values(shape, kFloat32, 45, dev), y = values(shape, kFloat32, 46, dev, false, -5, 0);
        Tensor gx = detail::new_tensor(shape, kFloat32, dev);
        EXPECT_TRUE(fused(dev).log_softmax_backward_rows(g, y, gx));
        return concat({out.reshape({-1}), gx.reshape({-1})});
      };
      expect_parity("log_softmax rows " + shape_str(shape) + (specials ? " with specials" : ""), Tol{3e-6, 3e-6}, run);
    }
  // A language model's loss: cross-entropy over a vocabulary, forward and backward.
  expect_parity("cross_entropy", Tol{3e-6, 1e-7}, [](Device dev) {
    Tensor logits = values({6, 1000}, kFloat32, 47, dev).set_requires_grad(true);
    Tensor target = tensor(std::vector<double>{3, 999, 0, 500, 7, 42}, {6}, dev).to(kInt64);
    Tensor loss = nn::cross_entropy(logits, target);
    loss.backward();
    return concat({loss.reshape({1}), logits.grad().reshape({-1})});
  });
  // float64 is the composite's (the entry declines it)
  Tensor x64 = values({2, 3}, kFloat64, 43, kCuda);
  EXPECT_FALSE(fused(kCuda).softmax_rows(x64, detail::new_tensor({2, 3}, kFloat64, kCuda)));
}

TEST(CudaFused, LayerNormRowsMatchTheCpu) {
  REQUIRE_CUDA();
  for (int64_t n : {1, 7, 768, 1500})
    for (int affine = 0; affine < 4; ++affine) {
      const bool with_w = affine & 1, with_b = affine & 2;
      auto run = [&](Device dev) {
        Tensor x = values({5, n}, kFloat32, 51, dev, false, 10, 12);
        Tensor w = with_w ? values({n}, kFloat32, 52, dev) : Tensor(), b = with_b ? values({n}, kFloat32, 53, dev) : Tensor();
        Tensor out = detail::new_tensor({5, n}, kFloat32, dev);
        Tensor mean = detail::new_tensor({5}, kFloat32, dev), inv = detail::new_tensor({5}, kFloat32, dev);
        EXPECT_TRUE(fused(dev).layer_norm_rows(x, n, w, b, 1e-5, out, mean, inv));
        return concat({out.reshape({-1}), mean, inv});
      };
      expect_parity("layer_norm_rows n " + std::to_string(n) + " affine " + std::to_string(affine), Tol{1e-5, 1e-5},
                    run);
    }
  expect_parity("layer_norm op", Tol{1e-5, 1e-5}, [](Device dev) {
    NoGradGuard no_grad;
    return layer_norm(values({3, 4, 64}, kFloat32, 54, dev), 1, values({64}, kFloat32, 55, dev),
                      values({64}, kFloat32, 56, dev));
  });
}

TEST(CudaFused, ChannelsLastMaxPoolingMatchesTheCpu) {
  REQUIRE_CUDA();
  const std::vector<std::vector<int64_t>> geometries = {
      // kernel, stride, padding, dilation
      {3, 2, 1, 1}, {2, 2, 0, 1}, {3, 1, 1, 2}, {1, 1, 0, 1}};
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})  // the CPU pools half planes contiguous: equal maxima
    for (const auto& g : geometries) {
      auto run = [&](Device dev) {
        NoGradGuard no_grad;
        Tensor x = values({2, 9, 10, 3}, t, 61, dev, true).permute({0, 3, 1, 2});  // channels-last (2, 3, 9, 10)
        EXPECT_TRUE(x.is_channels_last());
        Tensor y = max_pool2d(x, {g[0], g[0]}, {g[1], g[1]}, {g[2], g[2]}, {g[3], g[3]});
        return y.contiguous();
      };
      expect_parity("max_pool2d channels-last " + dtype_name(t) + " k" + std::to_string(g[0]) + " s" +
                        std::to_string(g[1]) + " p" + std::to_string(g[2]) + " d" + std::to_string(g[3]),
                    Tol{}, run);
    }
}

// Training (Note [Channels-last training]): the channels-last pass writes the positions too, and the
// gradient scatters through them into channels-last memory; the CPU declines the positions and pools
// a contiguous copy. Distinct values, so no ties: one gradient per window, in either order.
TEST(CudaFused, ChannelsLastMaxPoolingTrainsAsTheCpu) {
  REQUIRE_CUDA();
  const std::vector<std::vector<int64_t>> geometries = {{3, 2, 1, 1}, {2, 2, 0, 1}, {3, 1, 1, 2}};
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})
    for (const auto& g : geometries) {
      auto run = [&](Device dev) {
        Tensor x = values({2, 9, 10, 3}, t, 62, dev, true).permute({0, 3, 1, 2});
        x.set_requires_grad(true);
        Tensor y = max_pool2d(x, {g[0], g[0]}, {g[1], g[1]}, {g[2], g[2]}, {g[3], g[3]});
        EXPECT_TRUE(!y.is_contiguous() && y.is_channels_last()) << "the output follows x's layout";
        (y * values(y.shape(), t, 63, dev)).sum().backward();
        return concat({y.contiguous().reshape({-1}), x.grad().contiguous().reshape({-1})});
      };
      expect_parity("max_pool2d channels-last training " + dtype_name(t) + " k" + std::to_string(g[0]) + " s" +
                        std::to_string(g[1]) + " p" + std::to_string(g[2]) + " d" + std::to_string(g[3]),
                    Tol{}, run);
    }
}

TEST(CudaFused, EntriesDeclineWhatTheyDoNotTake) {
  REQUIRE_CUDA();
  Tensor x = values({2, 3, 4}, kFloat32, 71, kCuda);
  Tensor m = detail::new_tensor({3}, kFloat32, kCuda), v = detail::new_tensor({3}, kFloat32, kCuda);
  EXPECT_FALSE(fused(kCuda).channel_moments(x.permute({0, 2, 1}), m, v)) << "not contiguous";
  EXPECT_FALSE(fused(kCuda).channel_moments(x.to(kBFloat16), m.to(kBFloat16), v.to(kBFloat16))) << "half statistics";
  EXPECT_FALSE(fused(kCuda).channel_moments(x.to(kFloat16), m.to(kFloat64), v.to(kFloat64))) << "float64 statistics";
  EXPECT_TRUE(fused(kCuda).channel_moments(x.to(kBFloat16), m, v)) << "half x, float32 statistics";
  EXPECT_FALSE(fused(Device::cpu()).channel_moments(x.cpu().to(kBFloat16), m.cpu(), v.cpu())) << "the CPU's: float32";
  EXPECT_FALSE(fused(kCuda).channel_moments(values({2, 3, 0}, kFloat32, 72, kCuda), m, v)) << "empty: NaN moments";
  Tensor p = values({8}, kFloat32, 73, kCuda);
  EXPECT_FALSE(fused(kCuda).adam_step(p, values({8}, kFloat64, 74, kCuda), p.clone(), p.clone(), Tensor(),
                                      {1, 0.9, 0.999, 0.1, 1, 1e-8}))
      << "mixed dtypes";
  // Max pooling takes channels-last operands only (the op hands it no other), and the dtypes it has.
  const Window2d win{4, 4, 2, 2, 2, 2, 2, 2, 0, 0, 1, 1};
  Tensor xl = values({1, 4, 4, 2}, kFloat32, 75, kCuda).permute({0, 3, 1, 2});
  EXPECT_TRUE(fused(kCuda).max_pool2d_channels_last(xl, win, detail::new_channels_last({1, 2, 2, 2}, kFloat32, kCuda), Tensor()));
  EXPECT_FALSE(fused(kCuda).max_pool2d_channels_last(xl.contiguous(), win,
                                                     detail::new_channels_last({1, 2, 2, 2}, kFloat32, kCuda), Tensor()));
  const Tensor xh = values({1, 4, 4, 2}, kFloat16, 75, kCuda).permute({0, 3, 1, 2});
  EXPECT_TRUE(fused(kCuda).max_pool2d_channels_last(xh, win, detail::new_channels_last({1, 2, 2, 2}, kFloat16, kCuda), Tensor()));
  EXPECT_FALSE(fused(kCuda).max_pool2d_channels_last(xl.to(kInt32), win,
                                                     detail::new_channels_last({1, 2, 2, 2}, kInt32, kCuda), Tensor()));
}

}  // namespace
}  // namespace braid
