// SVG chart writer: panels side by side, each with axes, ticks, a legend and polyline series.
#include "plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "braid/error.h"
#include "core/nice_ticks.h"

namespace braid::zoo {

namespace {
constexpr double kPanelW = 460, kPanelH = 320, kMargin = 55;
}  // namespace

void write_svg_chart(const std::string& path, const std::string& title,
                     const std::vector<std::pair<std::string, std::vector<Series>>>& panels) {
  std::ostringstream svg;
  const double width = kPanelW * static_cast<double>(panels.size()), height = kPanelH + 40;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << width / 2 << "' y='20' text-anchor='middle' font-size='15'>" << title << "</text>\n";
  for (size_t p = 0; p < panels.size(); ++p) {
    const auto& [ylabel, series] = panels[p];
    double x0 = kPanelW * static_cast<double>(p) + kMargin, y0 = 40, w = kPanelW - kMargin - 20, h = kPanelH - kMargin;
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    for (const Series& s : series)
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.y[i])) continue;
        xmin = std::min(xmin, s.x[i]), xmax = std::max(xmax, s.x[i]);
        ymin = std::min(ymin, s.y[i]), ymax = std::max(ymax, s.y[i]);
      }
    if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
    const double pad = (ymax - ymin) * 0.05;  // the curves clear the frame
    ymin -= pad, ymax += pad;
    // Round ticks, the axes widened to the outer ones (Note [Axis ticks]).
    const detail::AxisTicks xt = detail::nice_ticks(xmin, xmax), yt = detail::nice_ticks(ymin, ymax);
    xmin = xt.lo, xmax = xt.hi, ymin = yt.lo, ymax = yt.hi;
    auto X = [&](double v) { return x0 + (v - xmin) / (xmax - xmin) * w; };
    auto Y = [&](double v) { return y0 + h - (v - ymin) / (ymax - ymin) * h; };
    svg << "<rect x='" << x0 << "' y='" << y0 << "' width='" << w << "' height='" << h
        << "' fill='none' stroke='#444'/>\n";
    for (size_t t = 0; t < yt.values.size(); ++t)
      svg << "<line x1='" << x0 << "' x2='" << x0 + w << "' y1='" << Y(yt.values[t]) << "' y2='" << Y(yt.values[t])
          << "' stroke='#ddd'/><text x='" << x0 - 5 << "' y='" << Y(yt.values[t]) + 4 << "' text-anchor='end'>"
          << yt.labels[t] << "</text>\n";
    for (size_t t = 0; t < xt.values.size(); ++t)
      svg << "<text x='" << X(xt.values[t]) << "' y='" << y0 + h + 16 << "' text-anchor='middle'>" << xt.labels[t]
          << "</text>\n";
    svg << "<text x='" << x0 + w / 2 << "' y='" << y0 + h + 34 << "' text-anchor='middle'>epoch</text>\n"
        << "<text x='" << x0 - 42 << "' y='" << y0 + h / 2 << "' text-anchor='middle' transform='rotate(-90 "
        << x0 - 42 << " " << y0 + h / 2 << ")'>" << ylabel << "</text>\n";
    for (size_t k = 0; k < series.size(); ++k) {
      const Series& s = series[k];
      svg << "<polyline fill='none' stroke-width='1.8' stroke='" << s.color << "' points='";
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i])) svg << X(s.x[i]) << "," << Y(s.y[i]) << " ";
      svg << "'/>\n<text x='" << x0 + w - 8 << "' y='" << y0 + 16 + 15 * static_cast<double>(k)
          << "' text-anchor='end' fill='" << s.color << "'>" << s.name << "</text>\n";
    }
  }
  svg << "</svg>\n";
  std::ofstream f(path);
  BRAID_CHECK(f.good(), "write_svg_chart: cannot open '", path, "' for writing");
  f << svg.str();
  BRAID_CHECK(f.good(), "write_svg_chart: writing '", path, "' failed");
}

}  // namespace braid::zoo
