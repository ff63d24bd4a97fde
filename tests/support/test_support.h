#pragma once
// Shared helpers for the LibTorch-side tests: where the real models and data are, running the CLI.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/store/results_db.h"

namespace kvb {
class Model;
}

namespace kvb::test {

std::string models_dir();      // $KVBENCH_MODELS (set by ctest), else ../shared/models
std::string data_dir();        // $KVBENCH_DATA, else ../shared/data
std::string fixtures_dir();    // tests/fixtures in the source tree
std::string kvbench_binary();  // $KVB_BINARY (set by ctest)

// A fresh empty directory under the system temp dir, removed by the OS eventually.
std::string make_temp_dir(const std::string& tag);
// The message of the kvb::Error `f` throws; "" when it throws none.
std::string error_of(const std::function<void()>& f);

// A run-level metric (no layer) by name; a test failure and NaN when the run has none.
double metric(const std::vector<Metric>& metrics, const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `kvbench <args>` through /bin/sh (args are passed as given: quote them yourself).
CommandResult run_kvbench(const std::string& args);

// stories260K from models_dir(), loaded once per process (CPU fp32).
std::shared_ptr<Model> stories260k();
// Greedy continuation of `prompt` by `m` with the full cache: `n` tokens, or up to one of `stop`
// (none: never stops early).
std::vector<int64_t> greedy(const std::shared_ptr<Model>& m, const std::vector<int64_t>& prompt,
                            int64_t n, std::vector<int64_t> stop = {});
// The first `count` TinyStories validation windows of `window` tokens (stories260K's tokenizer), as
// the stream protocol cuts them.
std::vector<std::vector<int64_t>> story_windows(int window, int count);

// Mean KL(full || method) per scored token over the first `windows` TinyStories windows of 256
// tokens on stories260K (the stream protocol, `prefill_tokens` prefilled), and the last window's
// counters when `counters` is given.
double mean_story_kl(const std::string& method, const nlohmann::json& params, int windows = 2,
                     int64_t prefill_tokens = 1, std::map<std::string, double>* counters = nullptr);

// Parameters with which a registered method runs on stories260K without outside artifacts: {} for
// every method that runs on its defaults. `dms` needs a trained adapter for its learned decisions
// (tests/methods/test_dms.cpp trains and loads one); the registry-wide contracts run its store with
// every token evicted once out of a 64-token window; `kv_packet` runs with wrap=none (its trained
// header and trailer are a file; test_kv_packet trains one); duo_attention and qfilters calibrate
// on a few short samples, in memory.
nlohmann::json runnable_params(const std::string& method);

}  // namespace kvb::test
