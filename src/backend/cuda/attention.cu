// Fused attention (FusedKernels::attention_forward / attention_backward; Note [Attention as one
// node] in src/ops/attention.cpp) in the manner of FlashAttention-2: the forward walks the keys in
// tiles with an online softmax and keeps each row's log-sum-exp; the backward recomputes the
// probabilities from it, once per key tile for dK and dV and once per query tile for dQ, so no
// (L, S) matrix is stored and no atomics are needed. Operands float32, float16 or bfloat16, widened
// to float32 in shared memory; accumulation in float32. out, grad_out and the gradients are float32,
// or for half operands their dtype, rounded once on the store (so autocast's half activations cost
// no cast pass; the kernels are instantiated for those pairs only). Head dims up to 128.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

// Note [Attention tiles]
// Every kernel runs 128 threads over static shared tiles of float rows padded to 129 (so that
// threads reading one column of different rows hit different banks), 37 KB at most, below the
// 48 KB of static shared memory: the forward a tile of 32 queries against tiles of 32 keys, four
// threads per query row (each a quarter of out's columns); dQ 16 queries against 32 keys, eight
// threads per row; dK and dV 16 keys against tiles of 16 queries, eight threads per key row.
// Products are plain float32 multiply-adds from shared memory, not tensor-core fragments: the
// kernels are written for clarity and for the emulator (per-thread state in registers, blocks
// synchronised only at __syncthreads), and a case they decline runs the composite's cuBLAS
// products instead.
constexpr int kMaxHead = 128, kPad = kMaxHead + 1, kAttnThreads = 128;
constexpr int kFwdRows = 32, kFwdKeys = 32, kFwdLanes = kAttnThreads / kFwdRows;
constexpr int kDqRows = 16, kDqKeys = 32, kDqLanes = kAttnThreads / kDqRows;
constexpr int kDkvKeys = 16, kDkvRows = 16, kDkvLanes = kAttnThreads / kDkvKeys;

__device__ inline float widen(float x) { return x; }
__device__ inline float widen(F16 x) { return half_bits_to_float(x.bits); }
__device__ inline float widen(BF16 x) { return bfloat16_bits_to_float(x.bits); }

// The scores' bias: the causal mask, a bool mask (keep where true) or a float one, any strides.
struct Bias {
  const bool* keep;
  const float* add;
  int64_t sb, sl, ss;
  bool causal;
  __device__ float at(int64_t b, int64_t i, int64_t j) const {
    if (causal) return j > i ? -INFINITY : 0.0f;
    const int64_t off = b * sb + i * sl + j * ss;
    if (keep != nullptr) return keep[off] ? 0.0f : -INFINITY;
    return add != nullptr ? add[off] : 0.0f;
  }
};

struct Dims {
  int64_t B, L, S, E, Ev;
  float scale;
};

// rows [r0, r0 + n) of the (rows, d) matrix x into tile (n, kPad), zero past the last row.
template <typename T>
__device__ void load_rows(float (*tile)[kPad], const T* x, int64_t r0, int n, int64_t rows, int64_t d) {
  for (int64_t idx = threadIdx.x; idx < n * d; idx += kAttnThreads) {
    const int64_t r = idx / d, c = idx % d;
    tile[r][c] = r0 + r < rows ? widen(x[(r0 + r) * d + c]) : 0.0f;
  }
}

