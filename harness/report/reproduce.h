#pragma once
// `kvbench reproduce`: a paper's claims as predicates over the results store. A suite
// (configs/reproduce/<paper>.json, format in configs/README.md) lists the paper's claims; each
// names the quoted value and where in the paper it is, the cells that test it (a cell of a shipped
// grid picked by a filter on its resolved config, or an inline run config), and a predicate: a
// metric, a kind (the value of one run, the difference a - b or the ratio a / b of two), a
// direction and a threshold. The claim is evaluated on the paired samples of its two runs by the
// bootstrap of sample_stats.h and statistics.h, and gets one of four verdicts:
//
//   holds            the whole confidence interval is on the claim's side of the threshold
//   does not hold    the whole interval is on the other side
//   inconclusive     the interval spans the threshold, the samples are fewer than the claim's
//                    minimum, the metric has no interval, or a cell has not run yet
//   not runnable     the cells need a GPU (`"scale": "gpu"` under --scale cpu) or a model the
//                    machine lacks; the cells still ship so that a GPU run can evaluate them
//
// A deterministic protocol (serve: one exact simulation per run) gives an exact value: the verdict
// compares the value itself, and the report says the value is exact rather than sampled.
//
// Everything in a suite is validated before anything runs or is written: unknown keys, an unknown
// metric, method or grid, a filter that does not pick exactly one cell, and a check that cannot
// fail (both sides the same run, a ratio threshold <= 0) are refused with the file and the key
// named.

#include <atomic>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "harness/eval/grid.h"
#include "harness/store/results_db.h"

namespace kvb {

// One side of a claim: a cell of a grid (or an inline config wrapped in the suite's own grid).
struct ClaimSide {
  std::string grid;    // the grid the cell belongs to: a shipped grid's name or "reproduce_<paper>"
  std::string origin;  // where it came from, for the report: "configs/grids/main.json" or "inline"
  GridCell cell;       // resolved config, hash and label
};

enum class ClaimKind { kValue, kDifference, kRatio };
enum class ClaimDirection { kGreater, kLess };

// A predicate's metric "counter:<name>" reads the method counter <name> from each sample's
// "counters" object (retroinfer's attention_mass_recall, ttkv's cross_tier_bytes_per_step, ...):
// a per-sample value whose run value is the mean over the samples, bootstrapped like any per-sample
// metric. A sample without the counter does not pair; a run with none of it is inconclusive.
inline constexpr std::string_view kCounterPrefix = "counter:";
bool is_counter_metric(const std::string& metric);

struct ClaimPredicate {
  std::string metric;
  ClaimKind kind = ClaimKind::kDifference;
  ClaimDirection direction = ClaimDirection::kGreater;
  double threshold = 0;
  int64_t min_samples = 10;  // fewer paired samples: inconclusive
  double confidence = 0.95;
  size_t resamples = 10000;
  uint64_t seed = 0;
};

struct Claim {
  std::string id;
  std::string statement;    // the paper's claim in words
  std::string paper_value;  // the number the paper quotes, as quoted
  std::string source;       // where in the paper (section, table, figure, abstract)
  std::string scale = "cpu";
  std::string not_runnable;  // non-empty: why it cannot run on any machine kvbench has (a model)
  std::string caveat;        // how our setting differs from the paper's, and what that does
  bool has_predicate = false;
  ClaimPredicate predicate;
  std::vector<ClaimSide> sides;  // a, then b for a difference or ratio
};

struct ReproSuite {
  std::string paper;  // the file stem
  std::string path;
  std::string title;
  std::string reference;
  std::string setting;  // the paper's own setting (models, context, hardware)
  std::vector<Claim> claims;
};

struct ReproLoadOptions {
  std::string grids_dir = "configs/grids";  // where a side's "grid" is looked up (<name>.json)
  std::string models_dir, data_dir;
  bool check_inputs =
      true;  // models and data of cpu-scale cells must exist (gpu cells: schema only)
};

// Loads and validates one suite; throws kvb::Error naming the file and key on any problem.
ReproSuite load_reproduce_suite(const std::string& path, const ReproLoadOptions& options);
// Every suites_dir/*.json, sorted by paper name.
std::vector<std::string> list_reproduce_suites(const std::string& suites_dir);

enum class Verdict { kHolds, kDoesNotHold, kInconclusive, kNotRunnable };
const char* verdict_name(
    Verdict v);  // "holds", "does not hold", "inconclusive", "not runnable here"

struct ClaimResult {
  Verdict verdict = Verdict::kInconclusive;
  std::string why;  // the reason for inconclusive / not runnable; the basis otherwise
  bool have_value = false;
  bool exact = false;  // a deterministic value, no interval
  double estimate = 0, lo = 0, hi = 0;
  size_t n = 0;  // samples (pairs) the interval rests on
  double a_value = 0, b_value = 0;
  std::vector<std::string> scale_notes;       // model, context and device of each side's run
  std::map<std::string, double> cell_wall_s;  // config hash -> the run's wall time as stored
};

// The claim's cells that `scale` runs ("cpu": cpu-scale claims; "gpu": all; "gpu-only": the
// gpu-scale claims alone, for a device check whose machine should not spend its time on the CPU
// cells), not not_runnable.
bool claim_runs_at(const Claim& claim, const std::string& scale);

// Evaluates a claim against the store (no writes).
ClaimResult evaluate_claim(const Claim& claim, ResultsDb& db, const std::string& scale);

struct ReproRunOptions {
  std::string scale = "cpu";
  GridRunOptions grid;  // env, stop flag, progress
};
// Runs the cells of the suite's claims that `scale` runs, through run_grid (resumable: finished
// cells are skipped). Returns the summed grid summaries.
GridSummary run_reproduce_cells(const ReproSuite& suite, ResultsDb& db,
                                const ReproRunOptions& options);

struct SuiteReport {
  const ReproSuite* suite = nullptr;
  std::vector<ClaimResult> results;  // one per claim, in order
};

// The per-paper page (Markdown and self-contained HTML) and the summary table (papers x verdicts,
// Markdown, for the README's marked block). `command` is the reproduce command line shown.
std::string render_reproduce_markdown(const SuiteReport& report, const std::string& command);
std::string render_reproduce_html(const SuiteReport& report, const std::string& command);
// `link_dir` prefixes the links to the pages ("results/reproduce/" from the repository root).
std::string render_reproduce_summary(const std::vector<SuiteReport>& reports,
                                     const std::string& link_dir = "results/reproduce/");

// Replaces the text between the marker lines "<!-- reproduce-summary:begin -->" and
// "<!-- reproduce-summary:end -->" of `document`; throws kvb::Error when the markers are missing.
std::string replace_marked_block(const std::string& document, const std::string& block,
                                 const std::string& what);

}  // namespace kvb
