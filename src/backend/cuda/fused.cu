// The CUDA backend's fused kernels for training (Note [Fused kernels] in backend/backend.h): batch
// normalisation's three per-channel passes, Adam's step, softmax and layer normalisation over rows. Each computes its composite's function in one pass (two for the
// statistics), with the composite's arithmetic where it is elementwise, so that a GPU step runs one
// launch where the composite ran a dozen (the profile in benchmarks/README.md, "Devices against
// PyTorch"). Sums accumulate in double, as the composite's reductions do; only their order differs
// (a tree over a block's threads), so the results agree with the CPU's to rounding. Every entry
// declines (returns false) what it does not take: other dtypes, non-contiguous operands.
//
// Note [Per-channel sums on the GPU]
// channel_moments and channel_grad_sums reduce x (N, C, S) over N and S for each channel. One block
// per channel leaves most of the GPU idle when C is small against the SM count (a ResNet stem: 64
// channels of 64 x 112 x 112 values), so the (n, s) range of each channel is split over gridDim.y
// blocks, each writing a partial double sum, and a second kernel adds a channel's partials in order
// and finishes it. The variance needs the mean first: the moments are two such rounds, the mean's
// and then the centred squares' (two-pass, as the composite: no cancellation when the mean is large
// against the spread).
//
// The three passes are templates on T, the type of x, g, a, b and out, and S, the type of the
// per-channel tensors: S = T for float32 and float64, S = float for float16 and bfloat16 x (the
// mixed dtypes of FusedKernels::channel_moments in backend.h): each element is widened to float32,
// the arithmetic is the float32 pass's, and out is rounded once, so a half x gives the float32
// pass's values on the widened x without a float32 copy of it.
//
// Channels-last activations reach the passes as (N * H * W, C, 1) (Note [Channels-last training] in
// src/ops/conv.cpp), where one block per channel would read with a stride of C: a second kernel
// takes 32 neighbouring channels per block and splits the rows, into the same partials.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The sum of v over the block's threads (blockDim.x a power of two), returned to every thread;
// lanes holds blockDim.x values.
template <typename A>
__device__ A block_sum(A v, A* lanes) {
  lanes[threadIdx.x] = v;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) lanes[threadIdx.x] = lanes[threadIdx.x] + lanes[threadIdx.x + w];
    __syncthreads();
  }
  const A total = lanes[0];
  __syncthreads();  // lanes may be reused at once
  return total;
}

// ---- batch normalisation (x viewed as (N, C, S), contiguous) ----

struct Ncs {
  int64_t n, c, s;
};

// What one pass over a channel's values sums: x itself (Sum), the centred squares (Centred2), or g
// and g * (x - mean) (GradSums, two sums).
enum class ChannelPass { Sum, Centred2, GradSums };

// One element's share of a pass's sums: x[at] (Sum), its centred square (Centred2), or g[at] and
// g[at] * (x[at] - m) (GradSums), each widened to S and added in double.
template <ChannelPass P, typename T, typename S>
__device__ void channel_accumulate(const T* x, const T* g, S m, int64_t at, double& s0, double& s1) {
  if constexpr (P == ChannelPass::Sum) {
    s0 += static_cast<double>(cast<S>(x[at]));
  } else if constexpr (P == ChannelPass::Centred2) {
    const S centred = cast<S>(x[at]) - m;
    s0 += static_cast<double>(centred * centred);
  } else {
    const S gi = cast<S>(g[at]);
    s0 += static_cast<double>(gi);
    s1 += static_cast<double>(gi * (cast<S>(x[at]) - m));
  }
}

// partial[(y * 2 + k) * C + c] = sum k of block y's share of channel c (k = 1 for GradSums only).
template <ChannelPass P, typename T, typename S>
__global__ void __launch_bounds__(kThreads) channel_sums_block_kernel(const T* x, const T* g, const S* mean, Ncs d,
                                                                      int64_t chunk, double* partial) {
  __shared__ double lanes[kThreads];
  const int64_t c = blockIdx.x, total = d.n * d.s;
  const int64_t j0 = blockIdx.y * chunk, j1 = j0 + chunk < total ? j0 + chunk : total;
  const S m = P == ChannelPass::Sum ? S(0) : mean[c];
  double s0 = 0, s1 = 0;
  for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x)
    channel_accumulate<P, T, S>(x, g, m, (j / d.s * d.c + c) * d.s + j % d.s, s0, s1);
  s0 = block_sum(s0, lanes);
  if constexpr (P == ChannelPass::GradSums) s1 = block_sum(s1, lanes);
  if (threadIdx.x == 0) {
    partial[(blockIdx.y * 2) * d.c + c] = s0;
    if constexpr (P == ChannelPass::GradSums) partial[(blockIdx.y * 2 + 1) * d.c + c] = s1;
  }
}