__device__ inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// One block per (batch, tile of kFwdRows queries): out (B, L, Ev) of O (float32 or T) and lse (B, L).
template <typename T, typename O>
__global__ void __launch_bounds__(kAttnThreads)
    attention_fwd_block_kernel(const T* q, const T* k, const T* v, Bias bias, Dims d, int64_t tiles, O* out,
                               float* lse) {
  __shared__ float sq[kFwdRows][kPad];
  __shared__ float skv[kFwdKeys][kPad];
  __shared__ float ss[kFwdRows][kFwdKeys + 1];
  const int64_t b = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kFwdRows;
  const int r = threadIdx.x / kFwdLanes, lane = threadIdx.x % kFwdLanes;
  const int64_t i = i0 + r;
  const T* kb = k + b * d.S * d.E;
  const T* vb = v + b * d.S * d.Ev;
  load_rows(sq, q + b * d.L * d.E, i0, kFwdRows, d.L, d.E);
  float m = -INFINITY, l = 0, acc[kMaxHead / kFwdLanes];
  for (float& a : acc) a = 0;
  // Causal: key tiles past the tile's last query are wholly masked.
  const int64_t s_end = bias.causal ? (i0 + kFwdRows < d.S ? i0 + kFwdRows : d.S) : d.S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kFwdKeys) {
    load_rows(skv, kb, j0, kFwdKeys, d.S, d.E);
    __syncthreads();
    for (int c = lane; c < kFwdKeys; c += kFwdLanes) {
      const int64_t j = j0 + c;
      ss[r][c] = j < d.S && i < d.L ? dot(sq[r], skv[c], d.E) * d.scale + bias.at(b, i, j) : -INFINITY;
    }
    __syncthreads();
    load_rows(skv, vb, j0, kFwdKeys, d.S, d.Ev);  // K is spent: V takes its place
    float mt = m;
    for (int c = 0; c < kFwdKeys; ++c) mt = fmaxf(mt, ss[r][c]);
    const float base = mt == -INFINITY ? 0.0f : mt;  // a row masked so far keeps p = 0, not NaN
    __syncthreads();
    for (int c = lane; c < kFwdKeys; c += kFwdLanes) ss[r][c] = expf(ss[r][c] - base);
    __syncthreads();
    const float alpha = expf(m - base);
    float rowsum = 0;
    for (int c = 0; c < kFwdKeys; ++c) rowsum += ss[r][c];
    l = l * alpha + rowsum;
    for (int t = 0; t < kMaxHead / kFwdLanes; ++t) {
      const int col = lane + t * kFwdLanes;
      if (col >= d.Ev) break;
      float pv = 0;
      for (int c = 0; c < kFwdKeys; ++c) pv += ss[r][c] * skv[c][col];
      acc[t] = acc[t] * alpha + pv;
    }
    m = mt;
    __syncthreads();
  }
  if (i >= d.L) return;
  // l = 0: every key masked, NaN as the composite's softmax, or no keys at all, out = 0 (an empty sum).
  const float inv = d.S == 0 ? 0.0f : 1.0f / l;
  O* o = out + (b * d.L + i) * d.Ev;
  for (int t = 0; t < kMaxHead / kFwdLanes; ++t) {
    const int col = lane + t * kFwdLanes;
    if (col >= d.Ev) break;
    o[col] = cast<O>(d.S == 0 ? 0.0f : acc[t] * inv);
  }
  if (lane == 0) lse[b * d.L + i] = (m == -INFINITY ? 0.0f : m) + logf(l);
}

// delta (B * L) = rowsum(grad_out * out), the term of dS = P (dP - delta); g and out of G.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(const G* g, const G* out, int64_t rows, int64_t ev, float* delta) {
  for (int64_t i = global_index(); i < rows; i += grid_stride()) {
    float s = 0;
    for (int64_t c = 0; c < ev; ++c) s += widen(g[i * ev + c]) * widen(out[i * ev + c]);
    delta[i] = s;
  }
}

// p = exp(s - lse) for the valid (query i, key j) pair, else 0.
__device__ inline float prob(float s, float lse, bool valid) { return valid ? expf(s - lse) : 0.0f; }

