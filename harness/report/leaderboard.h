#pragma once
// The leaderboard: per (model, dataset, protocol settings), the methods ranked by an accuracy or
// fidelity metric at their *measured* bytes per token, with paired bootstrap confidence intervals of
// the difference to the full-cache run on the same samples, the simulated flag, decode throughput
// from a matching perf run, and the Pareto frontiers (metric vs bytes/token, metric vs throughput).
// Rendered as Markdown, CSV, JSON or one self-contained HTML file with inline SVG charts.
//
// Each table also carries score-vs-measured-compression curves, one per method across its budgets,
// with two one-number summaries (largest compression within 1 point of the full cache, normalised
// area under the curve): leaderboard_curves.h defines both and the measured compression exactly.
//
// Tables: runs are grouped by their resolved config minus the method (and minus `label` and
// `threads`, which do not change results), so a table's rows differ only in the method and its
// parameters, and the baseline is the `full` run of the same group. Everything is deterministic
// under the bootstrap seed.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/report/leaderboard_curves.h"
#include "harness/store/results_db.h"

namespace kvb {

struct LeaderboardOptions {
  RunFilter filter;         // model / dataset / protocol / grid (status is ignored)
  std::string metric;       // ranking metric; "" = the protocol's default (stream: kl_mean)
  uint64_t seed = 0;        // bootstrap seed
  size_t n_resamples = 10000;
  double confidence = 0.95;
};

// A difference to the full-cache run: method - full, with its paired bootstrap interval.
struct DeltaCi {
  // "ok", "baseline" (the row is the full run), "no_baseline" (no full run in the group),
  // "no_common_samples", "not_per_sample" (the metric has no per-sample form), "n/a" (failed row)
  std::string status = "n/a";
  double estimate = 0, lo = 0, hi = 0;
  size_t n = 0;  // pairs
};

struct LeaderRow {
  int rank = 0;  // 1-based; 0 for failed runs and oracle rows (never ranked)
  // The paired interval of this row minus the first row holding the rank above it (ranking
  // metric, common samples) holds 0, or they share no sample: the data cannot order them, so the
  // row shares that rank (shown "=N").
  bool tied_above = false;
  std::string method;
  nlohmann::json params;  // resolved method params
  std::string label;      // compact: "snapkv(budget=0.25)"
  std::string config_hash;
  nlohmann::json config;  // the run's resolved config
  int64_t run_id = 0;
  std::string status;  // "done" or "failed"
  std::string error;
  std::map<std::string, double> metrics;  // run-level values
  double value = 0;                       // the ranking metric
  std::map<std::string, DeltaCi> deltas;  // per shown metric (the ranking one and the secondary ones)
  double bytes_per_token = 0, compression_ratio = 0;
  // bytes_per_token / compression_ratio are the 16-bit-deployment figures (bytes_per_token_16bit,
  // compression_ratio_16bit), not the run's own dtype's: set when every run of the table has them.
  bool bytes_16bit = false;
  std::optional<double> decode_tok_s;  // from this run (perf) or a matching perf run
  std::string perf_config_hash;        // the perf run it came from
  bool simulated = false;
  bool oracle = false;  // the method's caps say `oracle`: a bound, shown but never ranked
  // (value - floor) / (oracle - floor) at the row's budget (leaderboard_curves.h); NaN = n/a.
  double headroom = 0;
  bool pareto_memory = false, pareto_throughput = false;
};

struct LeaderTable {
  std::string model, dataset, protocol;
  nlohmann::json settings;  // the group's resolved config minus method/label/threads
  std::string settings_text;  // the settings worth showing: "window=256, max_windows=8"
  std::string metric, unit;   // ranking metric
  Direction direction = Direction::kLower;
  std::vector<std::string> secondary;  // other metrics shown with a delta (stream: ppl)
  std::string baseline_hash;           // the full run's config hash, "" when there is none
  size_t baseline_samples = 0;
  size_t incomplete_runs = 0;  // runs still running (not shown)
  bool has_throughput = false;
  bool bytes_16bit = false;  // memory columns at 16 bits (see LeaderRow::bytes_16bit)
  bool embedded_baseline = false;  // qa without a full run: paired with the answers stored per sample
  std::vector<LeaderRow> rows;  // ranked; failed runs last
  LeaderCurves curves;          // score vs measured compression, per method (leaderboard_curves.h)
};

struct Leaderboard {
  LeaderboardOptions options;
  std::string db_path;
  size_t runs_considered = 0;
  std::vector<LeaderTable> tables;
};

Leaderboard build_leaderboard(ResultsDb& db, const LeaderboardOptions& options);

std::string leaderboard_markdown(const Leaderboard& lb);
std::string leaderboard_csv(const Leaderboard& lb);
nlohmann::json leaderboard_json(const Leaderboard& lb);
std::string leaderboard_html(const Leaderboard& lb);  // one self-contained file, inline SVG

// Number formatting shared by the renderers (4 significant digits, scientific when tiny or huge).
std::string format_value(double v);
std::string format_delta(const DeltaCi& d);

}  // namespace kvb
