// The CUDA backend against the CPU backend (the reference), as ggml's test-backend-ops runs every
// op on every backend: each primitive, on each dtype it takes, over contiguous, permuted, sliced,
// broadcast (stride-0), 0-d, empty and large operands, run on cuda:0 and on the CPU and compared
// with a per-dtype tolerance (bitwise where both sides round the same IEEE operations). Also the
// Philox stream bit for bit, the allocator's statistics and out-of-memory error, and, on a machine
// without a GPU (where every other test skips with the reason), that the absence is reported.
// The half types' arithmetic (unary, binary, where, reduce) has its own suite, test_cuda_half.cpp.
#include "cuda_parity.h"

namespace braid {
namespace {


// ---- data movement ----

TEST(CudaParity, CopyBetweenAllDtypes) {
  REQUIRE_CUDA();
  // Rounding ties, float16/bfloat16 overflow and subnormals, saturation, NaN and infinities.
  // clang-format off
  const std::vector<double> edge = {0, -0.0, 1, -1, 0.5, 2.5, -2.5, 65504, 65520, 7e4, 1e-8, 0x1p-24, 0x1p-25,
                                    1 + 0x1p-11, 1 + 0x1p-8, 3.4e38, 1e39, 2147483647, 2147483648.0, -2147483649.0,
                                    9.3e18, -9.3e18, 16777217, 1e-45, kNaN, kInf, -kInf, 123456.789};
  // clang-format on
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> big = {(int64_t{1} << 62) + 1, -(int64_t{1} << 53) - 1, lo, hi, 16777217, 33554435, -7};
  for (DType from : kAllTypes) {
    const Tensor base = is_int(from) ? tensor(big, {7}, Device::cpu()).to(from)
                                     : tensor(edge, {static_cast<int64_t>(edge.size())}, Device::cpu()).to(from);
    for (DType to : kAllTypes) {
      const std::string what = "copy " + dtype_name(from) + " -> " + dtype_name(to);
      expect_parity(what, {}, [&](Device d) {
        Tensor out = fresh(base.shape(), to, d);
        backend(d).copy(base.to(d), out);
        return out;
      });
      for (const Layout& l : layouts()) {  // a strided source into a transposed destination
        const Operand x = operand(l, from, 11);
        expect_parity(what + " " + l.name, {}, [&](Device d) {
          std::vector<int64_t> order(l.shape.size());
          std::iota(order.rbegin(), order.rend(), 0);
          Tensor out = fresh(Shape(l.shape.rbegin(), l.shape.rend()), to, d).permute(order);
          backend(d).copy(x.on(d), out);
          return out;
        });
      }
    }
  }
}

TEST(CudaParity, FillAndIota) {
  REQUIRE_CUDA();
  for (DType t : kAllTypes) {
    for (double v : {0.0, -0.0, 1.5, -2.5, 1e10, 65520.0, kNaN, kInf}) {
      for (const Layout& l : layouts()) {
        if (l.name == "broadcast") continue;  // a fill target is a real view
        expect_parity("fill " + name(t, l) + " with " + std::to_string(v), {}, [&](Device d) {
          Tensor out = operand(l, t, 3).on(d);
          backend(d).fill(out, v);
          return out;
        });
      }
    }
    for (int64_t n : {0, 1, 1000, 100003})
      for (auto [start, step] : {std::pair{0.0, 1.0}, {-3.7, 0.1}, {1e6, 0.3}, {5.0, -0.25}})
        expect_parity("iota " + dtype_name(t) + " n=" + std::to_string(n) + " start " + std::to_string(start), {},
                      [&](Device d) {
                        Tensor out = fresh({n}, t, d);
                        backend(d).iota(out, start, step);
                        return out;
                      });
  }
}

// ---- elementwise ----

TEST(CudaParity, Unary) {
  REQUIRE_CUDA();
  for (DType t : kComputeTypes) unary_parity(t, approx(t));
}

TEST(CudaParity, BinaryAndWhere) {
  REQUIRE_CUDA();
  for (DType t : kComputeTypes) {
    binary_parity(t);
    where_parity(t, 0);
  }
}

TEST(CudaParity, IntegerErrorsAreTheCpusAndInPlaceUpdatesWork) {
  REQUIRE_CUDA();
  Tensor a = tensor(std::vector<int64_t>{5, 6, 7}, {3}, kCuda), z = tensor(std::vector<int64_t>{1, 0, 2}, {3}, kCuda);
  Tensor out = fresh({3}, kInt64, kCuda);
  EXPECT_NE(error_of<ValueError>([&] { backend(kCuda).binary(BinaryOp::Div, a, z, out); }).find("division by zero"),
            std::string::npos);
  Tensor neg = tensor(std::vector<int64_t>{1, -1, 2}, {3}, kCuda);
  EXPECT_NE(
      error_of<ValueError>([&] { backend(kCuda).binary(BinaryOp::Pow, a, neg, out); }).find("negative integer powers"),
      std::string::npos);
  // The device is usable after a reported error, and x.add_(x) reads and writes one buffer.
  Tensor x = tensor(std::vector<float>{1, 2, 3}, {3}, kCuda);
  backend(kCuda).binary(BinaryOp::Add, x, x, x);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_NE(error_of<TypeError>([&] { backend(kCuda).unary(UnaryOp::Exp, a, out, 0, 0); }).find("exp: dtype int64"),
            std::string::npos);
  Tensor host = tensor(std::vector<float>{1, 2, 3}, {3}, Device::cpu());
  EXPECT_NE(error_of<TypeError>([&] {
              backend(kCuda).binary(BinaryOp::Add, x, host, x);
            }).find("binary: operands on different devices (cpu and cuda:0)"),
            std::string::npos);
}

// ---- reductions ----

TEST(CudaParity, Reductions) {
  REQUIRE_CUDA();
  // Few outputs over many inputs (split reductions), many outputs over few, strided columns.
  const std::vector<ReductionCase> cases =
      reduction_cases({Layout{"rows", {3, 70001}, {70001, 1}, 0}, Layout{"columns", {70001, 3}, {3, 1}, 0},
                       Layout{"column-major", {70001, 3}, {1, 70001}, 0}});
  for (DType t : kComputeTypes) reduction_parity(t, cases, t == kFloat64 ? Tol{1e-11, 1e-11} : Tol{2e-6, 1e-6});
  long_arg_reduction_parity(kFloat32);
}

// ---- matmul ----

TEST(CudaParity, Matmul) {
  REQUIRE_CUDA();
  struct Case {
    std::string name;
    Layout a, b;
  };
  const int64_t m = 37, k = 53, n = 29;
  const std::vector<Case> cases = {
      {"plain", {"", {m, k}, {k, 1}}, {"", {k, n}, {n, 1}}},
      {"a transposed", {"", {m, k}, {1, m}}, {"", {k, n}, {n, 1}}},
      {"b transposed", {"", {m, k}, {k, 1}}, {"", {k, n}, {1, k}}},
      {"both sliced (packed)", {"", {m, k}, {2 * k, 2}, 3}, {"", {k, n}, {3 * n, 3}, 1}},
      {"row vector", {"", {1, k}, {k, 1}}, {"", {k, n}, {n, 1}}},
      {"column result", {"", {m, k}, {k, 1}}, {"", {k, 1}, {1, 1}}},
      {"batched", {"", {4, m, k}, {m * k, k, 1}}, {"", {4, k, n}, {k * n, n, 1}}},
      {"shared weight (one gemm)", {"", {4, m, k}, {m * k, k, 1}}, {"", {4, k, n}, {0, n, 1}}},
      {"shared transposed weight", {"", {4, m, k}, {m * k, k, 1}}, {"", {4, k, n}, {0, 1, k}}},
      {"broadcast input", {"", {4, m, k}, {0, k, 1}}, {"", {4, k, n}, {k * n, n, 1}}},
      {"two batch axes, one broadcast",
       {"", {2, 3, m, k}, {0, m * k, k, 1}},
       {"", {2, 3, k, n}, {3 * k * n, k * n, n, 1}}},
      {"batch-transposed", {"", {4, m, k}, {k, 4 * k, 1}}, {"", {4, k, n}, {k * n, n, 1}}},
      {"empty K", {"", {m, 0}, {0, 1}}, {"", {0, n}, {n, 1}}},
      {"empty M", {"", {0, k}, {k, 1}}, {"", {k, n}, {n, 1}}}};
  struct Types {
    DType ab, out;
  };
  for (Types ty : {Types{kFloat32, kFloat32}, Types{kFloat64, kFloat64}, Types{kFloat16, kFloat32},
                   Types{kBFloat16, kFloat32}, Types{kFloat16, kFloat16}, Types{kBFloat16, kBFloat16},
                   Types{kInt32, kInt32}, Types{kInt64, kInt64}, Types{kBool, kBool}}) {
    for (const Case& c : cases) {
      const ValueRange r = is_int(ty.ab) ? ValueRange{-100000, 100000, true} : ValueRange{-1, 1, false};
      const Operand a = operand(c.a, ty.ab, 51, r), b = operand(c.b, ty.ab, 52, r);
      Shape out_shape = c.a.shape;
      out_shape.back() = c.b.shape.back();
      // Sums of K products in another order: K ulp of the result's scale (|a|, |b| <= 1); a half out
      // rounds float32 results that close to equal halves or halves one ulp apart.
      const Tol tol = is_int(ty.ab)              ? Tol{}
                      : ty.out == kFloat64       ? Tol{1e-13, 1e-13}
                      : ty.out == kFloat16       ? Tol{1e-3, 1e-4}
                      : ty.out == kBFloat16      ? Tol{8e-3, 1e-4}
                                                 : Tol{1e-5, 1e-5};
      expect_parity("matmul " + c.name + " " + dtype_name(ty.ab) + " -> " + dtype_name(ty.out), tol, [&](Device d) {
        Tensor out = fresh(out_shape, ty.out, d);
        backend(d).matmul(a.on(d), b.on(d), out);
        return out;
      });
    }
  }
}

// ---- gather, scatter_add ----

TEST(CudaParity, GatherAndScatterAdd) {
  REQUIRE_CUDA();
  const Shape xs = {3, 4, 5};
  for (DType t : kAllTypes) {
    for (int64_t axis : {0, 1, 2}) {
      Shape is = xs;
      is[axis] = 6;  // more positions than the axis has: repeats
      std::vector<double> positions;
      std::mt19937 gen(61 + static_cast<uint32_t>(axis));
      for (int64_t i = 0; i < shape_numel(is); ++i) positions.push_back(static_cast<double>(gen() % xs[axis]));
      const Tensor index = tensor(positions, {shape_numel(is)}, Device::cpu()).to(kInt64).reshape(is);
      const Operand x = operand({"", xs, {1, 3, 12}}, t, 62);  // x read transposed
      expect_parity("gather " + dtype_name(t) + " axis " + std::to_string(axis), {}, [&](Device d) {
        Tensor out = fresh(is, t, d);
        backend(d).gather(x.on(d), axis, index.to(d), out);
        return out;
      });
      const Operand src = operand({"", is, contiguous_strides(is)}, t, 63, {-3, 3, false});
      const Operand base = operand({"", xs, contiguous_strides(xs)}, t, 64, {-3, 3, false});
      // Atomic float additions land in any order.
      expect_parity("scatter_add " + dtype_name(t) + " axis " + std::to_string(axis),
                    is_floating(t) ? approx(t) : Tol{}, [&](Device d) {
                      Tensor out = base.on(d).clone();
                      backend(d).scatter_add(out, axis, index.to(d), src.on(d));
                      return out;
                    });
    }
  }
}

// ---- random ----

TEST(CudaParity, PhiloxStreamMatchesTheCpuBitForBit) {
  REQUIRE_CUDA();
  const uint64_t seed = 0x123456789abcdefull;  // both key words non-zero
  for (DType t : kAllTypes) {
    for (uint64_t counter : {uint64_t{0}, uint64_t{1} << 33}) {
      for (RandomKind kind : {RandomKind::Uniform, RandomKind::Normal, RandomKind::Bernoulli}) {
        const double a = kind == RandomKind::Bernoulli ? 0.3 : is_int(t) ? -50 : -2, b = is_int(t) ? 70 : 3;
        // Uniform, bernoulli and integer draws are exact arithmetic on the same bits; normal draws
        // go through log and cos, which CUDA and glibc round differently in the last ulp.
        // (float16 and bfloat16 then round the float to a neighbour now and then: half an ulp of theirs).
        Tol tol;
        if (kind == RandomKind::Normal)
          tol = t == kFloat64    ? Tol{1e-14, 1e-13}
                : t == kFloat16  ? Tol{1e-3, 1e-3}
                : t == kBFloat16 ? Tol{8e-3, 8e-3}
                                 : Tol{2e-6, 1e-5};
        expect_parity("random kind " + std::to_string(static_cast<int>(kind)) + " " + dtype_name(t), tol,
                      [&](Device d) {
                        Tensor out = fresh({100003}, t, d);
                        backend(d).random(kind, out, seed, counter, a, b);
                        return out;
                      });
      }
    }
  }
  // Through the public API: the same generator state draws the same tensor on both devices.
  Generator g1(42), g2(42);
  EXPECT_EQ(rand({1000}, kFloat32, &g1, 0, 1, kCuda).to_vector<float>(),
            rand({1000}, kFloat32, &g2, 0, 1, Device::cpu()).to_vector<float>());
}

// ---- convolution and pooling ----

std::vector<Window2d> windows() {
  // h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw (oh = (h + 2 ph - dh (kh - 1) - 1) / sh + 1).
  return {{7, 9, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1},
          {7, 9, 3, 4, 3, 3, 2, 2, 0, 0, 1, 1},
          {8, 6, 4, 4, 2, 3, 2, 1, 1, 0, 2, 1},
          {5, 5, 5, 5, 1, 1, 1, 1, 0, 0, 1, 1},
          {6, 7, 3, 3, 4, 4, 2, 3, 1, 2, 1, 1}};
}

std::string window_name(const Window2d& w) {
  return "window k" + std::to_string(w.kh) + "x" + std::to_string(w.kw) + " s" + std::to_string(w.sh) + "," +
         std::to_string(w.sw) + " p" + std::to_string(w.ph) + "," + std::to_string(w.pw) + " d" + std::to_string(w.dh);
}

Layout dense(const Shape& s) { return {"", s, contiguous_strides(s), 0}; }

TEST(CudaParity, ConvolutionPrimitives) {
  REQUIRE_CUDA();
  const int64_t batch = 2, c = 3, mult = 2;
  for (const Window2d& w : windows()) {
    const Shape x_shape = {batch, c, w.h, w.w}, cols_shape = {c * w.kh * w.kw, batch * w.oh * w.ow};
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32}) {
      const Operand x = operand(dense(x_shape), t, 71, {-3, 3, false});
      expect_parity("im2col " + dtype_name(t) + " " + window_name(w), {}, [&](Device d) {
        Tensor cols = fresh(cols_shape, t, d);
        backend(d).im2col(x.on(d), w, cols);
        return cols;
      });
    }
    for (DType t : {kFloat32, kFloat64}) {
      const Operand cols = operand(dense(cols_shape), t, 72, {-3, 3, false});
      const Operand x = operand(dense(x_shape), t, 73, {-3, 3, false});
      expect_parity("col2im " + dtype_name(t) + " " + window_name(w), {},
                    [&](Device d) {  // the taps add in the CPU's order: bitwise
                      Tensor out = x.on(d).clone();
                      backend(d).col2im(cols.on(d), w, out);
                      return out;
                    });
      const Operand wt = operand(dense({c * mult, 1, w.kh, w.kw}), t, 74, {-1, 1, false});
      const Operand bias = operand(dense({c * mult}), t, 75, {-1, 1, false});
      for (bool with_bias : {true, false})
        expect_parity("depthwise " + dtype_name(t) + " " + window_name(w), {}, [&](Device d) {
          Tensor y = fresh({batch, c * mult, w.oh, w.ow}, t, d);
          backend(d).depthwise_conv2d(x.on(d), wt.on(d), with_bias ? bias.on(d) : Tensor(), w, y);
          return y;
        });
    }
  }
}