// One block per (batch, tile of kDqRows queries): gq (B, L, E) of GO from g of G.
template <typename T, typename G, typename GO>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dq_block_kernel(const T* q, const T* k, const T* v, Bias bias, Dims d, int64_t tiles, const G* g,
                              const float* lse, const float* delta, GO* gq) {
  __shared__ float sq[kDqRows][kPad];
  __shared__ float sg[kDqRows][kPad];
  __shared__ float skv[kDqKeys][kPad];
  __shared__ float sdp[kDqRows][kDqKeys + 1];
  __shared__ float sds[kDqRows][kDqKeys + 1];
  const int64_t b = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kDqRows;
  const int r = threadIdx.x / kDqLanes, lane = threadIdx.x % kDqLanes;
  const int64_t i = i0 + r;
  load_rows(sq, q + b * d.L * d.E, i0, kDqRows, d.L, d.E);
  load_rows(sg, g + b * d.L * d.Ev, i0, kDqRows, d.L, d.Ev);
  const float li = i < d.L ? lse[b * d.L + i] : 0.0f, di = i < d.L ? delta[b * d.L + i] : 0.0f;
  float acc[kMaxHead / kDqLanes];
  for (float& a : acc) a = 0;
  const int64_t s_end = bias.causal ? (i0 + kDqRows < d.S ? i0 + kDqRows : d.S) : d.S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kDqKeys) {
    load_rows(skv, v + b * d.S * d.Ev, j0, kDqKeys, d.S, d.Ev);
    __syncthreads();
    for (int c = lane; c < kDqKeys; c += kDqLanes) sdp[r][c] = dot(sg[r], skv[c], d.Ev);
    __syncthreads();
    load_rows(skv, k + b * d.S * d.E, j0, kDqKeys, d.S, d.E);
    __syncthreads();
    for (int c = lane; c < kDqKeys; c += kDqLanes) {
      const int64_t j = j0 + c;
      const bool valid = i < d.L && j < d.S;
      const float s = valid ? dot(sq[r], skv[c], d.E) * d.scale + bias.at(b, i, j) : 0.0f;
      sds[r][c] = prob(s, li, valid) * (sdp[r][c] - di);
    }
    __syncthreads();
    for (int t = 0; t < kMaxHead / kDqLanes; ++t) {
      const int col = lane + t * kDqLanes;
      if (col >= d.E) break;
      float s = 0;
      for (int c = 0; c < kDqKeys; ++c) s += sds[r][c] * skv[c][col];
      acc[t] += s;
    }
    __syncthreads();
  }
  if (i >= d.L) return;
  for (int t = 0; t < kMaxHead / kDqLanes; ++t) {
    const int col = lane + t * kDqLanes;
    if (col >= d.E) break;
    gq[(b * d.L + i) * d.E + col] = cast<GO>(acc[t] * d.scale);
  }
}

