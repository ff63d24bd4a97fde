#include "harness/serve/footprint_curve.h"

#include <algorithm>
#include <cmath>

#include "harness/common/error.h"

namespace kvb {

FootprintCurve::FootprintCurve(std::vector<FootprintPoint> points) : points_(std::move(points)) {
  KVB_CHECK(!points_.empty(), "footprint curve: no measured points");
  std::sort(points_.begin(), points_.end(),
            [](const FootprintPoint& a, const FootprintPoint& b) { return a.tokens < b.tokens; });
  for (size_t i = 0; i < points_.size(); ++i) {
    const FootprintPoint& p = points_[i];
    KVB_CHECK(p.tokens > 0, "footprint curve: point at ", p.tokens, " tokens (must be > 0)");
    KVB_CHECK(p.device_bytes >= 0 && p.host_bytes >= 0 && std::isfinite(p.device_bytes) &&
                  std::isfinite(p.host_bytes),
              "footprint curve: point at ", p.tokens, " tokens has bytes ", p.device_bytes, " / ",
              p.host_bytes);
    KVB_CHECK(i == 0 || points_[i - 1].tokens < p.tokens, "footprint curve: two points at ",
              p.tokens, " tokens");
    KVB_CHECK(p.read_fraction >= 0 && p.read_fraction <= 1 && p.h2d_bytes_per_token >= 0,
              "footprint curve: point at ", p.tokens, " tokens has read fraction ", p.read_fraction,
              " and ", p.h2d_bytes_per_token, " host-to-device bytes per token");
  }
}

FootprintCurve FootprintCurve::proportional(double device_bytes_per_token) {
  return FootprintCurve({{1024, device_bytes_per_token * 1024, 0}});
}

double FootprintCurve::interpolate(int64_t tokens, bool device) const {
  if (tokens <= 0) return 0;
  auto bytes = [&](const FootprintPoint& p) { return device ? p.device_bytes : p.host_bytes; };
  // Segments: (0,0)-p0, p0-p1, ...; past the end the last segment continues.
  double t0 = 0, b0 = 0;
  for (size_t i = 0; i < points_.size(); ++i) {
    const double t1 = static_cast<double>(points_[i].tokens), b1 = bytes(points_[i]);
    if (tokens <= points_[i].tokens || i + 1 == points_.size()) {
      const double v = b0 + (b1 - b0) * (static_cast<double>(tokens) - t0) / (t1 - t0);
      return std::max(0.0, v);
    }
    t0 = t1;
    b0 = b1;
  }
  return 0;  // unreachable
}

double FootprintCurve::through_points(int64_t tokens, double FootprintPoint::*field,
                                      bool extrapolate) const {
  const auto& p = points_;
  if (p.size() == 1 || tokens <= p.front().tokens) return p.front().*field;
  for (size_t i = 1; i < p.size(); ++i) {
    if (tokens <= p[i].tokens || i + 1 == p.size()) {
      if (tokens > p[i].tokens && !extrapolate) return p[i].*field;
      const double t0 = static_cast<double>(p[i - 1].tokens), t1 = static_cast<double>(p[i].tokens);
      const double v0 = p[i - 1].*field, v1 = p[i].*field;
      return v0 + (v1 - v0) * (static_cast<double>(tokens) - t0) / (t1 - t0);
    }
  }
  return p.back().*field;  // unreachable
}

double FootprintCurve::decode_read_bytes(int64_t tokens) const {
  const double f =
      std::clamp(through_points(tokens, &FootprintPoint::read_fraction, false), 0.0, 1.0);
  return device_bytes(tokens) * f;
}

double FootprintCurve::h2d_bytes_per_token(int64_t tokens) const {
  return std::max(0.0, through_points(tokens, &FootprintPoint::h2d_bytes_per_token, true));
}

double FootprintCurve::device_bytes(int64_t tokens) const { return interpolate(tokens, true); }
double FootprintCurve::host_bytes(int64_t tokens) const { return interpolate(tokens, false); }

FootprintCurve FootprintCurve::scaled(double factor) const {
  KVB_CHECK(factor > 0 && std::isfinite(factor), "footprint curve: scale factor ", factor);
  std::vector<FootprintPoint> p = points_;
  for (auto& x : p) {
    x.device_bytes *= factor;
    x.host_bytes *= factor;
    x.h2d_bytes_per_token *= factor;
  }
  return FootprintCurve(std::move(p));
}

double FootprintCurve::device_bytes_per_token() const {
  const FootprintPoint& p = points_.back();
  return p.device_bytes / static_cast<double>(p.tokens);
}

bool FootprintCurve::proportional_in_length(double tolerance) const {
  const double rate = device_bytes_per_token();
  for (const auto& p : points_) {
    const double r = p.device_bytes / static_cast<double>(p.tokens);
    if (std::abs(r - rate) > tolerance * std::max(rate, 1e-30)) return false;
  }
  return true;
}

}  // namespace kvb
