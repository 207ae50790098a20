// Reductions (sum, prod, max, min over any axes) and argmax/argmin over one axis, with the CPU
// backend's arithmetic (src/backend/cpu/reduce.cpp): floats accumulate in double and integers in
// uint64 (wrapping), max/min propagate NaN, an empty reduction gives the identity, arg-reductions
// give the first extreme with a NaN counting as the extreme. Only the order of the additions
// differs from the CPU, so float64 sums agree to rounding and float32 sums almost always exactly.
// float16 and bfloat16 (Note [Half arithmetic] in src/backend/backend.h) read their 2-byte elements
// as float32 and reduce exactly as float32 does (sums and products in the same double accumulator,
// rounded to float32 and then to the half type, as the CPU's float32 kernel and its copy to the
// half out round them; max, min and the arg-reductions compare the float32 values).
//
// Two kernels cover the layouts. When x's innermost kept axis is more contiguous than its innermost
// reduced axis (column sums, bias gradients) a thread reduces one output, so a warp reads
// neighbouring elements; otherwise (row sums, full reductions) a block reduces one output. Either
// splits the reduced range over gridDim.y when there are too few outputs to fill the device, into
// partial results that a third kernel combines.
// The CudaBackend methods, which unpack the tensors for them (host.h), follow the kernels.
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

/// A reduction's two index spaces: the kept positions (row-major over out's shape, which is
/// contiguous, with x's strides) and the reduced ones (x's strides over the reduced axes).
struct ReduceShape {
  Indexer<1> kept;
  Indexer<1> reduced;
  int64_t nout;
  int64_t nred;
};

__host__ __device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
__device__ bool is_nan(T x) {
  if constexpr (kIsFloat<T>)
    return x != x;
  else
    return false;
}

template <typename T>
__device__ T lowest() {
  if constexpr (std::is_same_v<T, float>)
    return -__int_as_float(0x7f800000);  // -inf
  else if constexpr (std::is_same_v<T, double>)
    return -__longlong_as_double(0x7ff0000000000000ll);
  else if constexpr (std::is_same_v<T, int32_t>)
    return INT32_MIN;
  else if constexpr (std::is_same_v<T, int64_t>)
    return INT64_MIN;
  else
    return false;
}

template <typename T>
__device__ T highest() {
  if constexpr (std::is_same_v<T, float>)
    return __int_as_float(0x7f800000);  // +inf
  else if constexpr (std::is_same_v<T, double>)
    return __longlong_as_double(0x7ff0000000000000ll);
  else if constexpr (std::is_same_v<T, int32_t>)
    return INT32_MAX;
  else if constexpr (std::is_same_v<T, int64_t>)
    return INT64_MAX;
  else
    return true;
}

template <typename T>
using WideAcc = std::conditional_t<kIsFloat<Compute<T>>, double, uint64_t>;

// An element of T as its compute type (float for the half types).
template <typename T>
__device__ Compute<T> load(T x) {
  return cast<Compute<T>>(x);
}

// A float accumulator's result as T: a half type through float32, as the CPU's float32 kernel
// rounds its double sum to float32 and its copy to the half out rounds that.
template <typename T, typename Acc>
__device__ T finish_as(Acc a) {
  if constexpr (kIsHalf<T>)
    return convert<T>(static_cast<float>(a));
  else
    return static_cast<T>(a);
}

template <typename T>
struct SumR {
  using Acc = WideAcc<T>;
  static __device__ Acc init() { return Acc(0); }
  static __device__ Acc step(Acc a, T x) { return a + static_cast<Acc>(load(x)); }
  static __device__ Acc combine(Acc a, Acc b) { return a + b; }
  static __device__ T finish(Acc a) { return finish_as<T>(a); }
};

template <typename T>
struct ProdR {
  using Acc = WideAcc<T>;
  static __device__ Acc init() { return Acc(1); }
  static __device__ Acc step(Acc a, T x) { return a * static_cast<Acc>(load(x)); }
  static __device__ Acc combine(Acc a, Acc b) { return a * b; }
  static __device__ T finish(Acc a) { return finish_as<T>(a); }
};

