// Note [One epilogue kernel]
// The bias, activation and affine after a product ran as four passes of lambdas inside a parallel
// loop, which GCC compiled for SSE2 only and, for HardSwish, left scalar (the closure's captured
// scale and shift could alias the row): at batch 1 it took two thirds of a chain of 64-channel 1x1
// convolutions at 14x14. Here they are one function of locals, compiled as vector clones (Note
// [Vector clones]), called once per run of values; each step keeps its own pass and rounding.
#include "backend/cpu/epilogue.h"

#include "backend/cpu/fast_math.h"

namespace braid::detail {
namespace {

template <typename Act>
inline void passes(float* __restrict y, int64_t n, const float* bias, float scale, float shift, Act act) {
  if (bias != nullptr) {
    const float b = *bias;
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + b;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = act(y[i]);
  if (scale != 1.0f)
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] * scale;
  if (shift != 0.0f)
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + shift;
}

}  // namespace

BRAID_VECTOR_CLONES void epilogue_run(const Epilogue& e, const float* bias, float* y, int64_t n) {
  const float a = static_cast<float>(e.a), b = static_cast<float>(e.b);
  const float scale = static_cast<float>(e.scale), shift = static_cast<float>(e.shift);
  switch (e.kind) {
    case Epilogue::Kind::None:
      if (bias == nullptr && scale == 1.0f && shift == 0.0f) return;
      passes(y, n, bias, scale, shift, [](float v) { return v; });
      break;
    case Epilogue::Kind::Relu:  // NaN stays, as in the unary kernel
      passes(y, n, bias, scale, shift, [](float v) { return v < 0 ? 0.0f : v; });
      break;
    case Epilogue::Kind::Clip:
      passes(y, n, bias, scale, shift, [a, b](float v) { return select(v < a, a, select(v > b, b, v)); });
      break;
    case Epilogue::Kind::HardSwish:
      passes(y, n, bias, scale, shift, [](float v) {
        const float t = v * static_cast<float>(1.0 / 6.0) + 0.5f;
        return v * select(t < 0.0f, 0.0f, select(t > 1.0f, 1.0f, t));
      });
      break;
    case Epilogue::Kind::HardSigmoid:
      passes(y, n, bias, scale, shift, [a, b](float v) {
        const float t = a * v + b;
        return select(t < 0.0f, 0.0f, select(t > 1.0f, 1.0f, t));
      });
      break;
  }
}

}  // namespace braid::detail
