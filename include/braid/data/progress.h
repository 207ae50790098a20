// The one-line progress report of a training loop: done/total, a bar, the rate, the ETA (the time
// taken once final) and a few named values. On a terminal the line is redrawn in place at most 5
// times a second; in a log (a batch job's output) a plain line is written every 10 s, so a Slurm
// job's output stays readable. braid-train draws it on stdout, Python's braid.progress.Progress on
// a Python stream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace braid::data {

/// Where a progress line goes. An empty write means stdout (flushed after each line), and tty then
/// whether stdout is a terminal.
struct ProgressOutput {
  /// Receives the text of each draw: "\r", the line and "\x1b[K" on a terminal, the line and "\n"
  /// in a log and for the final line.
  std::function<void(const std::string&)> write;
  /// A terminal: the line is redrawn in place.
  bool tty = false;
};

class ProgressBar {
 public:
  using Values = std::vector<std::pair<std::string, double>>;
  /// unit names the rate ("img/s" gives "1234 img/s"). clock gives seconds from any fixed point
  /// (empty: std::chrono::steady_clock's).
  ProgressBar(std::string label, int64_t total, std::string unit = "img/s", ProgressOutput stream = {},
              std::function<double()> clock = {});
  /// The loop has done `done` of total steps and `items` items (images): draws when the period
  /// since the last draw has passed, except at done >= total, which the final line shows. final
  /// always draws and ends the line, with the time taken in place of the ETA.
  void update(int64_t done, int64_t items, const Values& metrics = {}, bool final = false);
  /// The final line at total, with the items of the last update.
  void finish(const Values& metrics);
  /// The final line at done (a loop that stops early, e.g. on preemption).
  void stop(int64_t done, const Values& metrics);
  /// The line for done steps and items after elapsed seconds, without a terminal's control
  /// characters: "epoch 1/2 [######..................]  25% 10/40 29 img/s eta 00:33 loss 1.2500".
  std::string line(int64_t done, int64_t items, double elapsed, const Values& metrics, bool final) const;

 private:
  double now() const;
  std::string label_, unit_;
  int64_t total_, items_ = 0;
  ProgressOutput out_;
  std::function<double()> clock_;
  double start_, last_draw_;
};

}  // namespace braid::data
