#include "harness/common/progress_eta.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace kvb {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = std::llround(s);
  char buf[48];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

double eta_seconds(double elapsed_s, double done, double total) {
  if (done >= total) return 0.0;
  if (!(done > 0)) return std::numeric_limits<double>::quiet_NaN();
  return elapsed_s / done * (total - done);
}

std::string elapsed_and_eta(double elapsed_s, double done, double total) {
  return format_duration(elapsed_s) + " elapsed, ETA " +
         format_duration(eta_seconds(elapsed_s, done, total));
}

ProgressMeter::ProgressMeter(std::string what, int64_t total, std::string unit, Sink sink,
                             double first_after_s, double every_s, Clock clock)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      sink_(std::move(sink)),
      first_after_s_(first_after_s),
      every_s_(every_s),
      clock_(std::move(clock)) {
  t0_ = now();
  last_ = t0_;
}

double ProgressMeter::now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string ProgressMeter::line(int64_t done) const {
  const double elapsed = now() - t0_;
  const int pct = total_ > 0 ? static_cast<int>(100 * std::min(done, total_) / total_) : 100;
  return what_ + " " + std::to_string(done) + "/" + std::to_string(total_) + " " + unit_ + " (" +
         std::to_string(pct) + "%), " +
         elapsed_and_eta(elapsed, static_cast<double>(done), static_cast<double>(total_));
}

bool ProgressMeter::update(int64_t done) {
  if (!sink_ || done >= total_) return false;
  const double t = now();
  if (t - t0_ < first_after_s_ || (printed_ && t - last_ < every_s_)) return false;
  sink_(line(done));
  printed_ = true;
  last_ = t;
  return true;
}

void ProgressMeter::finish(int64_t done) {
  if (!sink_ || !printed_) return;
  sink_(what_ + " " + std::to_string(done) + "/" + std::to_string(total_) + " " + unit_ +
        " done in " + format_duration(now() - t0_));
}

}  // namespace kvb
