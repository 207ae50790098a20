// ProgressBar drawing. The rate is items per second since the start; the ETA extrapolates it.
#include "braid/data/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace braid::data {

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, ProgressOutput stream,
                         std::function<double()> clock)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      out_(std::move(stream)),
      clock_(std::move(clock)) {
  if (!out_.write) {
    out_.write = [](const std::string& text) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    };
    out_.tty = isatty(fileno(stdout)) != 0;
  }
  start_ = last_draw_ = now();
}

double ProgressBar::now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProgressBar::update(int64_t done, int64_t items, const Values& metrics, bool final) {
  items_ = items;
  double t = now();
  // A terminal redraws 5 times a second; a log gets a line every 10 seconds.
  if (!final && (done >= total_ || t - last_draw_ < (out_.tty ? 0.2 : 10.0))) return;
  last_draw_ = t;
  std::string text = line(done, items, t - start_, metrics, final);
  out_.write((out_.tty ? "\r" : "") + text + (final || !out_.tty ? "\n" : "\x1b[K"));
}

void ProgressBar::finish(const Values& metrics) { update(total_, items_, metrics, true); }

void ProgressBar::stop(int64_t done, const Values& metrics) { update(done, items_, metrics, true); }

std::string ProgressBar::line(int64_t done, int64_t items, double elapsed, const Values& metrics, bool final) const {
  double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1;
  double rate = elapsed > 0 ? static_cast<double>(items) / elapsed : 0;
  int shown = static_cast<int>(final ? elapsed : frac > 0 ? elapsed * (1 - frac) / frac : 0);
  constexpr int kWidth = 24;
  std::string bar(static_cast<size_t>(std::max(0, std::min(kWidth, static_cast<int>(frac * kWidth)))), '#');
  bar.resize(kWidth, '.');
  char buf[160];
  std::snprintf(buf, sizeof buf, " [%s] %3d%% %lld/%lld %.0f ", bar.c_str(), static_cast<int>(frac * 100),
                static_cast<long long>(done), static_cast<long long>(total_), rate);
  std::string text = label_ + buf + unit_;
  std::snprintf(buf, sizeof buf, " %s %02d:%02d", final ? "took" : "eta", shown / 60, shown % 60);
  text += buf;
  for (const auto& [name, v] : metrics) {
    std::snprintf(buf, sizeof buf, " %.4f", v);
    text += " " + name + buf;
  }
  return text;
}

}  // namespace braid::data
