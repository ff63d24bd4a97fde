#pragma once
// Where a run finds what lies outside its config: the models and data folders, the baseline cache,
// the source tree it records as provenance, the grid it belongs to, and where progress lines go.

#include <functional>
#include <string>

namespace kvb {

struct RunEnv {
  std::string models_dir;                       // --models-dir
  std::string data_dir;                         // --data-dir
  std::string cache_dir;                        // baseline cache (default: <db dir>/cache)
  std::string source_dir;                       // for provenance (git commit)
  std::string grid;                             // grid name when part of one
  // >= 0: compute only the samples below this index and return with the run unfinished (a grid's
  // sample windows: every cell's first samples, then the next ones, so that the cells of a window
  // share its context prefills); -1: the whole run.
  int64_t sample_limit = -1;
  std::function<void(const std::string&)> log;  // progress lines (stderr)
};

}  // namespace kvb