TEST(CudaParity, Pooling) {
  REQUIRE_CUDA();
  const int64_t batch = 2, c = 3;
  for (const Window2d& w : windows()) {
    if (w.ph * 2 > w.kh || w.pw * 2 > w.kw) continue;  // padding at most half the window, as the ops allow
    const Shape x_shape = {batch, c, w.h, w.w}, out_shape = {batch, c, w.oh, w.ow};
    // float16/bfloat16: the CPU widens to float32 and rounds once, cuda computes each in float32 and
    // rounds once (Note [Half arithmetic]): equal.
    for (DType t : {kFloat32, kFloat64, kInt32, kFloat16, kBFloat16}) {
      const Operand x = operand(dense(x_shape), t, 81, {-2, 2, true});  // ties and NaN
      for (bool want_indices : {false, true})
        expect_parity(
            std::string(want_indices ? "max_pool2d indices " : "max_pool2d ") + dtype_name(t) + " " + window_name(w),
            {}, [&](Device d) {
              Tensor out = fresh(out_shape, t, d), indices = fresh(out_shape, kInt64, d);
              backend(d).max_pool2d(x.on(d), w, out, indices);
              return want_indices ? indices : out;
            });
      for (bool include_pad : {true, false}) {
        if (w.dh != 1 || w.dw != 1) continue;  // average pooling has no dilation
        expect_parity("avg_pool2d " + dtype_name(t) + " " + window_name(w), {}, [&](Device d) {
          Tensor out = fresh(out_shape, t, d);
          backend(d).avg_pool2d(x.on(d), w, include_pad, out);
          return out;
        });
        const Operand g = operand(dense(out_shape), t, 82, {-2, 2, false});
        const Operand gx = operand(dense(x_shape), t, 83, {-2, 2, false});
        expect_parity("avg_pool2d_backward " + dtype_name(t) + " " + window_name(w), {}, [&](Device d) {
          Tensor out = gx.on(d).clone();
          backend(d).avg_pool2d_backward(g.on(d), w, include_pad, out);
          return out;
        });
      }
    }
  }
}

