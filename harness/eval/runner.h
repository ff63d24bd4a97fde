#pragma once
// Executes one resolved run config against a results database: skips finished runs, resumes at the
// sample level, writes each sample in its own transaction, records failures, and finishes the run
// with its metrics in one transaction — so a killed process leaves a consistent database. The same
// loop serves every protocol (protocol.h): the protocol plans the samples and computes each one.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/eval/run_env.h"
#include "harness/store/results_db.h"

namespace kvb {

struct RunOutcome {
  std::string config_hash;
  int64_t run_id = 0;
  bool skipped = false;          // already done before this call
  int64_t samples_total = 0;
  int64_t samples_computed = 0;  // by this call (the rest were resumed from the database)
  bool unfinished = false;       // stopped at RunEnv::sample_limit: the run stays open
  std::vector<Metric> metrics;
};

// Runs `resolved` (from resolve_run_config). Throws kvb::Error on failure after recording it.
RunOutcome execute_run(const nlohmann::json& resolved, ResultsDb& db, const RunEnv& env);

// The token windows a stream run scores (deterministic; each with a content key).
struct StreamWindow {
  std::vector<int64_t> tokens;
  std::string key;
};
std::vector<StreamWindow> stream_windows(const std::string& tokenizer_path,
                                         const nlohmann::json& protocol,
                                         const std::string& data_dir, std::string* dataset_hash);

}  // namespace kvb
