#pragma once
// Ablation grids: a base run config plus axes, expanded as a cartesian product minus `exclude`
// entries, in a canonical order; every cell resolved and validated before anything runs; identical
// resolved configs de-duplicated; a deterministic `--shard i/n` split; and a runner that goes
// through execute_run cell by cell, records failures and carries on. The file format is documented
// in configs/README.md.
//
//   {
//     "name": "main",                                   // stored as runs.grid (default: file stem)
//     "description": "free text",
//     "base": { ...a run config (harness/eval/run_config.h)... },
//     "axes": {
//       "method": ["full", {"name": "paged", "params": {"block_size": [16, 64]}}],
//       "model": ["stories260K"],
//       "protocol.window": [128, 256],
//       "seed": [0, 1]
//     },
//     "exclude": [{"method": "full", "protocol.window": 128}]
//   }
//
// Canonical order: axes sorted by key (byte order), the first key varying slowest, each axis's
// values in the order written; list-valued method params expand in place (sorted param names, the
// first varying slowest). Cells are numbered after exclusion and de-duplication; shard i of n holds
// the cells whose number is i modulo n.

#include <atomic>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/eval/runner.h"
#include "harness/store/results_db.h"

namespace kvb {

struct GridCell {
  size_t index = 0;              // position in the canonical, de-duplicated order
  std::string label;             // "method=paged(block_size=16) protocol.window=128"
  nlohmann::json assignment;     // axis key -> the value this cell takes (method values expanded)
  nlohmann::json resolved;       // resolve_run_config of the cell
  std::string config_hash;       // run_config_hash(resolved)
  int64_t expected_samples = 1;  // an upper bound, for progress (stream: max_windows; perf: batches)
};

struct GridPlan {
  std::string name;
  std::string description;
  std::vector<std::string> axis_keys;  // canonical (sorted) order
  size_t expanded = 0;                 // size of the cartesian product
  size_t excluded = 0;                 // dropped by `exclude`
  size_t duplicates = 0;               // dropped because an earlier cell resolved to the same config
  std::vector<GridCell> cells;         // canonical order
  std::vector<std::string> warnings;   // e.g. an exclude entry that matched nothing
};

struct GridOptions {
  std::vector<std::string> sets;  // --set a.b=c, applied to every cell after the axes
  std::string models_dir;         // checked: every cell's model must resolve
  std::string data_dir;           // checked: every stream cell's dataset must load
  bool check_inputs = true;       // check models and datasets exist (not just the config schema)
  std::string default_name;       // used when the grid has no "name"
  // The most cells a grid may expand to, counted (method parameter lists included) before anything
  // is expanded. Every cell is resolved and held before the first runs (about 10 KB and 0.1-0.2 ms
  // each), so three 100-value axes, a 1.3 KB file, would otherwise take minutes and gigabytes.
  size_t max_cells = 100000;
};

// Expands and validates a grid. Throws kvb::Error, naming the grid key or the first bad cell (its
// number and axis values) and how many others are bad, before anything is written anywhere.
GridPlan expand_grid(const nlohmann::json& grid, const GridOptions& options);
// load_config_file + expand_grid (the default name is the file's stem).
GridPlan load_grid(const std::string& path, GridOptions options);

// "--shard i/n": 0 <= i < n.
struct Shard {
  int64_t index = 0;
  int64_t count = 1;
};
Shard parse_shard(const std::string& text);  // throws kvb::Error for anything but "i/n"
std::vector<GridCell> shard_cells(const std::vector<GridCell>& cells, const Shard& shard);

// What the results DB already holds for a cell.
struct CellState {
  std::string status;  // "new", "done", "running" (interrupted), "failed"
  int64_t samples = 0;
  std::string error;
};
CellState cell_state(ResultsDb& db, const GridCell& cell);

// The outcome of one cell in run_grid.
struct CellResult {
  size_t index = 0;
  std::string label;
  std::string config_hash;
  std::string status;  // "ran", "skipped" (already done), "failed", "interrupted", "held"
  std::string error;   // "held": the process holding the run (RunLease::describe())
  int64_t run_id = 0;
  int64_t samples_computed = 0;
  double wall_s = 0;
};

struct GridSummary {
  std::vector<CellResult> cells;  // in the order run (cells not reached are absent)
  size_t ran = 0, skipped = 0, failed = 0, not_reached = 0;
  size_t held = 0;  // cells other live processes still held when the grid stopped (interrupted)
  bool disk_full = false;  // stopped because a write found no room (DiskFullError)
  bool interrupted = false;
  double wall_s = 0;
};

struct GridRunOptions {
  RunEnv env;                                // env.grid is set to the plan's name by run_grid
  const std::atomic<int>* stop = nullptr;    // non-zero: stop at the next sample boundary
  std::ostream* progress = nullptr;          // progress output (stderr); nullptr: none
  bool progress_bar = false;                 // a redrawn bar with ETA (terminal) vs plain lines
  bool verbose = false;                      // also pass execute_run's per-sample lines through
  int held_poll_ms = 1000;                   // how often cells other processes hold are re-checked
};

// Runs `cells` (a plan's cells or one shard of them) one by one with execute_run. A failing cell is
// recorded in the DB (status failed + error) and the grid carries on; a stop request ends the
// current cell at its next sample boundary (what was committed stays, the run is marked failed with
// "interrupted" and resumes on the next call) and returns with interrupted set. A cell whose run
// another live process holds (results_db.h, leases) is skipped and waited for after the others: it
// ends done by that process, or is taken over once that process is gone, so several processes on
// one grid and DB compute every cell once and each returns only when all of them are done.
GridSummary run_grid(const std::string& grid_name, const std::vector<GridCell>& cells, ResultsDb& db,
                     const GridRunOptions& options);

// Compact text of a method config: "snapkv(budget=0.25)"; params listed are those in `show` (all
// when `show` is null).
std::string method_label(const nlohmann::json& method, const nlohmann::json& show = nullptr);

}  // namespace kvb
