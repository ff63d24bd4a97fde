#pragma once
// Score-vs-compression curves for the leaderboard (kvpress-style): within one leaderboard table, a
// method's runs that differ only in `budget` form one curve, and each curve gets two one-number
// summaries. The definitions, which any other implementation must mirror exactly:
//
// Measured compression of a row (a fraction of the cache removed, kvpress's "compression ratio"):
//     compression = 1 - bytes_per_token(row) / reference_bytes
// where bytes_per_token is the row's measured physical bytes per cached position (the 16-bit figure
// when the table shows 16-bit bytes, see LeaderRow::bytes_16bit) and reference_bytes is the
// bytes_per_token of the table's finished full-cache run; a table without one uses the row's own
// uncompressed baseline, bytes_per_token * compression_ratio (so compression = 1 - 1/compression_ratio).
// 0 = the full cache, 0.75 = a quarter of its bytes; negative when a method stores more than the
// full cache.
//
// Tolerance ("1 point"): 0.01 for a metric whose unit is "fraction" (one percentage point of
// accuracy; the unit of the metric table, else of the stored metric, else of the protocol's
// per-sample definition), else 1% of |full-cache score|.
//
// max_compression_within_1pt: the largest measured compression among the curve's points whose score
// is no worse than the full cache's by more than the tolerance (>= full - tol when higher is better,
// <= full + tol when lower is better); NaN when no point qualifies or the table has no full run.
//
// auc (normalised area under the score-vs-compression curve): the curve is the piecewise-linear
// interpolation through the full-cache point (0, full score) and the curve's points sorted by
// compression; auc = (1/X) * integral_0^X score(c) dc, the mean score over compression 0..X, where
// X (LeaderCurves::auc_range) is the smallest, over the table's swept curves (two or more points,
// the full cache's excluded), of each curve's largest compression, so every curve is integrated
// over the same measured range without extrapolation. NaN when the table has no full run, no swept
// curve, X <= 0, or the curve's largest compression is below X (a single-point method short of it).
// The full cache's own auc is its score.
//
// Headroom (LeaderRow::headroom), per finished row of a deployable method that has a `budget`:
//     headroom = (score - floor) / (oracle - floor)
// the share of the oracle's gain over the cheapest baseline that the method captures (1 = as good
// as the oracle, 0 = no better than the floor, negative = worse than the floor, above 1 = better
// than the oracle, which bounds its own criterion (attention mass, exact logits), not every
// metric; the same formula for lower-is-better metrics, where both differences are negative).
// "The same budget" is the same parameter, not the same bytes: a method that compresses as it
// decodes (streaming_llm) holds fewer bytes at it than one that compresses the prompt once. "At the same budget" means
// the same resolved `budget` value and `budget_unit`, in the same table. Quantizers have no
// `budget`: their rows match at the same KVTuner equivalent bits, the mean over layers of
// (bK + bV) / 2 from the params (equivalent_bits_of: oracle_quant's `bits` budget; kivi's preset or
// k_bits/v_bits; pertoken's k_bits/v_bits; kvtuner's inline `pairs`), whatever their group size,
// residual or mode (their measured bytes differ: the memory columns show it).
//   oracle: the best score (by the metric's direction) among the table's finished rows whose
//           method's caps say `oracle` (MethodCaps::oracle) at the row's budget;
//   floor:  the cheapest baseline, the table's finished `streaming_llm` row at the row's budget
//           (kHeadroomFloorMethod: keep the sinks and the newest tokens, no scoring at all); when
//           several differ in other parameters, the worst-scoring one. At equivalent bits, the
//           `pertoken` row there (kHeadroomQuantFloorMethod: round-to-nearest per token, no
//           residual, no search).
// NaN (shown "n/a") for failed rows, oracle rows, rows without a budget (the full cache), and when
// the oracle row or the floor is missing, a score is not finite, or oracle == floor. The floor
// row's own headroom is 0. Point values only (no interval).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvb {

// A run's metric by name; NaN when the run did not record it.
double metric_or_nan(const std::map<std::string, double>& m, const std::string& name);

struct LeaderTable;

struct CurvePoint {
  double budget = 0;       // the swept `budget` parameter; NaN for a method without one
  double compression = 0;  // measured, as defined above
  double value = 0;        // the table's ranking metric
  std::string label, config_hash;
  int64_t run_id = 0;
  nlohmann::json config;  // the run's resolved config (reproduces the point with `kvbench run`)
};

struct MethodCurve {
  std::string method;      // registry name
  std::string name;        // "snapkv", or "snapkv(codec=kivi-2, codec_residual=32)"
  nlohmann::json params;   // the curve's fixed params (the resolved params minus `budget`)
  bool simulated = false;  // any point simulated
  bool baseline = false;   // the full cache's own single point
  std::vector<CurvePoint> points;  // by compression, ascending
  double max_compression_within_1pt = 0;
  double auc = 0;
};

struct LeaderCurves {
  double reference_bytes = 0;  // the full run's bytes/token; NaN without one
  double full_value = 0;       // the full run's score; NaN without one
  bool fraction_metric = false;  // the metric is a fraction: the tolerance is one point (0.01)
  double tolerance = 0;          // "1 point"
  double auc_range = 0;        // X above
  std::vector<MethodCurve> curves;  // the full cache first, then by name
};

// The curves of a built table (rows, metric, unit and direction set). Failed rows and rows without a
// finite score or bytes per token are left out.
LeaderCurves build_curves(const LeaderTable& table);

// The two summaries, exposed for tests and other implementations: `points` sorted by compression.
double curve_auc(double full_value, const std::vector<CurvePoint>& points, double range);
double max_compression_within(double full_value, double tolerance, bool higher_is_better,
                              const std::vector<CurvePoint>& points);

// The baseline method whose row at a budget is the headroom floor (see above).
extern const char* const kHeadroomFloorMethod;
// The floor at equivalent bits (quantizers), and a row's equivalent bits from its method and
// params; NaN for a method that is not matched by bits (see above).
extern const char* const kHeadroomQuantFloorMethod;
double equivalent_bits_of(const std::string& method, const nlohmann::json& params);

// (value - floor) / (oracle - floor); NaN when any is not finite or oracle == floor.
double headroom_value(double value, double floor, double oracle);

// Sets LeaderRow::headroom for every row of a built table (rows, metric, direction, and each row's
// `oracle` flag set), as defined above.
void set_headroom(LeaderTable& table);

// `cat > run.json <<'EOF' ... EOF` then `kvbench run -c run.json`: reproduces one run exactly.
std::string reproduce_command(const nlohmann::json& config);

}  // namespace kvb
