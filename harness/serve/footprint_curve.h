#pragma once
// What a KV method holds for one sequence as a function of its length, interpolated from measured
// points (the serve protocol measures them with the method's real store on the run's model). Bytes
// between points are linear; beyond the last point they follow the last segment's slope, which is
// right for both shapes methods have: proportional (quantization: bytes = ratio x tokens) and
// saturating (eviction to a fixed budget: the slope falls to ~0 once the budget is reached).

#include <cstdint>
#include <vector>

namespace kvb {

struct FootprintPoint {
  int64_t tokens = 0;       // sequence length when measured (> 0)
  double device_bytes = 0;  // physical bytes on the device (payload, metadata, indices)
  double host_bytes = 0;    // bytes held off the device (host or remote tiers)
  // What a decode step costs beyond "read every device byte": the share of the device bytes it
  // reads (read-time selection) and the bytes it pulls from the host (tiering), per token.
  double read_fraction = 1;
  double h2d_bytes_per_token = 0;
};

class FootprintCurve {
 public:
  // Points with increasing, distinct token counts (sorted here); at least one. The curve passes
  // through (0, 0). Throws kvb::Error on negative bytes or non-positive token counts.
  explicit FootprintCurve(std::vector<FootprintPoint> points);
  // An uncompressed cache: bytes_per_token x tokens on the device.
  static FootprintCurve proportional(double device_bytes_per_token);

  double device_bytes(int64_t tokens) const;
  double host_bytes(int64_t tokens) const;
  // Device bytes one decode step reads: device_bytes x the read fraction (interpolated, held at the
  // ends, within [0, 1]).
  double decode_read_bytes(int64_t tokens) const;
  // Host-to-device bytes per decoded token (interpolated, the last segment extrapolated, >= 0).
  double h2d_bytes_per_token(int64_t tokens) const;
  // Every byte scaled (the run's model -> a target model's shapes: target / run bytes per token).
  FootprintCurve scaled(double factor) const;
  // Device bytes per token at the last measured point: the average rate a prefix block costs.
  double device_bytes_per_token() const;
  // True when bytes grow in proportion to length (within `tolerance` of the average rate at every
  // point): then a prefix's compressed KV is the same whoever reuses it.
  bool proportional_in_length(double tolerance = 0.05) const;
  const std::vector<FootprintPoint>& points() const { return points_; }

 private:
  double interpolate(int64_t tokens, bool device) const;
  // Piecewise linear through the points' values (not through the origin).
  double through_points(int64_t tokens, double FootprintPoint::*field, bool extrapolate) const;
  std::vector<FootprintPoint> points_;
};

}  // namespace kvb
