// The one ETA estimate and duration format behind every progress line, and the throttled meter that
// long prefills print through: exact text at given (injected) times.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/common/progress_eta.h"

namespace kvb {
namespace {

TEST(ProgressEta, DurationsReadAsSecondsMinutesOrHours) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(59.6), "1m00s");  // rounded to the second first
  EXPECT_EQ(format_duration(187), "3m07s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600 + 5 * 60 + 59), "1h05m");
  EXPECT_EQ(format_duration(100 * 3600), "100h00m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
  EXPECT_EQ(format_duration(INFINITY), "?");
}

TEST(ProgressEta, EtaIsTheAverageRateSoFarTimesWhatIsLeft) {
  EXPECT_DOUBLE_EQ(eta_seconds(30, 25, 100), 90);  // 1.2 s a unit, 75 left
  EXPECT_DOUBLE_EQ(eta_seconds(10, 1, 3), 20);
  EXPECT_DOUBLE_EQ(eta_seconds(10, 100, 100), 0);
  EXPECT_DOUBLE_EQ(eta_seconds(10, 120, 100), 0);    // more done than planned: nothing left
  EXPECT_TRUE(std::isnan(eta_seconds(10, 0, 100)));  // no rate yet
  EXPECT_EQ(elapsed_and_eta(30, 25, 100), "30s elapsed, ETA 1m30s");
  EXPECT_EQ(elapsed_and_eta(5, 0, 100), "5s elapsed, ETA ?");
}

struct FakeClock {
  double t = 100;  // any origin: the meter measures from its construction
  ProgressMeter::Clock fn() {
    return [this] { return t; };
  }
};

TEST(ProgressEta, MeterIsSilentForShortLoopsThenPrintsEveryIntervalWithAnEta) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressMeter m(
      "prefill", 4000, "tokens", [&](const std::string& s) { lines.push_back(s); },
      /*first_after_s=*/2, /*every_s=*/10, clock.fn());
  clock.t = 101;  // 1 s in: too early
  EXPECT_FALSE(m.update(500));
  clock.t = 104;  // 4 s in, 1000 done: 4 ms a token, 3000 left
  EXPECT_TRUE(m.update(1000));
  clock.t = 110;  // 6 s after the last line: within the interval
  EXPECT_FALSE(m.update(2000));
  clock.t = 114;  // 14 s in, 3500 done: 4 ms a token, 500 left
  EXPECT_TRUE(m.update(3500));
  clock.t = 116;
  EXPECT_FALSE(m.update(4000));  // the end is finish's line
  m.finish(4000);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "prefill 1000/4000 tokens (25%), 4s elapsed, ETA 12s");
  EXPECT_EQ(lines[1], "prefill 3500/4000 tokens (87%), 14s elapsed, ETA 2s");
  EXPECT_EQ(lines[2], "prefill 4000/4000 tokens done in 16s");
}

TEST(ProgressEta, AMeterThatNeverPrintedEndsSilently) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressMeter m(
      "prefill", 100, "tokens", [&](const std::string& s) { lines.push_back(s); }, 2, 10,
      clock.fn());
  clock.t = 101.5;
  m.update(50);
  m.finish(100);
  EXPECT_TRUE(lines.empty());
  EXPECT_FALSE(m.printed());
  // No sink: nothing to print to, never an error.
  ProgressMeter silent("x", 10, "steps", nullptr, 0, 0, clock.fn());
  clock.t = 200;
  EXPECT_FALSE(silent.update(5));
  silent.finish(10);
}

}  // namespace
}  // namespace kvb