// A NaN x is taken (every comparison with it is false) and a NaN accumulator kept.
template <typename T>
struct MaxR {
  using Acc = Compute<T>;
  static __device__ Acc init() { return lowest<Acc>(); }
  static __device__ Acc combine(Acc a, Acc x) { return (a > x) | is_nan(a) ? a : x; }
  static __device__ Acc step(Acc a, T x) { return combine(a, load(x)); }
  static __device__ T finish(Acc a) { return cast<T>(a); }  // exact: a is one of the elements
};

template <typename T>
struct MinR {
  using Acc = Compute<T>;
  static __device__ Acc init() { return highest<Acc>(); }
  static __device__ Acc combine(Acc a, Acc x) { return (a < x) | is_nan(a) ? a : x; }
  static __device__ Acc step(Acc a, T x) { return combine(a, load(x)); }
  static __device__ T finish(Acc a) { return cast<T>(a); }
};

// Result (or partial, when the reduced range is split) for output o of split blockIdx.y.
template <typename R, typename T>
__device__ void store(typename R::Acc acc, int64_t o, int64_t nout, T* out, typename R::Acc* partial) {
  if (partial)
    partial[blockIdx.y * nout + o] = acc;
  else
    out[o] = R::finish(acc);
}

// One thread per output; split blockIdx.y reduces inputs [blockIdx.y * chunk, + chunk).
template <typename R, typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_thread_kernel(ReduceShape s, const T* x, T* out, typename R::Acc* partial, int64_t chunk) {
  const int64_t r0 = blockIdx.y * chunk, r1 = imin(s.nred, r0 + chunk);
  for (int64_t o = global_index(); o < s.nout; o += grid_stride()) {
    const T* base = x + s.kept.offset(o);
    typename R::Acc acc = R::init();
    for (int64_t r = r0; r < r1; ++r) acc = R::step(acc, base[s.reduced.offset(r)]);
    store<R>(acc, o, s.nout, out, partial);
  }
}

