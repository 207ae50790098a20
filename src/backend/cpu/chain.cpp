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

// A tensor operand's index at flat element i of x: the sum over terms of ((i / r) % m) * s, one term
// per run of x's dimensions along which the operand's strides are those of one dimension (stride-0
// dimensions, where it broadcasts, are in r but in no term). Innermost term first.
struct Term {
  int64_t r, m, s;
};
constexpr int kMaxTerms = 8;

// The terms of v (x's shape, in x's memory order), or -1 when there are more than kMaxTerms.
int terms_of(const Tensor& v, Term* terms) {
  int count = 0;
  int64_t r = 1;
  for (int64_t j = v.dim() - 1; j >= 0; --j) {
    const int64_t size = v.shape()[static_cast<size_t>(j)], stride = v.strides()[static_cast<size_t>(j)];
    if (size == 1) continue;
    if (stride != 0) {
      Term* inner = count > 0 ? &terms[count - 1] : nullptr;
      if (inner != nullptr && inner->r * inner->m == r && stride == inner->s * inner->m) {
        inner->m *= size;  // continues the dimension inside it
      } else {
        if (count == kMaxTerms) return -1;
        terms[count++] = Term{r, size, stride};
      }
    }
    r *= size;
  }
  return count;
}

// A step with its operands resolved for one block.
struct Resolved {
  ChainStep::Kind kind;
  int a, b;
  float k, scale, zero;
  bool is_signed;
  const float *channel_scale, *channel_shift;
  const float* operand;  // a tensor operand, indexed by its terms
  Term terms[kMaxTerms];
  int nterms;
};

// The tensor operand's values at x's elements [begin, begin + n) where they lie in its memory one
// after the other (a residual of x's shape and layout; a row of a broadcast operand inside one
// repetition), so that a step reads them there; else null, and gather_operand copies them.
const float* operand_run(const Resolved& st, int64_t begin, int64_t n) {
  if (st.nterms == 0 || st.terms[0].r != 1 || st.terms[0].s != 1 || begin % st.terms[0].m + n > st.terms[0].m)
    return nullptr;
  int64_t at = 0;
  for (int k = 0; k < st.nterms; ++k) at += (begin / st.terms[k].r) % st.terms[k].m * st.terms[k].s;
  return st.operand + at;
}

// The tensor operand's values at x's elements [begin, begin + n), into y: in runs along which its
// index moves by a fixed step (the innermost term, r = 1) or stays (r > 1). An outer term's r is a
// multiple of the innermost's r * m (the terms are nested dimensions), so runs end where outer terms
// may change; each term's position is kept and carried by countdowns, without a division per run.
void gather_operand(const Resolved& st, int64_t begin, int64_t n, float* y) {
  const float* t = st.operand;
  if (st.nterms == 0) {  // one value everywhere
    std::fill(y, y + n, t[0]);
    return;
  }
  int64_t q[kMaxTerms], left[kMaxTerms], at = 0;
  for (int k = 0; k < st.nterms; ++k) {
    const Term& tk = st.terms[k];
    q[k] = (begin / tk.r) % tk.m;
    left[k] = tk.r - begin % tk.r;
    at += q[k] * tk.s;
  }
  // Moves term k on by one position (wrapping), as its countdown ran out.
  const auto step = [&](int k) {
    const Term& tk = st.terms[k];
    left[k] = tk.r;
    at += tk.s;
    if (++q[k] == tk.m) {
      q[k] = 0;
      at -= tk.m * tk.s;
    }
  };
  const Term& in = st.terms[0];
  for (int64_t i = 0; i < n;) {
    int64_t len;
    if (in.r == 1) {  // along the innermost term
      len = std::min(in.m - q[0], n - i);
      const float* src = t + at;
      if (in.s == 1)
        std::copy(src, src + len, y + i);
      else
        for (int64_t e = 0; e < len; ++e) y[i + e] = src[e * in.s];
      at += len * in.s;
      q[0] += len;
      if (q[0] == in.m) {
        q[0] = 0;
        at -= in.m * in.s;
      }
    } else {  // the same value for the rest of the innermost term's run
      len = std::min(left[0], n - i);
      std::fill(y + i, y + i + len, t[at]);
      if ((left[0] -= len) == 0) step(0);
    }
    for (int k = 1; k < st.nterms; ++k)
      if ((left[k] -= len) == 0) step(k);
    i += len;
  }
}

// UnaryOp::GeluHalfLast's float operations, out of run_block's body so that its code stays as it
// was before this step existed.
[[gnu::noinline]] BRAID_VECTOR_CLONES void gelu_half_last_run(const float* a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * (1.0f + erf_f32(a[i] / static_cast<float>(1.4142135623730951))) * 0.5f;
}

