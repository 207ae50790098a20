// Tests of braid/data/progress.h: the progress line that braid-train and Python's
// braid.progress.Progress draw, on a fake clock, against lines written out by hand (the format that
// braid's Python training scripts printed before the two shared this implementation).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "braid/data/progress.h"

namespace braid {
namespace {

using data::ProgressBar;
using data::ProgressOutput;

struct Recorder {
  double t = 100;
  std::vector<std::string> writes;
  ProgressOutput output(bool tty) {
    return {[this](const std::string& s) { writes.push_back(s); }, tty};
  }
  std::function<double()> clock() {
    return [this] { return t; };
  }
};

TEST(ProgressBar, ALogGetsAPlainLineEveryTenSecondsAndTheTimeTakenLast) {
  Recorder r;
  ProgressBar bar("epoch 1/2", 40, "img/s", r.output(false), r.clock());
  r.t += 5;
  bar.update(10, 320, {{"loss", 1.5}});
  EXPECT_TRUE(r.writes.empty());  // under 10 s since the start
  r.t += 6;                       // 11 s: a quarter done leaves 33 s; 320 images in 11 s is 29 img/s
  bar.update(10, 320, {{"loss", 1.25}});
  ASSERT_EQ(r.writes.size(), 1u);
  EXPECT_EQ(r.writes[0], "epoch 1/2 [######..................]  25% 10/40 29 img/s eta 00:33 loss 1.2500\n");
  r.t += 20;
  bar.update(40, 1280, {});  // done: left to the final line
  EXPECT_EQ(r.writes.size(), 1u);
  r.t += 13;
  bar.finish({{"loss", 0.5}, {"acc", 0.75}});
  ASSERT_EQ(r.writes.size(), 2u);
  EXPECT_EQ(r.writes[1],
            "epoch 1/2 [########################] 100% 40/40 29 img/s took 00:44 loss 0.5000 acc 0.7500\n");
}

TEST(ProgressBar, ATerminalRedrawsInPlaceAndStopEndsTheLineEarly) {
  Recorder r;
  ProgressBar bar("fit", 4, "ex/s", r.output(true), r.clock());
  r.t += 0.1;
  bar.update(1, 8);
  EXPECT_TRUE(r.writes.empty());  // under 0.2 s
  r.t += 0.3;
  bar.update(2, 16, {{"acc", 0.5}});
  r.t += 0.4;
  bar.stop(3, {});
  ASSERT_EQ(r.writes.size(), 2u);
  EXPECT_EQ(r.writes[0], "\rfit [############............]  50% 2/4 40 ex/s eta 00:00 acc 0.5000\x1b[K");
  EXPECT_EQ(r.writes[1], "\rfit [##################......]  75% 3/4 20 ex/s took 00:00\n");
  // The ETA's minutes and seconds, and an empty total.
  EXPECT_EQ(bar.line(1, 100, 125.0, {}, false), "fit [######..................]  25% 1/4 1 ex/s eta 06:15");
  EXPECT_EQ(ProgressBar("none", 0, "img/s", r.output(false), r.clock()).line(0, 0, 0, {}, true),
            "none [########################] 100% 0/0 0 img/s took 00:00");
}

}  // namespace
}  // namespace braid