// One block per output (blockDim a power of two): strided partial results, then a tree in shared memory.
template <typename R, typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_block_kernel(ReduceShape s, const T* x, T* out, typename R::Acc* partial, int64_t chunk) {
  using Acc = typename R::Acc;
  __shared__ Acc lanes[kThreads];
  const int64_t r0 = blockIdx.y * chunk, r1 = imin(s.nred, r0 + chunk);
  for (int64_t o = blockIdx.x; o < s.nout; o += gridDim.x) {
    const T* base = x + s.kept.offset(o);
    Acc acc = R::init();
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc = R::step(acc, base[s.reduced.offset(r)]);
    lanes[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) lanes[threadIdx.x] = R::combine(lanes[threadIdx.x], lanes[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) store<R>(lanes[0], o, s.nout, out, partial);
    __syncthreads();  // lanes is reused for the next output
  }
}

// out[o] = the splits' partial results combined in order (the identity when there are none).
template <typename R, typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_finish_kernel(const typename R::Acc* partial, int64_t splits, int64_t nout, T* out) {
  for (int64_t o = global_index(); o < nout; o += grid_stride()) {
    typename R::Acc acc = R::init();
    for (int64_t k = 0; k < splits; ++k) acc = R::combine(acc, partial[k * nout + o]);
    out[o] = R::finish(acc);
  }
}

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

template <typename R, typename T>
void reduce_with(const ReduceShape& s, const T* x, T* out, int device, cudaStream_t stream, const char* name) {
  using Acc = typename R::Acc;
  if (s.nout == 0) return;
  if (s.nred == 0) {  // the identity (sum 0, prod 1)
    reduce_finish_kernel<R, T><<<grid_for(s.nout), kThreads, 0, stream>>>(nullptr, 0, s.nout, out);
    return check_launch(name, "reduce_finish_kernel");
  }
  const int64_t target = static_cast<int64_t>(sm_count(device)) * 2048;  // threads that fill the device
  const int64_t kept_step = s.kept.ndim > 0 ? std::llabs(s.kept.strides[0][0]) : 0;
  const int64_t red_step = s.reduced.ndim > 0 ? std::llabs(s.reduced.strides[0][0]) : 0;
  const bool thread_mode = s.nred <= 32 || (s.kept.ndim > 0 && kept_step < red_step && s.nout >= 256);
  int64_t threads, splits = 1;
  if (thread_mode) {
    threads = kThreads;
    if (s.nout < target && s.nred >= 64)
      splits = std::min({ceil_div(target, s.nout), ceil_div(s.nred, 32), int64_t{65535}});
  } else {
    threads = std::min<int64_t>(kThreads, std::max<int64_t>(32, pow2_at_least(s.nred)));
    if (s.nout * threads < target && s.nred >= threads * 16)
      splits = std::min({ceil_div(target, s.nout * threads), ceil_div(s.nred, threads * 8), int64_t{65535}});
  }
  const int64_t chunk = ceil_div(s.nred, splits);
  splits = ceil_div(s.nred, chunk);
  Scratch partial(device, splits > 1 ? splits * s.nout * static_cast<int64_t>(sizeof(Acc)) : 0);
  Acc* p = static_cast<Acc*>(partial.get());
  const dim3 grid(thread_mode ? grid_for(s.nout) : static_cast<unsigned>(imin(s.nout, kMaxBlocks)),
                  static_cast<unsigned>(splits));
  if (thread_mode)
    reduce_thread_kernel<R, T><<<grid, kThreads, 0, stream>>>(s, x, out, p, chunk);
  else
    reduce_block_kernel<R, T><<<grid, static_cast<unsigned>(threads), 0, stream>>>(s, x, out, p, chunk);
  check_launch(name, thread_mode ? "reduce_thread_kernel" : "reduce_block_kernel");
  if (splits > 1) {
    reduce_finish_kernel<R, T><<<grid_for(s.nout), kThreads, 0, stream>>>(p, splits, s.nout, out);
    check_launch(name, "reduce_finish_kernel");
  }
}

// ---- argmax / argmin ----

// The CPU's scan: the first strict improvement wins, and the first NaN ends it.
template <typename T, bool kMax>
__device__ void arg_scan(const T* v, int64_t begin, int64_t end, int64_t step, int64_t stride, Compute<T>& best,
                         int64_t& at) {
  for (int64_t k = begin; k < end && !is_nan(best); k += step) {
    const Compute<T> c = load(v[k * stride]);
    if ((kMax ? c > best : c < best) || is_nan(c)) {
      best = c;
      at = k;
    }
  }
}

template <typename T, bool kMax>
__global__ void __launch_bounds__(kThreads)
    arg_thread_kernel(Indexer<1> kept, int64_t nout, int64_t len, int64_t stride, const T* x, int64_t* out) {
  for (int64_t o = global_index(); o < nout; o += grid_stride()) {
    const T* v = x + kept.offset(o);  // (len) with stride
    Compute<T> best = load(v[0]);
    int64_t at = 0;
    arg_scan<T, kMax>(v, 1, len, 1, stride, best, at);
    out[o] = at;
  }
}

// Whether candidate (c, ci) beats (b, bi): a NaN beats a number, then the extreme, then the first index.
template <typename T, bool kMax>
__device__ bool arg_better(T c, int64_t ci, T b, int64_t bi) {
  if (is_nan(c) || is_nan(b)) return is_nan(c) && (!is_nan(b) || ci < bi);
  if (kMax ? c > b : c < b) return true;
  return c == b && ci < bi;
}

template <typename T, bool kMax>
__global__ void __launch_bounds__(kThreads)
    arg_block_kernel(Indexer<1> kept, int64_t nout, int64_t len, int64_t stride, const T* x, int64_t* out) {
  using V = Compute<T>;
  __shared__ V values[kThreads];
  __shared__ int64_t indices[kThreads];
  for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
    const T* v = x + kept.offset(o);
    V best = kMax ? lowest<V>() : highest<V>();
    int64_t at = INT64_MAX;  // no element: loses every tie
    if (threadIdx.x < len) {
      best = load(v[threadIdx.x * stride]);
      at = threadIdx.x;
      arg_scan<T, kMax>(v, threadIdx.x + blockDim.x, len, blockDim.x, stride, best, at);
    }
    values[threadIdx.x] = best;
    indices[threadIdx.x] = at;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w && arg_better<V, kMax>(values[threadIdx.x + w], indices[threadIdx.x + w], values[threadIdx.x],
                                                 indices[threadIdx.x])) {
        values[threadIdx.x] = values[threadIdx.x + w];
        indices[threadIdx.x] = indices[threadIdx.x + w];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = indices[0];
    __syncthreads();
  }
}