// The same partials for channels-last memory, x viewed as (N * H * W, C, 1) (d.s == 1; Note
// [Channels-last training] in src/ops/conv.cpp): a block takes kRowLanes channels side by side, so
// that a warp reads a row's neighbouring channels (one block per channel would read with stride C),
// and kThreads / kRowLanes rows at a time of its chunk of rows, summed over the rows at the end.
constexpr int kRowLanes = 32;
template <ChannelPass P, typename T, typename S>
__global__ void __launch_bounds__(kThreads) channel_rows_sums_block_kernel(const T* x, const T* g, const S* mean,
                                                                           Ncs d, int64_t chunk, double* partial) {
  __shared__ double lanes[2][kThreads];
  const int lane = static_cast<int>(threadIdx.x) % kRowLanes, group = static_cast<int>(threadIdx.x) / kRowLanes;
  const int groups = static_cast<int>(blockDim.x) / kRowLanes;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRowLanes + lane;
  const int64_t j0 = blockIdx.y * chunk, j1 = j0 + chunk < d.n ? j0 + chunk : d.n;
  double s0 = 0, s1 = 0;
  if (c < d.c) {
    const S m = P == ChannelPass::Sum ? S(0) : mean[c];
    for (int64_t j = j0 + group; j < j1; j += groups) channel_accumulate<P, T, S>(x, g, m, j * d.c + c, s0, s1);
  }
  lanes[0][threadIdx.x] = s0;
  lanes[1][threadIdx.x] = s1;
  __syncthreads();
  if (group == 0 && c < d.c) {
    double t0 = 0, t1 = 0;
    for (int k = 0; k < groups; ++k) {
      t0 += lanes[0][k * kRowLanes + lane];
      t1 += lanes[1][k * kRowLanes + lane];
    }
    partial[(blockIdx.y * 2) * d.c + c] = t0;
    if constexpr (P == ChannelPass::GradSums) partial[(blockIdx.y * 2 + 1) * d.c + c] = t1;
  }
}

// out0[c] (and out1[c] for GradSums) = the splits' partials added in order, divided by `count` for
// the moments' means (count 0: the sums themselves).
template <ChannelPass P, typename T>  // T: the per-channel type
__global__ void __launch_bounds__(kThreads)
    channel_finish_kernel(const double* partial, int64_t splits, int64_t channels, double count, T* out0, T* out1) {
  for (int64_t c = global_index(); c < channels; c += grid_stride()) {
    double s0 = 0, s1 = 0;
    for (int64_t y = 0; y < splits; ++y) {
      s0 += partial[(y * 2) * channels + c];
      if constexpr (P == ChannelPass::GradSums) s1 += partial[(y * 2 + 1) * channels + c];
    }
    out0[c] = static_cast<T>(count > 0 ? s0 / count : s0);
    if constexpr (P == ChannelPass::GradSums) out1[c] = static_cast<T>(s1);
  }
}

// One round of Note [Per-channel sums on the GPU] into out0 (and out1).
template <ChannelPass P, typename T, typename S>
void channel_round(const T* x, const T* g, const S* mean, Ncs d, double count, S* out0, S* out1, int device,
                   cudaStream_t stream, const char* op) {
  const int64_t total = d.n * d.s;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, [&] {
    int64_t p = 1;
    while (p < total) p *= 2;
    return p;
  }())));
  // Enough blocks for a few per SM, each with at least 8 values per thread.
  const int64_t want = std::max<int64_t>(1, ceil_div(4 * static_cast<int64_t>(sm_count(device)), d.c));
  const int64_t splits_wanted = std::min({want, std::max<int64_t>(1, total / (threads * 8)), int64_t{65535}});
  const int64_t chunk = ceil_div(std::max<int64_t>(total, 1), splits_wanted), splits = ceil_div(std::max<int64_t>(total, 1), chunk);
  Scratch partial(device, splits * 2 * d.c * static_cast<int64_t>(sizeof(double)));
  double* p = static_cast<double*>(partial.get());
  channel_sums_block_kernel<P, T, S><<<dim3(static_cast<unsigned>(d.c), static_cast<unsigned>(splits)),
                                    static_cast<unsigned>(threads), 0, stream>>>(x, g, mean, d, chunk, p);
  check_launch(op, "channel_sums_block_kernel");
  channel_finish_kernel<P, S><<<grid_for(d.c), kThreads, 0, stream>>>(p, splits, d.c, count, out0, out1);
  check_launch(op, "channel_finish_kernel");
}