// One block per (batch, tile of kDkvKeys keys): gk (B, S, E) and gv (B, S, Ev) of GO from g of G.
template <typename T, typename G, typename GO>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dkv_block_kernel(const T* q, const T* k, const T* v, Bias bias, Dims d, int64_t tiles, const G* g,
                               const float* lse, const float* delta, GO* gk, GO* gv) {
  __shared__ float sk[kDkvKeys][kPad];
  __shared__ float sv[kDkvKeys][kPad];
  __shared__ float sq[kDkvRows][kPad];
  __shared__ float sg[kDkvRows][kPad];
  __shared__ float sp[kDkvRows][kDkvKeys + 1];
  __shared__ float sds[kDkvRows][kDkvKeys + 1];
  __shared__ float slse[kDkvRows], sdelta[kDkvRows];
  const int64_t b = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kDkvKeys;
  const int r = threadIdx.x / kDkvLanes, lane = threadIdx.x % kDkvLanes;
  const int64_t j = j0 + r;
  load_rows(sk, k + b * d.S * d.E, j0, kDkvKeys, d.S, d.E);
  load_rows(sv, v + b * d.S * d.Ev, j0, kDkvKeys, d.S, d.Ev);
  float ak[kMaxHead / kDkvLanes], av[kMaxHead / kDkvLanes];
  for (int t = 0; t < kMaxHead / kDkvLanes; ++t) ak[t] = av[t] = 0;
  // Causal: query tiles before the tile's first key are wholly masked.
  const int64_t i_begin = bias.causal ? j0 / kDkvRows * kDkvRows : 0;
  for (int64_t i0 = i_begin; i0 < d.L; i0 += kDkvRows) {
    load_rows(sq, q + b * d.L * d.E, i0, kDkvRows, d.L, d.E);
    load_rows(sg, g + b * d.L * d.Ev, i0, kDkvRows, d.L, d.Ev);
    const int tid = static_cast<int>(threadIdx.x);
    if (tid < kDkvRows) {
      const int64_t i = i0 + tid;
      slse[tid] = i < d.L ? lse[b * d.L + i] : 0.0f;
      sdelta[tid] = i < d.L ? delta[b * d.L + i] : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < kDkvRows * kDkvKeys; e += kAttnThreads) {
      const int qi = e / kDkvKeys, kc = e % kDkvKeys;
      const int64_t i = i0 + qi, jj = j0 + kc;
      const bool valid = i < d.L && jj < d.S;
      const float s = valid ? dot(sq[qi], sk[kc], d.E) * d.scale + bias.at(b, i, jj) : 0.0f;
      const float p = prob(s, slse[qi], valid);
      sp[qi][kc] = p;
      sds[qi][kc] = p * (dot(sg[qi], sv[kc], d.Ev) - sdelta[qi]);
    }
    __syncthreads();
    for (int t = 0; t < kMaxHead / kDkvLanes; ++t) {
      const int col = lane + t * kDkvLanes;
      if (col < d.Ev) {
        float s = 0;
        for (int qi = 0; qi < kDkvRows; ++qi) s += sp[qi][r] * sg[qi][col];
        av[t] += s;
      }
      if (col < d.E) {
        float s = 0;
        for (int qi = 0; qi < kDkvRows; ++qi) s += sds[qi][r] * sq[qi][col];
        ak[t] += s;
      }
    }
    __syncthreads();
  }
  if (j >= d.S) return;
  for (int t = 0; t < kMaxHead / kDkvLanes; ++t) {
    const int col = lane + t * kDkvLanes;
    if (col < d.E) gk[(b * d.S + j) * d.E + col] = cast<GO>(ak[t] * d.scale);
    if (col < d.Ev) gv[(b * d.S + j) * d.Ev + col] = cast<GO>(av[t]);
  }
}

// f(Tag<T>{}) for the operand types the kernels take; false for the others.
template <typename F>
bool dispatch_attention(DType t, F&& f) {
  if (t == DType::Float32) return f(Tag<float>{}), true;
  if (t == DType::Float16) return f(Tag<F16>{}), true;
  if (t == DType::BFloat16) return f(Tag<BF16>{}), true;
  return false;
}

// Whether dtype is float32 or the half dtype t of the operands: what out, grad_out and the gradients
// may be.
bool float_or_half(DType dtype, DType t) { return dtype == DType::Float32 || (dtype == t && is_half(t)); }

// Whether the kernels take these operands (attention_forward's contract, backend.h).
bool takes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out) {
  const DType t = q.dtype();
  if (k.dtype() != t || v.dtype() != t || !float_or_half(out.dtype(), t)) return false;
  if (q.size(2) > kMaxHead || v.size(2) > kMaxHead) return false;
  return !mask.defined() || mask.dtype() == DType::Bool || mask.dtype() == DType::Float32;
}

Bias bias_of(const Tensor& mask, bool causal) {
  Bias bias{nullptr, nullptr, 0, 0, 0, causal};
  if (mask.defined() && !causal) {
    if (mask.dtype() == DType::Bool)
      bias.keep = static_cast<const bool*>(ptr(mask));
    else
      bias.add = static_cast<const float*>(ptr(mask));
    bias.sb = mask.strides()[0], bias.sl = mask.strides()[1], bias.ss = mask.strides()[2];
  }
  return bias;
}

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), v.size(2), static_cast<float>(scale)};
}