// ---- memory, transfers, errors ----

TEST(CudaBackend, TransfersKeepValuesAndLayouts) {
  REQUIRE_CUDA();
  for (DType t : kAllTypes) {
    const Operand x = operand(layouts()[2], t, 91);  // a sliced view travels as its values
    Tensor there = x.on(Device::cpu()).to(kCuda);
    EXPECT_EQ(there.device(), kCuda);
    EXPECT_TRUE(there.is_contiguous());
    expect_match(there, x.on(Device::cpu()).contiguous(), {}, "to(cuda) " + dtype_name(t));
    Tensor back = x.on(kCuda).cpu();  // a strided device view comes home dense
    EXPECT_TRUE(back.is_contiguous());
    expect_match(x.on(Device::cpu()).to(kCuda), back, {}, "cpu() " + dtype_name(t));
  }
  EXPECT_DOUBLE_EQ(scalar_tensor(2.5, kFloat64, kCuda).item(), 2.5);
  EXPECT_EQ(zeros({0, 3}, kFloat32, kCuda).cpu().numel(), 0);
}

// Note [Pinned host memory]: page-locked blocks, kept by size for reuse, carrying values both ways.
TEST(CudaBackend, PinnedHostMemoryIsKeptForReuseAndCarriesTransfers) {
  REQUIRE_CUDA();
  void* a = backend(kCuda).allocate_pinned(kCuda, 12345 * 4);
  ASSERT_NE(a, nullptr);
  backend(kCuda).deallocate_pinned(kCuda, a, 12345 * 4);
  void* b = backend(kCuda).allocate_pinned(kCuda, 12345 * 4);
  EXPECT_EQ(a, b);  // the block came back from the cache
  backend(kCuda).deallocate_pinned(kCuda, b, 12345 * 4);
  for (DType t : {kFloat32, kBFloat16, kInt64}) {
    const Operand x = operand(layouts()[0], t, 17);
    Tensor h = empty_pinned(x.on(Device::cpu()).shape(), t, kCuda);
    h.copy_(x.on(Device::cpu()));
    Tensor there = h.to(kCuda);
    Tensor back = empty_pinned(h.shape(), t, kCuda);
    back.copy_(there);
    const Tensor want = x.on(Device::cpu()).contiguous();
    EXPECT_EQ(std::memcmp(back.raw_data(), want.raw_data(), static_cast<size_t>(want.numel() * dtype_size(t))), 0)
        << "pinned round trip " << dtype_name(t);
  }
}