// channel_round for channels-last rows (d.s == 1): kRowLanes channels per block, rows split so
// that there are a few blocks per SM, each row group taking at least 8 rows.
template <ChannelPass P, typename T, typename S>
void channel_rows_round(const T* x, const T* g, const S* mean, Ncs d, double count, S* out0, S* out1, int device,
                        cudaStream_t stream, const char* op) {
  const int64_t tiles = ceil_div(d.c, kRowLanes), rows_per_pass = kThreads / kRowLanes;
  const int64_t want = std::max<int64_t>(1, ceil_div(4 * static_cast<int64_t>(sm_count(device)), tiles));
  const int64_t splits_wanted = std::min({want, std::max<int64_t>(1, d.n / (rows_per_pass * 8)), int64_t{65535}});
  const int64_t chunk = ceil_div(std::max<int64_t>(d.n, 1), splits_wanted), splits = ceil_div(std::max<int64_t>(d.n, 1), chunk);
  Scratch partial(device, splits * 2 * d.c * static_cast<int64_t>(sizeof(double)));
  double* p = static_cast<double*>(partial.get());
  channel_rows_sums_block_kernel<P, T, S><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), kThreads,
                                         0, stream>>>(x, g, mean, d, chunk, p);
  check_launch(op, "channel_rows_sums_block_kernel");
  channel_finish_kernel<P, S><<<grid_for(d.c), kThreads, 0, stream>>>(p, splits, d.c, count, out0, out1);
  check_launch(op, "channel_finish_kernel");
}

// out = (a * sa[c] + shift[c]) + (b - b_mean[c]) * sb[c], the last term only when b is given.
template <typename T, typename S>
__global__ void __launch_bounds__(kThreads) channel_affine_kernel(const T* a, const S* sa, const S* shift, const T* b,
                                                                  const S* b_mean, const S* sb, T* out, Ncs d) {
  const int64_t total = d.n * d.c * d.s;
  for (int64_t i = global_index(); i < total; i += grid_stride()) {
    const int64_t c = i / d.s % d.c;
    const S y = cast<S>(a[i]) * sa[c] + shift[c];
    out[i] = cast<T>(b != nullptr ? y + (cast<S>(b[i]) - b_mean[c]) * sb[c] : y);
  }
}

// ---- Adam ----

__device__ inline float typed_sqrt(float x) { return sqrtf(x); }
__device__ inline double typed_sqrt(double x) { return sqrt(x); }

// Element i of one parameter's step, in the composite's operations and order (src/optim/adam.cpp).
template <typename T, bool kAmsgrad>
__device__ inline void adam_element(T* p, const T* g, T* m, T* v, T* mv, int64_t i, const AdamStep& s) {
  const T beta1 = static_cast<T>(s.beta1), beta2 = static_cast<T>(s.beta2);
  const T one_minus_beta1 = static_cast<T>(1 - s.beta1), one_minus_beta2 = static_cast<T>(1 - s.beta2);
  const T pi = s.decay != 1 ? p[i] * static_cast<T>(s.decay) : p[i];
  const T gi = g[i];
  const T mi = m[i] * beta1 + gi * one_minus_beta1;
  const T vi = v[i] * beta2 + (gi * gi) * one_minus_beta2;
  m[i] = mi;
  v[i] = vi;
  T si = vi;
  if constexpr (kAmsgrad) {
    const T a = mv[i];
    si = (a > vi) || (a != a) ? a : vi;  // NaN wins, as the composite's maximum
    mv[i] = si;
  }
  p[i] = pi + (mi / (typed_sqrt(si) / static_cast<T>(s.sqrt_bias_correction2) + static_cast<T>(s.eps))) *
                  static_cast<T>(-s.step_size);
}

