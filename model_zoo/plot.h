// SVG line charts (no dependency): a training run's loss and accuracy curves as a picture a
// person can open in any browser.
#pragma once

#include <string>
#include <vector>

namespace braid::zoo {

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::string color;
};

/// Writes a chart with one panel per group of series (each panel has its own y axis).
void write_svg_chart(const std::string& path, const std::string& title,
                     const std::vector<std::pair<std::string, std::vector<Series>>>& panels);

}  // namespace braid::zoo
