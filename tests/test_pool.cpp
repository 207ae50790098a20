// 2x2 max pooling of stride 2 (Note [2x2 max pooling in two passes] in src/backend/cpu/pool.cpp)
// against the definition, scanned here one window at a time in row-major order: the first largest
// tap wins a tie, the last NaN wins over numbers (PyTorch's rule). Values and the positions the
// gradient is routed to, on data with many ties and some NaN, for even and odd sizes, float32 (the
// two-pass kernel) and float64, and in ceil mode, where the last window of an odd side overhangs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "braid/braid.h"

namespace braid {
namespace {

struct Pooled {
  std::vector<double> values;
  std::vector<double> grad;  // the input's gradient for upstream gradient k + 1 at output k
};

Pooled by_definition(const std::vector<double>& x, int64_t planes, int64_t h, int64_t w, bool ceil_mode) {
  const int64_t oh = ceil_mode ? (h - 2 + 1) / 2 + 1 : (h - 2) / 2 + 1;
  const int64_t ow = ceil_mode ? (w - 2 + 1) / 2 + 1 : (w - 2) / 2 + 1;
  Pooled p;
  p.grad.assign(x.size(), 0.0);
  for (int64_t t = 0; t < planes; ++t)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        int64_t best_at = -1;
        double best = 0;
        for (int64_t dy = 0; dy < 2; ++dy)
          for (int64_t dx = 0; dx < 2; ++dx) {
            const int64_t y = 2 * oy + dy, c = 2 * ox + dx;
            if (y >= h || c >= w) continue;
            const int64_t at = (t * h + y) * w + c;
            if (best_at < 0 || x[static_cast<size_t>(at)] > best || std::isnan(x[static_cast<size_t>(at)])) {
              best = x[static_cast<size_t>(at)];
              best_at = at;
            }
          }
        p.values.push_back(best);
        p.grad[static_cast<size_t>(best_at)] += static_cast<double>(p.values.size());
      }
  return p;
}

TEST(MaxPool2x2, ValuesAndPositionsAreThoseOfTheDefinition) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 4, 28, 28}, {2, 5, 14, 14}, {2, 3, 7, 8},
                                                    {2, 3, 8, 7},   {1, 2, 7, 7},   {1, 1, 2, 2}};
  for (const DType dt : {kFloat32, kFloat64})
    for (const auto& s : shapes)
      for (const bool ceil_mode : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << shape_str(s) << " ceil " << ceil_mode);
        const int64_t n = s[0] * s[1] * s[2] * s[3];
        std::vector<double> xv(static_cast<size_t>(n));
        uint64_t state = 12345;
        for (int64_t i = 0; i < n; ++i) {  // values 0..3: most windows hold a tie
          state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          xv[static_cast<size_t>(i)] = static_cast<double>((state >> 33) % 4);
        }
        for (int64_t i = 5; i < n; i += 37) xv[static_cast<size_t>(i)] = NAN;
        const Pooled want = by_definition(xv, s[0] * s[1], s[2], s[3], ceil_mode);
        Tensor x = tensor(xv, s).to(dt).set_requires_grad();
        Tensor y = max_pool2d(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, ceil_mode);
        const std::vector<double> got = y.to_vector<double>();
        ASSERT_EQ(got.size(), want.values.size());
        for (size_t k = 0; k < got.size(); ++k) {
          if (std::isnan(want.values[k]))
            ASSERT_TRUE(std::isnan(got[k])) << k;
          else
            ASSERT_EQ(got[k], want.values[k]) << k;
        }
        std::vector<double> up(got.size());
        for (size_t k = 0; k < up.size(); ++k) up[k] = static_cast<double>(k + 1);
        y.backward(tensor(up, y.shape()).to(dt));
        EXPECT_EQ(x.grad().to_vector<double>(), want.grad);
      }
}

}  // namespace
}  // namespace braid