template <typename T, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads) adam_kernel(T* p, const T* g, T* m, T* v, T* mv, int64_t n, AdamStep s) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) adam_element<T, kAmsgrad>(p, g, m, v, mv, i, s);
}

// Note [Multi-tensor Adam]
// A model's parameters are a few hundred tensors, many of them small (biases, norms' weights), and
// a launch per tensor made the optimizer a few hundred launches a step. adam_steps passes the
// pointers of up to kAdamList parameters by value in the kernel's arguments (1.2 KB, well inside the
// 4 KB every GPU takes), with the prefix sums of their sizes; each thread walks the concatenated
// elements with a grid-stride loop, moving on to the next parameter as its index passes the end of
// one (indices only grow, so the walk is amortised constant). PyTorch's fused Adam packs its
// tensor lists the same way.
constexpr int kAdamList = 24;

template <typename T>
struct AdamList {
  T* p[kAdamList];
  const T* g[kAdamList];
  T* m[kAdamList];
  T* v[kAdamList];
  T* mv[kAdamList];
  int64_t end[kAdamList];  // the prefix sums of the parameters' sizes
  int count;
};

template <typename T, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads) adam_list_kernel(AdamList<T> list, AdamStep s) {
  const int64_t total = list.end[list.count - 1];
  int k = 0;
  for (int64_t i = global_index(); i < total; i += grid_stride()) {
    while (i >= list.end[k]) ++k;
    const int64_t j = i - (k == 0 ? 0 : list.end[k - 1]);
    adam_element<T, kAmsgrad>(list.p[k], list.g[k], list.m[k], list.v[k], list.mv[k], j, s);
  }
}

// ---- rows: softmax and layer normalisation (float32, one block per row) ----

// The max of each row's values (NaN when the row holds one) into every thread, through lanes.
__device__ inline float row_max(const float* xr, int64_t n, float* lanes) {
  float m = -__int_as_float(0x7f800000);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i];
    m = m != m ? m : (v != v || v > m ? v : m);  // a NaN, once met, stays
  }
  lanes[threadIdx.x] = m;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      const float a = lanes[threadIdx.x], b = lanes[threadIdx.x + w];
      lanes[threadIdx.x] = a != a ? a : (b != b || b > a ? b : a);
    }
    __syncthreads();
  }
  m = lanes[0];
  __syncthreads();
  return m;
}

// out = softmax of each row of n: m = the max (NaN when the row holds one), e = exp(x - m), out = e /
// float(sum of e in double); or, kLog, log_softmax: out = (x - m) - log(float(that sum)).
template <bool kLog>
__global__ void __launch_bounds__(kThreads) softmax_rows_block_kernel(const float* x, float* out, int64_t rows,
                                                                      int64_t n) {
  __shared__ float maxes[kThreads];
  __shared__ double sums[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    const float m = row_max(xr, n, maxes);
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float e = expf(xr[i] - m);
      if constexpr (!kLog) yr[i] = e;
      s += static_cast<double>(e);
    }
    const float total = static_cast<float>(block_sum(s, sums));
    if constexpr (kLog) {
      const float lse = logf(total);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - m) - lse;
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = yr[i] / total;
    }
  }
}

// gx = g - exp(y) * float(the row's sum of g in double).
__global__ void __launch_bounds__(kThreads)
    log_softmax_backward_rows_block_kernel(const float* g, const float* y, float* gx, int64_t rows, int64_t n) {
  __shared__ double sums[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *gr = g + r * n, *yr = y + r * n;
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(gr[i]);
    const float total = static_cast<float>(block_sum(s, sums));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) gx[r * n + i] = gr[i] - expf(yr[i]) * total;
  }
}

// Layer normalisation of each row of n: m = float(mean in double), inv = 1 / sqrt(float(mean of the
// float squares (x - m)^2, in double) + eps), out = (x - m) * inv (* w) (+ b), the composite's order.
__global__ void __launch_bounds__(kThreads)
    layer_norm_rows_block_kernel(const float* x, const float* w, const float* b, float eps, float* out, float* mean,
                                 float* inv, int64_t rows, int64_t n) {
  __shared__ double sums[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(xr[i]);
    const float m = static_cast<float>(block_sum(s, sums) / static_cast<double>(n));
    double q = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = xr[i] - m;
      q += static_cast<double>(d * d);
    }
    const float var = static_cast<float>(block_sum(q, sums) / static_cast<double>(n));
    const float k = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float y = (xr[i] - m) * k;
      if (w != nullptr) y = y * w[i];
      if (b != nullptr) y = y + b[i];
      yr[i] = y;
    }
    if (threadIdx.x == 0) {
      if (mean != nullptr) mean[r] = m;
      if (inv != nullptr) inv[r] = k;
    }
  }
}