TEST(CudaBackend, MemoryStatisticsAndTheCache) {
  REQUIRE_CUDA();
  synchronize(kCuda);
  const int64_t before = memory_allocated(kCuda);
  reset_peak_memory_stats(kCuda);
  constexpr int64_t kBytes = 64 << 20;
  {
    Tensor t = empty({kBytes / 4}, kFloat32, kCuda);
    EXPECT_EQ(memory_allocated(kCuda), before + kBytes);
    EXPECT_EQ(max_memory_allocated(kCuda), before + kBytes);
  }
  EXPECT_EQ(memory_allocated(kCuda), before);
  EXPECT_EQ(max_memory_allocated(kCuda), before + kBytes);
  synchronize(kCuda);                       // the free reaches the pool in stream order
  EXPECT_GE(memory_cached(kCuda), kBytes);  // kept for reuse, not returned to the driver
  empty_cache(kCuda);
  EXPECT_LT(memory_cached(kCuda), kBytes);
  reset_peak_memory_stats(kCuda);
  EXPECT_EQ(max_memory_allocated(kCuda), before);
}

TEST(CudaBackend, OutOfMemoryNamesTheBytes) {
  REQUIRE_CUDA();
  const std::string what = error_of<Error>([] { empty({int64_t{1} << 48}, kFloat32, kCuda); });  // 1 PiB
  EXPECT_NE(what.find("out of memory allocating 1125899906842624 bytes on cuda:0"), std::string::npos) << what;
  EXPECT_NE(what.find("bytes were cached"), std::string::npos) << what;
  // The device still works.
  EXPECT_EQ(ones({3}, kFloat32, kCuda).to_vector<float>(), (std::vector<float>{1, 1, 1}));
}