// The steps over elements [begin, begin + n) of x: slot 0 is x0 (x's elements from begin), the last
// slot is out, the others rows of `scratch` (stride `stride`), whose next row holds a tensor
// operand's values for the block. channel(i) = (i / inner) % channels. One clone per vector width
// (Note [Vector clones]); the loops are plain so that each vectorises.
BRAID_VECTOR_CLONES void run_block(const float* x0, float* out, float* scratch, int64_t stride, const Resolved* steps,
                                   int count, int64_t begin, int64_t n, int64_t channels, int64_t inner) {
  const auto slot = [&](int s) -> float* {
    if (s == 0) return const_cast<float*>(x0);
    if (s == count) return out + begin;
    return scratch + static_cast<int64_t>(s - 1) * stride;
  };
  float* gathered = scratch + static_cast<int64_t>(std::max(count - 1, 0)) * stride;
  for (int j = 0; j < count; ++j) {
    const Resolved& st = steps[j];
    float* y = slot(j + 1);
    const float* operand = nullptr;
    if (st.operand != nullptr) {
      operand = operand_run(st, begin, n);
      if (operand == nullptr) {
        gather_operand(st, begin, n, gathered);
        operand = gathered;
      }
    }
    const float* a = st.a >= 0 ? slot(st.a) : st.a == ChainStep::kTensor ? operand : nullptr;
    const float* b = st.b >= 0 ? slot(st.b) : st.b == ChainStep::kTensor ? operand : nullptr;
    const float k = st.k;
    switch (st.kind) {
      case ChainStep::Kind::FakeQuantize: {
        if (st.is_signed)
          fake_quantize_range<true>(a, y, n, st.scale, st.zero);
        else
          fake_quantize_range<false>(a, y, n, st.scale, st.zero);
        break;
      }
      case ChainStep::Kind::Gelu:  // UnaryOp::Gelu's float operations (elementwise.cpp's gelu_t)
        for (int64_t i = 0; i < n; ++i)
          y[i] = a[i] * (0.5f * (1.0f + erf_f32(a[i] / static_cast<float>(1.4142135623730951))));
        break;
      case ChainStep::Kind::GeluHalfLast:
        gelu_half_last_run(a, y, n);
        break;
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
  if (!fused_on() || (x.dtype() != kFloat32 && x.dtype() != kInt32) || out.dtype() != kFloat32 || !x.is_contiguous() ||
      !out.is_contiguous() || x.numel() != out.numel() || steps.empty() || channels < 1 || inner < 1)
    return false;
  std::vector<Resolved> rs;
  bool per_channel = false;
  for (const ChainStep& s : steps) {
    Resolved r{
        s.kind,  s.a,     s.b, s.k, static_cast<float>(s.scale), static_cast<float>(s.zero), s.qtype == kInt8, nullptr,
        nullptr, nullptr, {},  0};
    if (s.a == ChainStep::kTensor || s.b == ChainStep::kTensor) {
      if (s.operand.dtype() != kFloat32 || s.operand.shape() != x.shape()) return false;
      r.nterms = terms_of(s.operand, r.terms);
      if (r.nterms < 0) return false;
      r.operand = s.operand.data<float>();
    }
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
  // int32 values are converted block by block into a row of their own (braid::cast's conversion).
  const bool ints = x.dtype() == kInt32;
  const float* px = ints ? nullptr : x.data<float>();
  const int32_t* pi = ints ? x.data<int32_t>() : nullptr;
  float* py = out.data<float>();
  const int nt = n * count > kParallelGrain && blocks > 1 && !omp_in_parallel()
                     ? static_cast<int>(std::min<int64_t>(get_num_threads(), blocks))
                     : 1;
  // count - 1 slots, a gathered operand and the converted input; each thread's own, kept between
  // calls (a chain runs between every two convolutions of a quantised model). A team only where
  // the work is worth one: most chains of a quantised model at batch 1 are a few hundred values.
  in_team(nt, [&](int t, int parts) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>((count + 1) * block))
      scratch.resize(static_cast<size_t>((count + 1) * block));
    float* converted = scratch.data() + static_cast<int64_t>(count) * block;
    for (int64_t bi = blocks * t / parts; bi < blocks * (t + 1) / parts; ++bi) {
      const int64_t begin = bi * block, len = std::min(block, n - begin);
      if (ints)
        for (int64_t i = 0; i < len; ++i) converted[i] = static_cast<float>(pi[begin + i]);
      run_block(ints ? converted : px + begin, py, scratch.data(), block, rs.data(), count, begin, len, channels,
                inner);
    }
  });
  return true;
}

}  // namespace braid::detail