unsigned row_threads(int64_t n) {
  int64_t p = 32;
  while (p < n && p < kThreads) p *= 2;
  return static_cast<unsigned>(p);
}

// Whether every defined tensor is contiguous and of dtype.
bool all_contiguous(DType dtype, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && (!t->is_contiguous() || t->dtype() != dtype)) return false;
  return true;
}

// f(Tag<T>{}, Tag<S>{}) for batch normalisation's element dtype t and per-channel dtype s: both
// float32 or both float64, or float16/bfloat16 t with float32 s; false for the others.
template <typename F>
bool channel_types(DType t, DType s, F&& f) {
  if (t == kFloat32 && s == kFloat32) return f(Tag<float>{}, Tag<float>{}), true;
  if (t == kFloat64 && s == kFloat64) return f(Tag<double>{}, Tag<double>{}), true;
  if (t == kFloat16 && s == kFloat32) return f(Tag<F16>{}, Tag<float>{}), true;
  if (t == kBFloat16 && s == kFloat32) return f(Tag<BF16>{}, Tag<float>{}), true;
  return false;
}

// The per-channel dtype batch normalisation's passes take with elements of dtype t.
DType channel_dtype(DType t) { return t == kFloat16 || t == kBFloat16 ? kFloat32 : t; }

template <typename F>
bool floating(DType t, F&& f) {
  if (t == kFloat32) return f(Tag<float>{}), true;
  if (t == kFloat64) return f(Tag<double>{}), true;
  return false;
}

template <typename T>
T* at(const Tensor& t) {
  return static_cast<T*>(ptr(t));
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

using cuda::at;

bool CudaBackend::channel_moments(const Tensor& x, const Tensor& mean, const Tensor& var) {
  const DType sd = cuda::channel_dtype(x.dtype());
  if (x.dim() != 3 || !cuda::all_contiguous(x.dtype(), {&x}) || !cuda::all_contiguous(sd, {&mean, &var}) ||
      !cuda::channel_types(x.dtype(), sd, [](auto, auto) {}))
    return false;
  const cuda::Ncs d{x.size(0), x.size(1), x.size(2)};
  if (d.n * d.s == 0) return false;  // the composite's NaN moments of nothing
  if (d.c == 0) return true;
  cuda::Launch l("channel_moments", x, {mean, var});
  const double count = static_cast<double>(d.n * d.s);
  return cuda::channel_types(x.dtype(), sd, [&]<typename T, typename S>(cuda::Tag<T>, cuda::Tag<S>) {
    using P = cuda::ChannelPass;
    // Channels-last rows (N * H * W, C, 1) take the row kernel (Note [Per-channel sums on the GPU]).
    const auto round = d.s == 1 && d.c > 1 ? cuda::channel_rows_round<P::Sum, T, S> : cuda::channel_round<P::Sum, T, S>;
    const auto centred = d.s == 1 && d.c > 1 ? cuda::channel_rows_round<P::Centred2, T, S>
                                             : cuda::channel_round<P::Centred2, T, S>;
    round(at<T>(x), nullptr, nullptr, d, count, at<S>(mean), nullptr, l.device, l.stream, "channel_moments");
    centred(at<T>(x), nullptr, at<S>(mean), d, count, at<S>(var), nullptr, l.device, l.stream, "channel_moments");
  });
}

bool CudaBackend::channel_grad_sums(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,
                                    const Tensor& sum_gxc) {
  const DType sd = cuda::channel_dtype(x.dtype());
  if (x.dim() != 3 || g.shape() != x.shape() || !cuda::all_contiguous(x.dtype(), {&g, &x}) ||
      !cuda::all_contiguous(sd, {&mean, &sum_g, &sum_gxc}) || !cuda::channel_types(x.dtype(), sd, [](auto, auto) {}))
    return false;
  const cuda::Ncs d{x.size(0), x.size(1), x.size(2)};
  if (d.c == 0) return true;
  cuda::Launch l("channel_grad_sums", x, {g, mean, sum_g, sum_gxc});
  return cuda::channel_types(x.dtype(), sd, [&]<typename T, typename S>(cuda::Tag<T>, cuda::Tag<S>) {
    const auto round = d.s == 1 && d.c > 1 ? cuda::channel_rows_round<cuda::ChannelPass::GradSums, T, S>
                                           : cuda::channel_round<cuda::ChannelPass::GradSums, T, S>;
    round(at<T>(x), at<T>(g), at<S>(mean), d, 0, at<S>(sum_g), at<S>(sum_gxc), l.device, l.stream, "channel_grad_sums");
  });
}

bool CudaBackend::channel_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b,
                                 const Tensor& b_mean, const Tensor& sb, const Tensor& out) {
  const DType sd = cuda::channel_dtype(a.dtype());
  if (a.dim() != 3 || out.shape() != a.shape() || (b.defined() && b.shape() != a.shape()) ||
      !cuda::all_contiguous(a.dtype(), {&a, &b, &out}) || !cuda::all_contiguous(sd, {&sa, &shift, &b_mean, &sb}) ||
      !cuda::channel_types(a.dtype(), sd, [](auto, auto) {}))
    return false;
  const cuda::Ncs d{a.size(0), a.size(1), a.size(2)};
  const int64_t n = a.numel();
  cuda::Launch l("channel_affine", a, {sa, shift, b, b_mean, sb, out});
  return cuda::channel_types(a.dtype(), sd, [&]<typename T, typename S>(cuda::Tag<T>, cuda::Tag<S>) {
    if (n == 0) return;
    cuda::channel_affine_kernel<T, S><<<cuda::grid_for(n), cuda::kThreads, 0, l.stream>>>(
        at<T>(a), at<S>(sa), at<S>(shift), at<T>(b), at<S>(b_mean), at<S>(sb), at<T>(out), d);
    cuda::check_launch("channel_affine", "channel_affine_kernel");
  });
}

