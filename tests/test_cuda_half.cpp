// The CUDA backend's half arithmetic against the CPU backend (Note [Half arithmetic] in
// src/backend/backend.h): unary, binary, where and reduce on float16 and bfloat16 operands, which the
// CUDA kernels read and write as 2-byte elements, computing each in float32 and rounding once, where
// the CPU widens to float32 scratch and runs its float32 kernels. Over the layouts of cuda_parity.h
// (contiguous, permuted, sliced, broadcast (stride-0), 0-d, empty and large), and binary and where of
// a float32 operand with a half one. The IEEE operations
// both sides round alike give equal halves; libdevice against the CPU's own functions (a few float32
// ulp apart) gives halves equal or one half ulp apart, which the per-dtype tolerances allow. Matmul
// with half outs is in test_cuda_backend.cpp and test_cuda_matmul.cpp.
#include "cuda_parity.h"

namespace braid {
namespace {

const DType kHalfTypes[] = {kFloat16, kBFloat16};

// One half ulp (cuda_parity.h's approx for the half types).
Tol half_ulp(DType t) { return approx(t); }

TEST(CudaHalf, Unary) {
  REQUIRE_CUDA();
  for (DType t : kHalfTypes) unary_parity(t, half_ulp(t));
}

TEST(CudaHalf, BinaryAndWhere) {
  REQUIRE_CUDA();
  for (DType t : kHalfTypes) binary_parity(t);
  // where moves the bits of every dtype, the storage types included (b broadcast where the shapes allow).
  for (DType t : {kFloat16, kBFloat16, kInt8, kUInt8}) where_parity(t, 3);
}

// A float32 operand with a half one (arithmetic into float32, where), the half one widened on the load
// (Note [Half arithmetic]): on CUDA equal to the same op on the half operand cast to float32 first, the
// old path (widening is exact), and to the CPU's (pow within float32's approx, other libraries).
TEST(CudaHalf, MixedWithFloat32EqualsCastingFirst) {
  REQUIRE_CUDA();
  const std::vector<Layout> ls = layouts();
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div,
                          BinaryOp::Pow, BinaryOp::Max, BinaryOp::Min};
  for (DType h : kHalfTypes) {
    for (size_t i = 0; i < ls.size(); ++i) {
      const Layout& la = ls[i];
      const Layout& lb = i + 1 < ls.size() && ls[i + 1].shape == la.shape ? ls[i + 1] : ls[i];
      const Operand f = operand(la, kFloat32, 51), x = operand(lb, h, 52), c = operand(la, kBool, 53);
      for (bool half_first : {false, true}) {
        const std::string what = dtype_name(h) + (half_first ? " first, " : " second, ") + la.name + ", " + lb.name;
        // half: x as it is, or cast to float32 first (the same layout over a float32 copy of its base).
        const auto run = [&](BinaryOp op, Device d, bool cast_first) {
          const Tensor half = cast_first ? Operand{x.base.to(kFloat32), x.layout}.on(d) : x.on(d);
          Tensor out = fresh(la.shape, kFloat32, d);
          backend(d).binary(op, half_first ? half : f.on(d), half_first ? f.on(d) : half, out);
          return out;
        };
        for (BinaryOp op : ops) {
          const std::string o = "mixed binary op " + std::to_string(static_cast<int>(op)) + " " + what;
          expect_match(run(op, kCuda, false), run(op, kCuda, true), Tol{}, o + " (cast first)");
          expect_parity(o, op == BinaryOp::Pow ? approx(kFloat32) : Tol{}, [&](Device d) { return run(op, d, false); });
        }
        const auto where_run = [&](Device d, bool cast_first) {
          const Tensor half = cast_first ? Operand{x.base.to(kFloat32), x.layout}.on(d) : x.on(d);
          Tensor out = fresh(la.shape, kFloat32, d);
          backend(d).where(c.on(d), half_first ? half : f.on(d), half_first ? f.on(d) : half, out);
          return out;
        };
        expect_match(where_run(kCuda, false), where_run(kCuda, true), Tol{}, "mixed where " + what + " (cast first)");
        expect_parity("mixed where " + what, {}, [&](Device d) { return where_run(d, false); });
      }
    }
  }
}

TEST(CudaHalf, Reductions) {
  REQUIRE_CUDA();
  // Few outputs over many inputs (split reductions, partial results combined), many over few.
  const std::vector<ReductionCase> cases =
      reduction_cases({Layout{"rows", {3, 20001}, {20001, 1}, 0}, Layout{"columns", {20001, 3}, {3, 1}, 0}});
  for (DType t : kHalfTypes) {
    // Sums in another order: float32 results a rounding apart at most, so halves equal or one ulp apart.
    reduction_parity(t, cases, t == kFloat16 ? Tol{1e-3, 1e-5} : Tol{8e-3, 1e-5});
    long_arg_reduction_parity(t);
  }
}

// A half accumulator would lose each 1 against 2048 (float16's spacing there is 2); float32 keeps them.
TEST(CudaHalf, SumsAccumulateInFloat32AndRoundOnce) {
  REQUIRE_CUDA();
  std::vector<float> v(9, 1.0f);
  v[0] = 2048;
  for (DType t : kHalfTypes) {
    const Tensor x = tensor(v, {9}, kCuda).to(t);
    Tensor out = fresh({1}, t, kCuda);
    backend(kCuda).reduce(ReduceOp::Sum, x, {0}, out);
    EXPECT_EQ(values_of(out), std::vector<double>{t == kFloat16 ? 2056.0 : 2048.0}) << dtype_name(t);
    // bfloat16's spacing at 2048 is 16: 2056 rounds to even, 2048.
  }
}

// What stays unsupported is refused as before, naming the op and the dtype.
TEST(CudaHalf, StorageIntegersAreStillRefusedByName) {
  REQUIRE_CUDA();
  const Tensor x = fresh({4}, kInt8, kCuda);
  Tensor out = fresh({4}, kInt8, kCuda), bout = fresh({4}, kBool, kCuda), r = fresh({1}, kInt8, kCuda);
  EXPECT_NE(error_of<TypeError>([&] { backend(kCuda).unary(UnaryOp::Exp, x, out, 0, 0); }).find("exp: dtype int8"),
            std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { backend(kCuda).binary(BinaryOp::Lt, x, x, bout); }).find("lt: dtype int8"),
            std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { backend(kCuda).reduce(ReduceOp::Sum, x, {0}, r); }).find("sum: dtype int8"),
            std::string::npos);
  // The CPU refuses them too.
  EXPECT_THROW(backend(Device::cpu()).unary(UnaryOp::Exp, fresh({4}, kInt8, Device::cpu()),
                                            fresh({4}, kInt8, Device::cpu()), 0, 0),
               TypeError);
}

}  // namespace
}  // namespace braid
