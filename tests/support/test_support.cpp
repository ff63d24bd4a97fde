#include "tests/support/test_support.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/model/model.h"

namespace kvb::test {

static std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

// Child processes (kvbench, scripts) find models and data through the same variables: fill them in
// from the configure-time defaults unless the environment already has them.
static const bool kEnvDefaults = [] {
  setenv("KVBENCH_MODELS", KVB_TEST_MODELS_DEFAULT, /*overwrite=*/0);
  setenv("KVBENCH_DATA", KVB_TEST_DATA_DEFAULT, 0);
  setenv("KVB_BINARY", KVB_BINARY_DEFAULT, 0);
  return true;
}();

// The environment wins; the defaults are the paths CMake saw at configure time.
std::string models_dir() { return env_or("KVBENCH_MODELS", KVB_TEST_MODELS_DEFAULT); }
std::string data_dir() { return env_or("KVBENCH_DATA", KVB_TEST_DATA_DEFAULT); }
std::string fixtures_dir() { return KVB_TEST_FIXTURES; }
std::string kvbench_binary() { return env_or("KVB_BINARY", KVB_BINARY_DEFAULT); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string make_temp_dir(const std::string& tag) {
  std::string templ = "/tmp/kvb_" + tag + "_XXXXXX";
  char* p = mkdtemp(templ.data());
  if (!p) throw std::runtime_error("mkdtemp failed for " + templ);
  return templ;
}

static std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult run_kvbench(const std::string& args) {
  std::string dir = make_temp_dir("cli");
  std::string out = dir + "/out.txt", err = dir + "/err.txt";
  std::string cmd = kvbench_binary() + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

std::vector<int64_t> greedy(const std::shared_ptr<Model>& m, const std::vector<int64_t>& prompt,
                            int64_t n, std::vector<int64_t> stop) {
  Engine e(m, make_default_kv(*m));
  GenerateOptions g;
  g.max_new_tokens = n;
  g.stop_ids = stop.empty() ? std::vector<int64_t>{-1} : stop;  // {-1}: never stop early
  return e.generate({prompt}, g).tokens[0];
}

std::shared_ptr<Model> stories260k() {
  static std::shared_ptr<Model> m = load_model(models_dir() + "/stories260K");
  return m;
}

std::vector<std::vector<int64_t>> story_windows(int window, int count) {
  nlohmann::json cfg = resolve_run_config(nlohmann::json::parse(
      "{\"model\": \"stories260K\", \"method\": \"full\", \"protocol\": {\"name\": \"stream\", "
      "\"dataset\": \"tinystories-valid-sample\", \"window\": " +
      std::to_string(window) + ", \"max_windows\": " + std::to_string(count) + "}}"));
  std::string hash;
  auto ws = stream_windows(models_dir() + "/stories260K/tok512.model", cfg["protocol"], data_dir(),
                           &hash);
  std::vector<std::vector<int64_t>> out;
  for (auto& w : ws) out.push_back(w.tokens);
  return out;
}

double mean_story_kl(const std::string& method, const nlohmann::json& params, int windows,
                     int64_t prefill_tokens, std::map<std::string, double>* counters) {
  StreamOptions so;
  so.prefill_tokens = prefill_tokens;
  double sum = 0;
  int64_t n = 0;
  for (const auto& w : story_windows(256, windows)) {
    StreamSampleResult r = run_stream_sample(stories260k(), method, params, w, so);
    for (float k : r.kl) sum += k;
    n += static_cast<int64_t>(r.kl.size());
    if (counters) *counters = r.counters;
  }
  return sum / static_cast<double>(n);
}

nlohmann::json runnable_params(const std::string& method) {
  if (method == "dms") return {{"decisions", "evict_all"}, {"window", 64}};
  if (method == "kv_packet") return {{"wrap", "none"}};
  // Calibrating methods: a small calibration kept in memory, so the tests write nothing outside
  // their temporary directories.
  // duo_attention's sinks and window (kvpress's 128 + 256) would cover the whole 256-token stream.
  if (method == "duo_attention")
    return {{"cache_dir", ""},
            {"calib_samples", 4},
            {"calib_tokens", 128},
            {"sink_size", 16},
            {"recent_size", 64}};
  if (method == "qfilters" || method == "kvzap")
    return {{"cache_dir", ""}, {"calib_samples", 4}, {"calib_tokens", 128}};
  // oracle_quant tunes on the eval's own windows, which its params name: the registry contract's
  // stream (one TinyStories window of 256 tokens, 128 prefilled); at 2 bits the search is KV2.
  if (method == "oracle_quant")
    return {{"cache_dir", ""},
            {"bits", 2},
            {"eval_window", 256},
            {"eval_max_windows", 1},
            {"eval_prefill_tokens", 128}};
  return nlohmann::json::object();
}

double metric(const std::vector<Metric>& metrics, const std::string& name) {
  for (const auto& m : metrics)
    if (m.name == name && !m.layer) return m.value;
  ADD_FAILURE() << "no metric " << name;
  return NAN;
}

}  // namespace kvb::test