bool CudaBackend::adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                            const AdamStep& s) {
  for (const Tensor* t : {&g, &m, &v, &max_v})
    if (t->defined() && t->shape() != p.shape()) return false;
  if (!cuda::all_contiguous(p.dtype(), {&p, &g, &m, &v, &max_v})) return false;
  const int64_t n = p.numel();
  cuda::Launch l("adam_step", p, {g, m, v, max_v});
  return cuda::floating(p.dtype(), [&]<typename T>(cuda::Tag<T>) {
    if (n == 0) return;
    if (max_v.defined())
      cuda::adam_kernel<T, true><<<cuda::grid_for(n), cuda::kThreads, 0, l.stream>>>(
          at<T>(p), at<T>(g), at<T>(m), at<T>(v), at<T>(max_v), n, s);
    else
      cuda::adam_kernel<T, false><<<cuda::grid_for(n), cuda::kThreads, 0, l.stream>>>(at<T>(p), at<T>(g), at<T>(m),
                                                                                      at<T>(v), nullptr, n, s);
    cuda::check_launch("adam_step", "adam_kernel");
  });
}

bool CudaBackend::adam_steps(const std::vector<AdamTensors>& params, const AdamStep& s) {
  if (params.empty()) return true;
  const Tensor& p0 = params[0].p;
  const bool amsgrad = params[0].max_v.defined();
  for (const AdamTensors& t : params) {
    if (t.max_v.defined() != amsgrad) return false;
    for (const Tensor* u : {&t.g, &t.m, &t.v, &t.max_v})
      if (u->defined() && u->shape() != t.p.shape()) return false;
    if (!cuda::all_contiguous(p0.dtype(), {&t.p, &t.g, &t.m, &t.v, &t.max_v})) return false;
  }
  if (p0.dtype() != kFloat32 && p0.dtype() != kFloat64) return false;
  cuda::Launch l("adam_steps", p0, {});
  for (const AdamTensors& t : params)
    for (const Tensor* u : {&t.p, &t.g, &t.m, &t.v, &t.max_v})
      BRAID_CHECK_T(TypeError, !u->defined() || u->device() == p0.device(), "adam_steps: operands on different devices (",
                    u->device().str(), " and ", p0.device().str(), "); move them with .to(device) first");
  return cuda::floating(p0.dtype(), [&]<typename T>(cuda::Tag<T>) {
    for (size_t first = 0; first < params.size(); first += cuda::kAdamList) {
      cuda::AdamList<T> list{};
      int64_t total = 0;
      for (size_t k = first; k < std::min(params.size(), first + cuda::kAdamList); ++k) {
        const AdamTensors& t = params[k];
        const int c = list.count++;
        list.p[c] = at<T>(t.p);
        list.g[c] = at<T>(t.g);
        list.m[c] = at<T>(t.m);
        list.v[c] = at<T>(t.v);
        list.mv[c] = at<T>(t.max_v);
        list.end[c] = total += t.p.numel();
      }
      if (total == 0) continue;
      if (amsgrad)
        cuda::adam_list_kernel<T, true><<<cuda::grid_for(total), cuda::kThreads, 0, l.stream>>>(list, s);
      else
        cuda::adam_list_kernel<T, false><<<cuda::grid_for(total), cuda::kThreads, 0, l.stream>>>(list, s);
      cuda::check_launch("adam_steps", "adam_list_kernel");
    }
  });
}