TEST(CudaBackend, EventsAreRecordedOnTheStream) {
  REQUIRE_CUDA();
  Tensor a = randn({512, 512}, kFloat32, nullptr, 0.0, 1.0, kCuda);
  Event start = Event::record(kCuda);
  Tensor b = matmul(a, a);
  Event middle = Event::record(kCuda);
  Tensor c = matmul(b, a);
  Event end = Event::record(kCuda);
  end.synchronize();
  EXPECT_TRUE(end.ready());
  EXPECT_EQ(start.elapsed_ms(start), 0.0);
  const double first = start.elapsed_ms(middle), all = start.elapsed_ms(end), second = middle.elapsed_ms(end);
  EXPECT_GT(first, 0.0);  // a 512^3 GEMM takes microseconds; the events resolve half of one
  EXPECT_GE(all, first);
  EXPECT_NEAR(all, first + second, 1e-3);
  EXPECT_LE(end.elapsed_ms(start), 0.0);
}

// Runs everywhere: without a GPU it checks the absence is reported, with one that an index past
// the count is refused naming the device.
TEST(CudaBackend, MissingDevicesAreRefusedNamingThem) {
  const int n = device_count(DeviceType::CUDA);
  const std::string past = Device::cuda(n).str();
  EXPECT_FALSE(device_available(Device::cuda(n)));
  EXPECT_NE(error_of<NotImplementedError>([&] {
              zeros({2}, kFloat32, Device::cuda(n));
            }).find("device " + past + " is not available: this process has " + std::to_string(n) + " device(s)"),
            std::string::npos);
}

TEST(CudaBackend, NoGpuMeansNoDevicesAndClearErrors) {
  if (device_available(kCuda)) GTEST_SKIP() << "a CUDA device is present: this test covers machines without one";
  EXPECT_EQ(device_count(DeviceType::CUDA), 0);
  EXPECT_NE(error_of<NotImplementedError>([] {
              ones({2}, kFloat32, Device::cpu()).to(kCuda);
            }).find("device cuda:0 is not available: this process has 0 device(s) of its type"),
            std::string::npos);
  EXPECT_NE(error_of<NotImplementedError>([] { synchronize(kCuda); }).find("cuda:0"), std::string::npos);
  // The CPU is untouched by the failed attempts.
  EXPECT_EQ(ones({2}, kFloat32, Device::cpu()).to_vector<float>(), (std::vector<float>{1, 1}));
}

}  // namespace
}  // namespace braid
