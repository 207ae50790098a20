// ProgressBar drawing. Rate is units per wall second since the start; ETA extrapolates it.
#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace braid::zoo {

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), tty_(isatty(fileno(stdout))),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void ProgressBar::update(int64_t done, int64_t units, const std::vector<std::pair<std::string, double>>& values) {
  done_ = done;
  units_ = units;
  auto now = std::chrono::steady_clock::now();
  // A terminal redraws 5 times a second; a log file gets a line every 10 seconds.
  auto period = tty_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(10000);
  if (now - last_draw_ < period && done < total_) return;
  last_draw_ = now;
  draw(false, values);
}

void ProgressBar::finish(const std::vector<std::pair<std::string, double>>& values) {
  done_ = total_;
  draw(true, values);
}

void ProgressBar::stop(int64_t done, const std::vector<std::pair<std::string, double>>& values) {
  done_ = done;
  draw(true, values);
}

void ProgressBar::draw(bool final, const std::vector<std::pair<std::string, double>>& values) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? static_cast<double>(units_) / elapsed : 0;
  double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1;
  double eta = done_ > 0 ? elapsed * (1 - frac) / frac : 0;
  constexpr int kWidth = 24;
  int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::printf("%s%s [%s] %3d%% %lld/%lld %.0f %s/s %s %02d:%02d", tty_ ? "\r" : "", label_.c_str(), bar.c_str(),
              static_cast<int>(frac * 100), static_cast<long long>(done_), static_cast<long long>(total_), rate,
              unit_.c_str(), final ? "took" : "eta", static_cast<int>((final ? elapsed : eta) / 60),
              static_cast<int>(final ? elapsed : eta) % 60);
  for (const auto& [name, v] : values) std::printf(" %s %.4f", name.c_str(), v);
  std::printf("%s", final || !tty_ ? "\n" : "\x1b[K");
  std::fflush(stdout);
}

}  // namespace braid::zoo