int64_t tiles_of(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

// f(Tag<O>{}) for O float or T (a half operand dtype) as dtype says (float_or_half).
template <typename T, typename F>
void dispatch_float_or(DType dtype, F&& f) {
  if (dtype == DType::Float32)
    f(Tag<float>{});
  else if constexpr (kIsHalf<T>)
    f(Tag<T>{});
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

using namespace cuda;

bool CudaBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                                    double scale, const Tensor& out, const Tensor& lse) {
  if (!takes(q, k, v, mask, out)) return false;
  Launch at("attention_forward", q, {k, v, mask, out, lse});
  const Dims d = dims_of(q, k, v, scale);
  const int64_t tiles = tiles_of(d.L, kFwdRows);
  if (d.B * tiles == 0) return true;
  if (d.B * tiles > INT32_MAX) return false;
  return dispatch_attention(q.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_float_or<T>(out.dtype(), [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      attention_fwd_block_kernel<T, O><<<static_cast<unsigned>(d.B * tiles), kAttnThreads, 0, at.stream>>>(
          static_cast<const T*>(ptr(q)), static_cast<const T*>(ptr(k)), static_cast<const T*>(ptr(v)),
          bias_of(mask, causal), d, tiles, static_cast<O*>(ptr(out)), static_cast<float*>(ptr(lse)));
      check_launch("attention_forward", "attention_fwd_block_kernel");
    });
  });
}

bool CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                                     double scale, const Tensor& out, const Tensor& lse, const Tensor& grad_out,
                                     const Tensor& gq, const Tensor& gk, const Tensor& gv) {
  const DType t = q.dtype(), gt = gq.dtype();
  if (!takes(q, k, v, mask, out) || grad_out.dtype() != out.dtype() || gk.dtype() != gt || gv.dtype() != gt ||
      !float_or_half(gt, t) || q.size(0) * tiles_of(q.size(1) + k.size(1), kDqRows) > INT32_MAX)
    return false;
  Launch at("attention_backward", q, {k, v, mask, out, lse, grad_out, gq, gk, gv});
  const Dims d = dims_of(q, k, v, scale);
  const float* l = static_cast<const float*>(ptr(lse));
  Scratch delta(at.device, d.B * d.L * static_cast<int64_t>(sizeof(float)));
  float* dl = static_cast<float*>(delta.get());
  const int64_t q_tiles = tiles_of(d.L, kDqRows), k_tiles = tiles_of(d.S, kDkvKeys);
  return dispatch_attention(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *pq = static_cast<const T*>(ptr(q)), *pk = static_cast<const T*>(ptr(k)), *pv = static_cast<const T*>(ptr(v));
    const Bias bias = bias_of(mask, causal);
    dispatch_float_or<T>(out.dtype(), [&](auto g_tag) {  // grad_out and out
      using G = typename decltype(g_tag)::type;
      const G* g = static_cast<const G*>(ptr(grad_out));
      if (d.B * d.L > 0) {
        attention_delta_kernel<G><<<grid_for(d.B * d.L), kThreads, 0, at.stream>>>(
            g, static_cast<const G*>(ptr(out)), d.B * d.L, d.Ev, dl);
        check_launch("attention_backward", "attention_delta_kernel");
      }
      dispatch_float_or<T>(gt, [&](auto go_tag) {  // the gradients
        using GO = typename decltype(go_tag)::type;
        if (d.B * q_tiles > 0) {
          attention_dq_block_kernel<T, G, GO><<<static_cast<unsigned>(d.B * q_tiles), kAttnThreads, 0, at.stream>>>(
              pq, pk, pv, bias, d, q_tiles, g, l, dl, static_cast<GO*>(ptr(gq)));
          check_launch("attention_backward", "attention_dq_block_kernel");
        }
        if (d.B * k_tiles > 0) {
          attention_dkv_block_kernel<T, G, GO><<<static_cast<unsigned>(d.B * k_tiles), kAttnThreads, 0, at.stream>>>(
              pq, pk, pv, bias, d, k_tiles, g, l, dl, static_cast<GO*>(ptr(gk)), static_cast<GO*>(ptr(gv)));
          check_launch("attention_backward", "attention_dkv_block_kernel");
        }
      });
    });
  });
}

}  // namespace braid::detail
