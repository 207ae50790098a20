// The CPU's elementwise chains (Note [Elementwise chains] in src/ops/chain.cpp): the memory in
// blocks that stay in cache, every step applied to a block before the next block, each step the
// float32 operations of its op (braid::fake_quantize's quantized_value, channel_affine's x * scale
// + shift, the binary ops), so the result is bitwise the steps run one by one.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"
#include "braid/parallel.h"

namespace braid::detail {

namespace {

// A step with its operands resolved for one block.
struct Resolved {
  ChainStep::Kind kind;
  int a, b;
  float k, scale, zero;
  bool is_signed;
  const float *channel_scale, *channel_shift;
};

// The steps over elements [begin, begin + n) of x: slot 0 is x itself, the last slot is out, the
// others rows of `scratch` (stride `stride`). channel(i) = (i / inner) % channels. One clone per
// vector width (Note [Vector clones]); the loops are plain so that each vectorises.
BRAID_VECTOR_CLONES void run_block(const float* x, float* out, float* scratch, int64_t stride, const Resolved* steps,
                                   int count, int64_t begin, int64_t n, int64_t channels, int64_t inner) {
  const auto slot = [&](int s) -> float* {
    if (s == 0) return const_cast<float*>(x + begin);
    if (s == count) return out + begin;
    return scratch + static_cast<int64_t>(s - 1) * stride;
  };
  for (int j = 0; j < count; ++j) {
    const Resolved& st = steps[j];
    float* y = slot(j + 1);
    const float* a = st.a >= 0 ? slot(st.a) : nullptr;
    const float* b = st.b >= 0 ? slot(st.b) : nullptr;
    const float k = st.k;
    switch (st.kind) {
      case ChainStep::Kind::FakeQuantize: {
        const float s = st.scale, z = st.zero;
        if (st.is_signed)
          for (int64_t i = 0; i < n; ++i)
            y[i] = (static_cast<float>(static_cast<int32_t>(quantized_value<true>(a[i], s, z))) - z) * s;
        else
          for (int64_t i = 0; i < n; ++i)
            y[i] = (static_cast<float>(static_cast<int32_t>(quantized_value<false>(a[i], s, z))) - z) * s;
        break;
      }
      case ChainStep::Kind::ChannelAffine: {
        const float *sc = st.channel_scale, *sh = st.channel_shift;
        if (inner == 1) {  // channels innermost; blocks start at a multiple of channels
          for (int64_t r = 0; r < n; r += channels)
            for (int64_t c = 0; c < channels; ++c) y[r + c] = a[r + c] * sc[c] + sh[c];
        } else {  // runs of one channel
          for (int64_t i = 0; i < n;) {
            const int64_t g = begin + i, c = (g / inner) % channels, end = std::min(n, i + (inner - g % inner));
            const float kc = sc[c], tc = sh[c];
            for (int64_t e = i; e < end; ++e) y[e] = a[e] * kc + tc;
            i = end;
          }
        }
        break;
      }
      case ChainStep::Kind::Add:
        if (a && b)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
        else if (a)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] + k;
        else
          for (int64_t i = 0; i < n; ++i) y[i] = k + b[i];
        break;
      case ChainStep::Kind::Sub:
        if (a && b)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
        else if (a)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] - k;
        else
          for (int64_t i = 0; i < n; ++i) y[i] = k - b[i];
        break;
      case ChainStep::Kind::Mul:
        if (a && b)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
        else if (a)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] * k;
        else
          for (int64_t i = 0; i < n; ++i) y[i] = k * b[i];
        break;
      case ChainStep::Kind::Div:
        if (a && b)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] / b[i];
        else if (a)
          for (int64_t i = 0; i < n; ++i) y[i] = a[i] / k;
        else
          for (int64_t i = 0; i < n; ++i) y[i] = k / b[i];
        break;
    }
  }
}

}  // namespace

bool CpuBackend::elementwise_chain(const Tensor& x, const std::vector<ChainStep>& steps, int64_t channels,
                                   int64_t inner, const Tensor& out) {
  if (!fused_on() || x.dtype() != kFloat32 || out.dtype() != kFloat32 || !x.is_contiguous() || !out.is_contiguous() ||
      x.numel() != out.numel() || steps.empty() || channels < 1 || inner < 1)
    return false;
  std::vector<Resolved> rs;
  bool per_channel = false;
  for (const ChainStep& s : steps) {
    Resolved r{s.kind,           s.a,     s.b,    s.k, static_cast<float>(s.scale), static_cast<float>(s.zero),
               s.qtype == kInt8, nullptr, nullptr};
    if (s.kind == ChainStep::Kind::ChannelAffine) {
      if (!s.channel_scale.is_contiguous() || !s.channel_shift.is_contiguous()) return false;
      r.channel_scale = s.channel_scale.data<float>();
      r.channel_shift = s.channel_shift.data<float>();
      per_channel = true;
    }
    rs.push_back(r);
  }
  const int64_t n = x.numel();
  // Blocks of about 1024 elements; whole rows of channels when channels are innermost.
  const int64_t block = per_channel && inner == 1 ? channels * std::max<int64_t>(1, 1024 / channels) : 1024;
  const int64_t blocks = (n + block - 1) / block;
  const int count = static_cast<int>(rs.size());
  const float* px = x.data<float>();
  float* py = out.data<float>();
  const int nt = n * count > kParallelGrain && blocks > 1 && !omp_in_parallel()
                     ? static_cast<int>(std::min<int64_t>(get_num_threads(), blocks))
                     : 1;
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> scratch(static_cast<size_t>(std::max(count - 1, 1) * block));
#pragma omp for schedule(static)
    for (int64_t bi = 0; bi < blocks; ++bi) {
      const int64_t begin = bi * block;
      run_block(px, py, scratch.data(), block, rs.data(), count, begin, std::min(block, n - begin), channels, inner);
    }
  }
  return true;
}

}  // namespace braid::detail
