// A terminal progress bar for long loops: done/total, rate, ETA and a few named values, redrawn
// in place at most a few times a second (a plain line per update when output is not a terminal).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace braid::zoo {

class ProgressBar {
 public:
  /// unit names what is counted in the rate ("img" gives "1234 img/s").
  ProgressBar(std::string label, int64_t total, std::string unit);
  /// Sets the count to done with rate measured in units (e.g. images) processed so far.
  void update(int64_t done, int64_t units, const std::vector<std::pair<std::string, double>>& values);
  /// Draws the final state and ends the line.
  void finish(const std::vector<std::pair<std::string, double>>& values);
  /// Draws the state at done (a loop that stops early, e.g. on preemption) and ends the line.
  void stop(int64_t done, const std::vector<std::pair<std::string, double>>& values);

 private:
  void draw(bool final, const std::vector<std::pair<std::string, double>>& values);
  std::string label_, unit_;
  int64_t total_, done_ = 0, units_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace braid::zoo
