// Binary elementwise kernels and where, with the CPU backend's rules (src/backend/cpu/binary.cpp):
// arithmetic in the operands' dtype (integers wrap; bool + is or, * is and), comparisons and logic
// into bool, maximum/minimum with NaN winning. float16 and bfloat16 operands are loaded as float32,
// go through the float32 functors and are rounded once on the store (Note [Half arithmetic] in
// src/backend/backend.h); a float32 operand with a half one (arithmetic, where) widens the half one
// on the load into a float32 out. An integer division by zero or a negative integer power sets a device
// flag that is read back after the kernel and reported as the CPU reports it. where moves the bits
// of any dtype.
// The CudaBackend methods, which unpack the tensors for them (host.h), follow the kernels.
#include <iterator>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

const char* binary_name(BinaryOp op) {
  static const char* const kNames[] = {"add", "sub", "mul", "div", "pow", "maximum",     "minimum",    "eq",
                                       "ne",  "lt",  "le",  "gt",  "ge",  "logical_and", "logical_or", "logical_xor"};
  const auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

template <typename T>
using U = std::make_unsigned_t<T>;

#define BRAID_BINARY_OP(Name, ...)               \
  struct Name {                                  \
    template <typename T>                        \
    __device__ auto operator()(T a, T b) const { \
      return __VA_ARGS__;                        \
    }                                            \
  };
BRAID_BINARY_OP(Add, a + b)
BRAID_BINARY_OP(Sub, a - b)
BRAID_BINARY_OP(Mul, a* b)
BRAID_BINARY_OP(Div, a / b)
BRAID_BINARY_OP(IntAdd, T(U<T>(a) + U<T>(b)))
BRAID_BINARY_OP(IntSub, T(U<T>(a) - U<T>(b)))
BRAID_BINARY_OP(IntMul, T(U<T>(a) * U<T>(b)))
BRAID_BINARY_OP(Max, (a > b) | (a != a) ? a : b)  // NaN wins, as torch.maximum
BRAID_BINARY_OP(Min, (a < b) | (a != a) ? a : b)
BRAID_BINARY_OP(Eq, a == b)
BRAID_BINARY_OP(Ne, a != b)
BRAID_BINARY_OP(Lt, a < b)
BRAID_BINARY_OP(Le, a <= b)
BRAID_BINARY_OP(Gt, a > b)
BRAID_BINARY_OP(Ge, a >= b)
BRAID_BINARY_OP(And, (a != T(0)) & (b != T(0)))
BRAID_BINARY_OP(Or, (a != T(0)) | (b != T(0)))
BRAID_BINARY_OP(Xor, (a != T(0)) != (b != T(0)))
#undef BRAID_BINARY_OP

struct FloatPow {
  __device__ float operator()(float a, float b) const { return powf(a, b); }
  __device__ double operator()(double a, double b) const { return pow(a, b); }
};

// Integer division as the CPU: by -1 negates (no MIN / -1 overflow), by 0 writes 0 and flags.
struct IntDiv {
  int* flag;
  template <typename T>
  __device__ T operator()(T a, T b) const {
    if (b == 0) {
      *flag = 1;
      return T(0);
    }
    return b == T(-1) ? T(U<T>(0) - U<T>(a)) : a / b;
  }
};

// Power by squaring, wrapping; a negative exponent flags (and gives 1, as the CPU's loop does).
struct IntPow {
  int* flag;
  template <typename T>
  __device__ T operator()(T base, T exp) const {
    if (exp < 0) *flag = 1;
    U<T> r = 1, b = U<T>(base);
    for (; exp > 0; exp >>= 1) {
      if (exp & 1) r *= b;
      b *= b;
    }
    return T(r);
  }
};

// Elements of T computed as Compute<T> (float for the half types), stored as O.
template <typename O, typename T, typename Op>
struct BinaryFn {
  using V = Compute<T>;
  O* out;
  const T* a;
  const T* b;
  Op op;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = cast<O>(op(cast<V>(a[off[1]]), cast<V>(b[off[2]])));
  }
};

// One float32 operand and one of the half type H, a_half saying which is a (Note [Half arithmetic]):
// the half one widened on the load, the float32 functor, a float32 out. The side is a launch
// argument rather than a template one, which keeps these kernels to one per op and half type.
template <typename H, typename Op>
struct MixedFn {
  float* out;
  const void* a;
  const void* b;
  bool a_half;
  Op op;
  __device__ static float load(const void* p, bool half, int64_t i) {
    return half ? cast<float>(static_cast<const H*>(p)[i]) : static_cast<const float*>(p)[i];
  }
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = op(load(a, a_half, off[1]), load(b, !a_half, off[2]));
  }
};

template <typename T>
struct Launch {
  const Indexer<3>& ix;
  int64_t n;
  void* out;
  const void* a;
  const void* b;
  cudaStream_t stream;
  const char* name;

