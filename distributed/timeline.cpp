// Pictures of a pipeline step: a Chrome trace (one track per stage; opens in chrome://tracing and
// Perfetto) and an SVG Gantt chart in which the bubble is the blank space.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "braid/distributed/pipeline.h"
#include "braid/error.h"
#include "core/nice_ticks.h"

namespace braid::distributed {

namespace {

std::ofstream open_for_writing(const std::string& path, const char* what) {
  std::ofstream f(path);
  BRAID_CHECK(f.good(), what, ": cannot write '", path, "'");
  return f;
}

const char* colour(PipeAction::Kind k) {
  switch (k) {
    case PipeAction::Kind::Forward: return "#4c78a8";
    case PipeAction::Kind::Backward: return "#59a14f";
    case PipeAction::Kind::BackwardInput:
      return "#8cd17d";
    case PipeAction::Kind::BackwardWeight:
      return "#f28e2b";
    case PipeAction::Kind::Update: return "#b07aa1";
    default: return "#bab0ac";  // sends, receives and the waits inside them
  }
}

bool is_compute(PipeAction::Kind k) {
  return k == PipeAction::Kind::Forward || k == PipeAction::Kind::Backward || k == PipeAction::Kind::BackwardInput ||
         k == PipeAction::Kind::BackwardWeight;
}

}  // namespace

void PipeTimeline::write_chrome_trace(const std::string& path) const {
  auto f = open_for_writing(path, "write_chrome_trace");
  f << "{\"traceEvents\": [\n";
  for (int s = 0; s < stages; ++s)
    f << "  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " << s
      << ", \"args\": {\"name\": \"stage " << s << "\"}},\n";
  for (size_t i = 0; i < events.size(); ++i) {
    const PipeEvent& e = events[i];
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "  {\"name\": \"%s\", \"cat\": \"pipeline\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, "
                  "\"dur\": %.3f}%s\n",
                  e.action.str().c_str(), e.stage, e.start * 1e6, (e.end - e.start) * 1e6,
                  i + 1 < events.size() ? "," : "");
    f << buf;
  }
  f << "], \"displayTimeUnit\": \"ms\"}\n";
}

void PipeTimeline::write_gantt_svg(const std::string& path, const std::string& title) const {
  auto f = open_for_writing(path, "write_gantt_svg");
  const double left = 70, top = 40, row = 36, width = 900;
  // The time axis in ms at round ticks, widened to the last one (Note [Axis ticks]).
  const detail::AxisTicks ticks = detail::nice_ticks(0.0, makespan > 0 ? makespan * 1e3 : 1.0);
  const double scale = width / (ticks.hi * 1e-3);
  const double height = top + row * stages + 40;
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + 20 << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  f << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  char head[256];
  std::snprintf(head, sizeof head, "%s (makespan %.2f ms, bubble %.1f%%)", title.c_str(), makespan * 1e3,
                bubble_fraction * 100);
  f << "<text x=\"" << left << "\" y=\"20\" font-size=\"13\">" << head << "</text>\n";
  for (int s = 0; s < stages; ++s)
    f << "<text x=\"8\" y=\"" << top + row * s + row / 2 + 4 << "\">stage " << s << "</text>\n";
  for (const PipeEvent& e : events) {
    const bool compute = is_compute(e.action.kind);
    const double x = left + e.start * scale, w = std::max(0.5, (e.end - e.start) * scale);
    const double y = top + row * e.stage + (compute ? 3 : row / 2 - 3), h = compute ? row - 6 : 6;
    f << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << h << "\" fill=\""
      << colour(e.action.kind) << "\"><title>" << e.action.str() << "</title></rect>\n";
    if (compute && w > 14)
      f << "<text x=\"" << x + w / 2 << "\" y=\"" << y + row / 2 << "\" fill=\"white\" text-anchor=\"middle\">"
        << e.action.str() << "</text>\n";
  }
  const double axis = top + row * stages + 14;
  for (size_t i = 0; i < ticks.values.size(); ++i)
    f << "<text x=\"" << left + ticks.values[i] * 1e-3 * scale << "\" y=\"" << axis << "\" text-anchor=\"middle\">"
      << ticks.labels[i] << " ms</text>\n";
  f << "<text x=\"" << left << "\" y=\"" << axis + 16
    << "\">blue: forward, green: backward (light: input gradient, orange: weight gradient), grey: send/receive (and "
       "waiting for it), blank: idle</text>\n";
  f << "</svg>\n";
}

}  // namespace braid::distributed
