// Round axis ticks for braid's SVG pictures (the training curves, the pipeline's Gantt chart).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace braid::detail {

// Note [Axis ticks]
// An axis is labelled at round values, as plotting libraries label theirs: the step is 1, 2, 2.5 or
// 5 times a power of ten, the one that splits [lo, hi] into about `intervals` parts, the ticks are
// its multiples, and the axis is widened to the outer ticks, so a loss curve reads 0, 0.5, 1, 1.5
// rather than the data's own ends with four significant digits.
// Each tick is an integer times the step, so no error accumulates along the axis.
struct AxisTicks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> values;
  std::vector<std::string> labels;  // as short as the step allows: 0, 0.25, 0.5, 1 (never "-0")
};

inline AxisTicks nice_ticks(double lo, double hi, int intervals = 4) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1);
  const double raw = (hi - lo) / (intervals > 0 ? intervals : 4);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  const double nice = r <= 1.0 + 1e-9 ? 1 : r <= 2 + 1e-9 ? 2 : r <= 2.5 + 1e-9 ? 2.5 : r <= 5 + 1e-9 ? 5 : 10;
  AxisTicks t;
  t.step = nice * magnitude;
  const int64_t first = static_cast<int64_t>(std::floor(lo / t.step + 1e-9));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / t.step - 1e-9));
  t.lo = static_cast<double>(first) * t.step;
  t.hi = static_cast<double>(last) * t.step;
  int decimals = 0;  // the fewest that show the step exactly: 0.25 -> 2, 0.5 -> 1, 2 -> 0
  for (double scaled = t.step; decimals < 12 && std::fabs(scaled - std::round(scaled)) > 1e-6 * scaled; scaled *= 10)
    ++decimals;
  for (int64_t k = first; k <= last; ++k) {
    const double v = static_cast<double>(k) * t.step;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, k == 0 ? 0.0 : v);
    std::string label = buf;
    if (label.find('.') != std::string::npos) {  // 1.00 -> 1, 0.50 -> 0.5
      label.erase(label.find_last_not_of('0') + 1);
      if (label.back() == '.') label.pop_back();
    }
    t.values.push_back(v);
    t.labels.push_back(label);
  }
  return t;
}

}  // namespace braid::detail