  template <typename O, typename Op>
  void run(Op op = Op{}) const {
    launch_elementwise(ix, n,
                       BinaryFn<O, T, Op>{static_cast<O*>(out), static_cast<const T*>(a), static_cast<const T*>(b), op},
                       stream, name);
  }
};

// Runs an integer kernel that may flag bad operands, then throws the CPU's error when one did.
template <typename T, typename Op>
void run_flagged(const Launch<T>& l, int device, const char* message) {
  Scratch flag(device, sizeof(int));
  int* f = static_cast<int*>(flag.get());
  check(cudaMemsetAsync(f, 0, sizeof(int), l.stream), l.name, "cudaMemsetAsync");
  l.template run<T>(Op{f});
  int host = 0;
  check(cudaMemcpyAsync(&host, f, sizeof(int), cudaMemcpyDeviceToHost, l.stream), l.name, "cudaMemcpyAsync");
  check(cudaStreamSynchronize(l.stream), l.name, "cudaStreamSynchronize");
  BRAID_CHECK(host == 0, message);
}

template <typename T>
void arithmetic(BinaryOp op, const Launch<T>& l, int device, DType type) {
  if constexpr (std::is_same_v<T, bool>) {  // bool arithmetic is logic: + is or, * is and
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Max:
        return l.template run<bool, Or>();
      case BinaryOp::Mul:
      case BinaryOp::Min:
        return l.template run<bool, And>();
      default:
        unsupported_dtype(binary_name(op), type);
    }
  } else if constexpr (kIsInt<T>) {
    switch (op) {
      case BinaryOp::Add:
        return l.template run<T, IntAdd>();
      case BinaryOp::Sub:
        return l.template run<T, IntSub>();
      case BinaryOp::Mul:
        return l.template run<T, IntMul>();
      case BinaryOp::Div:
        return run_flagged<T, IntDiv>(l, device, "div: integer division by zero");
      case BinaryOp::Pow:
        return run_flagged<T, IntPow>(l, device,
                                      "pow: integers to negative integer powers are not allowed; use a float base");
      case BinaryOp::Max:
        return l.template run<T, Max>();
      case BinaryOp::Min:
        return l.template run<T, Min>();
      default:
        BRAID_ASSERT(false, "unhandled binary op ", binary_name(op));
    }
  } else {  // float, double and the half types (computed in float)
    switch (op) {
      case BinaryOp::Add:
        return l.template run<T, Add>();
      case BinaryOp::Sub:
        return l.template run<T, Sub>();
      case BinaryOp::Mul:
        return l.template run<T, Mul>();
      case BinaryOp::Div:
        return l.template run<T, Div>();
      case BinaryOp::Pow:
        return l.template run<T, FloatPow>();
      case BinaryOp::Max:
        return l.template run<T, Max>();
      case BinaryOp::Min:
        return l.template run<T, Min>();
      default:
        BRAID_ASSERT(false, "unhandled binary op ", binary_name(op));
    }
  }
}

template <typename T>
void compare_or_logic(BinaryOp op, const Launch<T>& l) {
  switch (op) {
    case BinaryOp::Eq:
      return l.template run<bool, Eq>();
    case BinaryOp::Ne:
      return l.template run<bool, Ne>();
    case BinaryOp::Lt:
      return l.template run<bool, Lt>();
    case BinaryOp::Le:
      return l.template run<bool, Le>();
    case BinaryOp::Gt:
      return l.template run<bool, Gt>();
    case BinaryOp::Ge:
      return l.template run<bool, Ge>();
    case BinaryOp::And:
      return l.template run<bool, And>();
    case BinaryOp::Or:
      return l.template run<bool, Or>();
    case BinaryOp::Xor:
      return l.template run<bool, Xor>();
    default:
      BRAID_ASSERT(false, "unhandled binary op ", binary_name(op));
  }
}

// The arithmetic ops of a float32 out from a float32 and an H operand.
template <typename H>
void mixed_arithmetic(BinaryOp op, const Indexer<3>& ix, int64_t n, float* out, const void* a, const void* b,
                      bool a_half, cudaStream_t stream) {
  const char* name = binary_name(op);
  const auto run = [&](auto op) {
    launch_elementwise(ix, n, MixedFn<H, decltype(op)>{out, a, b, a_half, op}, stream, name);
  };
  switch (op) {
    case BinaryOp::Add:
      return run(Add{});
    case BinaryOp::Sub:
      return run(Sub{});
    case BinaryOp::Mul:
      return run(Mul{});
    case BinaryOp::Div:
      return run(Div{});
    case BinaryOp::Pow:
      return run(FloatPow{});
    case BinaryOp::Max:
      return run(Max{});
    case BinaryOp::Min:
      return run(Min{});
    default:
      BRAID_ASSERT(false, "binary: ", name, " takes one dtype");
  }
}

