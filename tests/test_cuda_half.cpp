// The CUDA backend's half arithmetic against the CPU backend (Note [Half arithmetic] in
// src/backend/backend.h): unary, binary, where and reduce on float16 and bfloat16 operands, which the
// CUDA kernels read and write as 2-byte elements, computing each in float32 and rounding once, where
// the CPU widens to float32 scratch and runs its float32 kernels. Over the layouts of cuda_parity.h
// (contiguous, permuted, sliced, broadcast (stride-0), 0-d, empty and large). The IEEE operations
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