bool CudaBackend::softmax_rows(const Tensor& x, const Tensor& out) {
  if (x.dtype() != kFloat32 || out.dtype() != kFloat32 || !x.is_contiguous() || !out.is_contiguous() || x.dim() == 0)
    return false;
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  if (rows == 0) return true;
  cuda::Launch l("softmax_rows", x, {out});
  const unsigned blocks = static_cast<unsigned>(std::min(rows, cuda::kMaxBlocks));
  cuda::softmax_rows_block_kernel<false><<<blocks, cuda::row_threads(n), 0, l.stream>>>(at<float>(x), at<float>(out),
                                                                                       rows, n);
  cuda::check_launch("softmax_rows", "softmax_rows_block_kernel");
  return true;
}

bool CudaBackend::log_softmax_rows(const Tensor& x, const Tensor& out) {
  if (x.dtype() != kFloat32 || out.dtype() != kFloat32 || !x.is_contiguous() || !out.is_contiguous() || x.dim() == 0 ||
      x.numel() == 0)
    return false;
  const int64_t n = x.size(-1), rows = x.numel() / n;
  cuda::Launch l("log_softmax_rows", x, {out});
  const unsigned blocks = static_cast<unsigned>(std::min(rows, cuda::kMaxBlocks));
  cuda::softmax_rows_block_kernel<true><<<blocks, cuda::row_threads(n), 0, l.stream>>>(at<float>(x), at<float>(out),
                                                                                      rows, n);
  cuda::check_launch("log_softmax_rows", "softmax_rows_block_kernel");
  return true;
}

bool CudaBackend::log_softmax_backward_rows(const Tensor& g, const Tensor& y, const Tensor& gx) {
  if (y.dim() == 0 || y.numel() == 0 || g.shape() != y.shape() || gx.shape() != y.shape() ||
      !cuda::all_contiguous(kFloat32, {&g, &y, &gx}))
    return false;
  const int64_t n = y.size(-1), rows = y.numel() / n;
  cuda::Launch l("log_softmax_backward_rows", y, {g, gx});
  cuda::log_softmax_backward_rows_block_kernel<<<static_cast<unsigned>(std::min(rows, cuda::kMaxBlocks)),
                                                 cuda::row_threads(n), 0, l.stream>>>(at<float>(g), at<float>(y),
                                                                                      at<float>(gx), rows, n);
  cuda::check_launch("log_softmax_backward_rows", "log_softmax_backward_rows_block_kernel");
  return true;
}

bool CudaBackend::layer_norm_rows(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& out, const Tensor& mean, const Tensor& inv) {
  if (n <= 0 || !x.defined() || !cuda::all_contiguous(kFloat32, {&x, &weight, &bias, &out, &mean, &inv})) return false;
  const int64_t rows = x.numel() / n;
  if (rows == 0) return true;
  cuda::Launch l("layer_norm_rows", x, {weight, bias, out, mean, inv});
  cuda::layer_norm_rows_block_kernel<<<static_cast<unsigned>(std::min(rows, cuda::kMaxBlocks)), cuda::row_threads(n),
                                       0, l.stream>>>(at<float>(x), at<float>(weight), at<float>(bias),
                                                      static_cast<float>(eps), at<float>(out), at<float>(mean),
                                                      at<float>(inv), rows, n);
  cuda::check_launch("layer_norm_rows", "layer_norm_rows_block_kernel");
  return true;
}


}  // namespace braid::detail