template <typename T>
struct WhereFn {
  T* out;
  const bool* cond;
  const T* a;
  const T* b;
  __device__ void operator()(const int64_t* off) const { out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]]; }
};

void launch_binary(BinaryOp op, DType type, const Indexer<3>& ix, int64_t n, void* out, const void* a, const void* b,
                   int device, cudaStream_t stream) {
  const char* name = binary_name(op);
  dispatch_arith(type, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Launch<T> l{ix, n, out, a, b, stream, name};
    if (op >= BinaryOp::Eq)
      compare_or_logic<T>(op, l);
    else
      arithmetic<T>(op, l, device, type);
  });
}

void launch_where(DType type, const Indexer<4>& ix, int64_t n, void* out, const bool* cond, const void* a,
                  const void* b, cudaStream_t stream) {
  // where moves bits: every dtype, as the CPU (dispatch_all); the check names any other.
  dispatch_all(type, "where", [](auto) {});
  dispatch_bits(static_cast<int>(dtype_size(type)), "where", [&](auto tag) {
    using B = typename decltype(tag)::type;
    launch_elementwise(ix, n,
                       WhereFn<B>{static_cast<B*>(out), cond, static_cast<const B*>(a), static_cast<const B*>(b)},
                       stream, "where");
  });
}

// where of a float32 out from a float32 and an H operand: the half one widened on the load.
template <typename H>
struct WhereMixedFn {
  float* out;
  const bool* cond;
  const void* a;
  const void* b;
  bool a_half;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = cond[off[1]] ? MixedFn<H, Add>::load(a, a_half, off[2]) : MixedFn<H, Add>::load(b, !a_half, off[3]);
  }
};

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const bool mixed = mixed_half_operands(a.dtype(), b.dtype()) && out.dtype() == kFloat32 && op < BinaryOp::Eq;
  BRAID_ASSERT((a.dtype() == b.dtype() || mixed) &&
                   out.dtype() == (op >= BinaryOp::Eq ? kBool : mixed ? kFloat32 : a.dtype()) &&
                   a.shape() == out.shape() && b.shape() == out.shape(),
               "binary: got ", dtype_name(a.dtype()), " ", shape_str(a.shape()), ", ", dtype_name(b.dtype()), " ",
               shape_str(b.shape()), " -> ", dtype_name(out.dtype()), " ", shape_str(out.shape()));
  cuda::Launch l("binary", out, {a, b});
  if (mixed) {  // Note [Half arithmetic]: the half operand widened on the load
    const bool a_half = is_half(a.dtype());
    const auto ix = cuda::indexer<3>(out.shape(), {&out, &a, &b});
    float* o = static_cast<float*>(cuda::ptr(out));
    if ((a_half ? a.dtype() : b.dtype()) == kFloat16)
      cuda::mixed_arithmetic<cuda::F16>(op, ix, out.numel(), o, cuda::ptr(a), cuda::ptr(b), a_half, l.stream);
    else
      cuda::mixed_arithmetic<cuda::BF16>(op, ix, out.numel(), o, cuda::ptr(a), cuda::ptr(b), a_half, l.stream);
    return;
  }
  cuda::launch_binary(op, a.dtype(), cuda::indexer<3>(out.shape(), {&out, &a, &b}), out.numel(), cuda::ptr(out),
                      cuda::ptr(a), cuda::ptr(b), l.device, l.stream);
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.dtype() == kFloat32 && mixed_half_operands(a.dtype(), b.dtype())) {  // Note [Half arithmetic]
    cuda::Launch l("where", out, {cond, a, b});
    const bool a_half = is_half(a.dtype());
    const auto ix = cuda::indexer<4>(out.shape(), {&out, &cond, &a, &b});
    float* o = static_cast<float*>(cuda::ptr(out));
    const bool* c = static_cast<const bool*>(cuda::ptr(cond));
    if ((a_half ? a.dtype() : b.dtype()) == kFloat16)
      cuda::launch_elementwise(ix, out.numel(), cuda::WhereMixedFn<cuda::F16>{o, c, cuda::ptr(a), cuda::ptr(b), a_half},
                               l.stream, "where");
    else
      cuda::launch_elementwise(ix, out.numel(), cuda::WhereMixedFn<cuda::BF16>{o, c, cuda::ptr(a), cuda::ptr(b), a_half},
                               l.stream, "where");
    return;
  }
  BRAID_ASSERT(cond.dtype() == kBool && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
               "where: dtypes do not match");
  cuda::Launch l("where", out, {cond, a, b});
  cuda::launch_where(out.dtype(), cuda::indexer<4>(out.shape(), {&out, &cond, &a, &b}), out.numel(), cuda::ptr(out),
                     static_cast<const bool*>(cuda::ptr(cond)), cuda::ptr(a), cuda::ptr(b), l.stream);
}

}  // namespace braid::detail