void launch_reduce(ReduceOp op, DType type, const ReduceShape& shape, const void* x, void* out, int device,
                   cudaStream_t stream) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "argmax", "argmin"};
  const char* name = kNames[static_cast<int>(op)];
  dispatch_arith(type, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    switch (op) {
      case ReduceOp::Sum:
        return reduce_with<SumR<T>>(shape, px, po, device, stream, name);
      case ReduceOp::Prod:
        return reduce_with<ProdR<T>>(shape, px, po, device, stream, name);
      case ReduceOp::Max:
        return reduce_with<MaxR<T>>(shape, px, po, device, stream, name);
      case ReduceOp::Min:
        return reduce_with<MinR<T>>(shape, px, po, device, stream, name);
      case ReduceOp::ArgMax:
      case ReduceOp::ArgMin:
        break;
    }
    BRAID_ASSERT(false, name, " goes through launch_arg_reduce");
  });
}

void launch_arg_reduce(bool is_max, DType type, const Indexer<1>& kept, int64_t nout, int64_t len, int64_t stride,
                       const void* x, int64_t* out, cudaStream_t stream) {
  const char* name = is_max ? "argmax" : "argmin";
  if (nout == 0) return;
  // Long rows with few of them get a block each; otherwise a thread scans one row.
  const bool block_mode = len >= 256 && nout < 8192;
  dispatch_arith(type, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    const unsigned blocks = block_mode ? static_cast<unsigned>(imin(nout, kMaxBlocks)) : grid_for(nout);
    if (block_mode && is_max)
      arg_block_kernel<T, true><<<blocks, kThreads, 0, stream>>>(kept, nout, len, stride, px, out);
    if (block_mode && !is_max)
      arg_block_kernel<T, false><<<blocks, kThreads, 0, stream>>>(kept, nout, len, stride, px, out);
    if (!block_mode && is_max)
      arg_thread_kernel<T, true><<<blocks, kThreads, 0, stream>>>(kept, nout, len, stride, px, out);
    if (!block_mode && !is_max)
      arg_thread_kernel<T, false><<<blocks, kThreads, 0, stream>>>(kept, nout, len, stride, px, out);
    check_launch(name, block_mode ? "arg_block_kernel" : "arg_thread_kernel");
  });
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "argmax", "argmin"};
  const char* name = kNames[static_cast<int>(op)];
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  if (out.numel() == 0) return;
  BRAID_ASSERT(out.is_contiguous() && out.dtype() == (arg ? kInt64 : x.dtype()) && out.dim() == x.dim(), name,
               ": out must be contiguous, keepdim-shaped and of the result dtype");
  cuda::Launch l(name, out, {x});
  // Kept positions in out's row-major order (out is contiguous), with x's strides.
  const cuda::Indexer<1> kept = cuda::make_indexer<1>(out.shape(), {x.strides().data()}, /*reorder=*/false);
  if (arg) {
    BRAID_ASSERT(axes.size() == 1, name, " reduces exactly one axis");
    const int64_t len = x.shape()[axes[0]];
    BRAID_CHECK(len > 0, name, ": cannot reduce an empty axis");
    return cuda::launch_arg_reduce(op == ReduceOp::ArgMax, x.dtype(), kept, out.numel(), len, x.strides()[axes[0]],
                                   cuda::ptr(x), static_cast<int64_t*>(cuda::ptr(out)), l.stream);
  }
  Shape rshape(x.shape().size(), 1);  // x's shape over the reduced axes, 1 over the kept ones
  for (int64_t a : axes) rshape[a] = x.shape()[a];
  const cuda::ReduceShape shape{kept, cuda::make_indexer<1>(rshape, {x.strides().data()}), out.numel(),
                                shape_numel(rshape)};
  cuda::launch_reduce(op, x.dtype(), shape, cuda::ptr(x), cuda::ptr(out), l.device, l.stream);
}

}  // namespace braid::detail
