// `kvbench run` end to end: the stream protocol's fidelity numbers for the full cache, skipping finished
// work, strict config validation (exit 2, nothing written), and SIGKILL + re-run consistency.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/kv/method_registry.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::string write_config(const std::string& dir, const std::string& name, const std::string& text) {
  std::string p = dir + "/" + name;
  std::ofstream(p) << text;
  return p;
}

std::string stream_config(const std::string& method, int windows, int window = 128) {
  return "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"" + method +
         "\", \"protocol\": {\"name\": \"stream\", \"dataset\": \"tinystories-valid-sample\", "
         "\"window\": " + std::to_string(window) + ", \"max_windows\": " + std::to_string(windows) + "}}";
}

using test::metric;

TEST(Run, StreamFullHasZeroKlAndThePerplexityOfScore) {
  std::string dir = test::make_temp_dir("run");
  nlohmann::json cfg = resolve_run_config(nlohmann::json::parse(stream_config("full", 3)));
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  env.cache_dir = dir + "/cache";
  RunOutcome o = execute_run(cfg, db, env);
  EXPECT_EQ(o.samples_total, 3);
  EXPECT_EQ(metric(o.metrics, "kl_mean"), 0.0);
  EXPECT_EQ(metric(o.metrics, "kl_max"), 0.0);
  EXPECT_EQ(metric(o.metrics, "top1_agreement"), 1.0);
  // Perplexity equals teacher-forced scoring of the same tokens.
  std::string hash;
  auto windows = stream_windows(test::models_dir() + "/stories260K/tok512.model", cfg["protocol"],
                                test::data_dir(), &hash);
  auto model = load_model(test::models_dir() + "/stories260K");
  double nll = 0;
  int64_t n = 0;
  for (const auto& w : windows) {
    Engine e(model, make_default_kv(*model));
    auto r = e.score(w.tokens);
    nll += r.nll_sum;
    n += r.n();
  }
  EXPECT_NEAR(metric(o.metrics, "ppl"), std::exp(nll / n), 1e-4);
  EXPECT_EQ(metric(o.metrics, "tokens_scored"), n);
  EXPECT_NEAR(metric(o.metrics, "compression_ratio"), 1.0, 1e-12);
  EXPECT_EQ(metric(o.metrics, "simulated"), 0.0);
}

TEST(Run, RerunSkipsAndWritesNoDuplicates) {
  std::string dir = test::make_temp_dir("rerun");
  std::string cfg = write_config(dir, "c.json", stream_config("paged", 2, 64));
  const std::string args = "run -q -c " + cfg + " --db " + dir + "/db.sqlite --data-dir " + test::data_dir();
  auto r1 = test::run_kvbench(args);
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto j1 = nlohmann::json::parse(r1.out);
  EXPECT_FALSE(j1["skipped"].get<bool>());
  auto r2 = test::run_kvbench(args);
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  auto j2 = nlohmann::json::parse(r2.out);
  EXPECT_TRUE(j2["skipped"].get<bool>());
  EXPECT_EQ(j1["metrics"]["ppl"], j2["metrics"]["ppl"]);
  ResultsDb db(dir + "/db.sqlite");
  ASSERT_EQ(db.list_runs().size(), 1u);
  EXPECT_EQ(db.sample_count(db.list_runs()[0].id), 2);
}

TEST(Run, ThreadsOptionIsTheThreadsOverride) {
  std::string dir = test::make_temp_dir("threads");
  std::string cfg = write_config(dir, "c.json", stream_config("paged", 1, 32));
  const std::string db = dir + "/db.sqlite";
  const std::string common = "run -q -c " + cfg + " --db " + db + " --data-dir " + test::data_dir();
  auto by_option = test::run_kvbench(common + " --threads 1");
  ASSERT_EQ(by_option.exit_code, 0) << by_option.err;
  auto j1 = nlohmann::json::parse(by_option.out);
  EXPECT_FALSE(j1["skipped"].get<bool>());
  // The same config, hence the same hash: the run is found done.
  auto by_set = test::run_kvbench(common + " --set threads=1");
  ASSERT_EQ(by_set.exit_code, 0) << by_set.err;
  auto j2 = nlohmann::json::parse(by_set.out);
  EXPECT_EQ(j2["config_hash"], j1["config_hash"]);
  EXPECT_TRUE(j2["skipped"].get<bool>());
  ResultsDb store(db);
  ASSERT_EQ(store.list_runs().size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(store.list_runs()[0].config_json)["threads"], 1);
  // threads is hashed: another count is another run.
  auto other = test::run_kvbench(common + " --threads 2");
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(nlohmann::json::parse(other.out)["config_hash"], j1["config_hash"]);

  auto both = test::run_kvbench(common + " --threads 2 --set threads=1");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--threads and --set threads=1"), std::string::npos) << both.err;
  auto bad = test::run_kvbench(common + " --threads 5000");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("threads"), std::string::npos) << bad.err;
  EXPECT_EQ(ResultsDb(db).list_runs().size(), 2u);  // refusals write nothing

  // grid: --threads reaches every cell the same way.
  std::string grid = write_config(dir, "g.json",
                                  "{\"name\": \"t\", \"base\": " + stream_config("paged", 1, 32) +
                                      ", \"axes\": {\"seed\": [0]}}");
  auto g1 = test::run_kvbench("grid -n --json -c " + grid + " --threads 1 --db " + dir + "/g.sqlite");
  ASSERT_EQ(g1.exit_code, 0) << g1.err;
  auto g2 = test::run_kvbench("grid -n --json -c " + grid + " --set threads=1 --db " + dir + "/g.sqlite");
  ASSERT_EQ(g2.exit_code, 0) << g2.err;
  EXPECT_EQ(nlohmann::json::parse(g1.out)["cells"][0]["config_hash"], j1["config_hash"]);
  EXPECT_EQ(nlohmann::json::parse(g2.out)["cells"][0]["config_hash"], j1["config_hash"]);
}

TEST(Run, MalformedConfigsFailWithOneLineAndWriteNothing) {
  std::string dir = test::make_temp_dir("bad");
  const std::string good = stream_config("paged", 1, 32);
  struct Case {
    std::string text, needle;
  };
  std::vector<Case> cases = {
      {"{\"model\": ", "not valid JSON"},
      {"{\"modle\": \"stories260K\", \"method\": \"paged\", \"protocol\": \"stream\"}", "did you mean 'model'"},
      {"{\"method\": \"paged\", \"protocol\": {\"name\": \"stream\", \"window\": \"big\"}}", "config.protocol.window: expected an integer"},
      {"{\"method\": \"paged\", \"protocol\": {\"name\": \"stream\", \"window\": 1}}", "outside the allowed range"},
      {"{\"method\": \"pagd\", \"protocol\": \"stream\"}", "did you mean 'paged'"},
      {"{\"method\": {\"name\": \"paged\", \"params\": {\"block_size\": -3}}, \"protocol\": \"stream\"}", "method paged.block_size"},
      {"{\"method\": \"paged\", \"protocol\": \"strem\"}", "did you mean 'stream'"},
      {"{\"method\": \"paged\", \"protocol\": \"stream\", \"dtype\": \"fp8\"}", "config.dtype"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string cfg = write_config(dir, "c" + std::to_string(i) + ".json", cases[i].text);
    auto r = test::run_kvbench("run -c " + cfg + " --db " + dir + "/db" + std::to_string(i) + ".sqlite");
    EXPECT_EQ(r.exit_code, 2) << cases[i].text << "\n" << r.err;
    EXPECT_NE(r.err.find(cases[i].needle), std::string::npos) << "want '" << cases[i].needle << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(std::ifstream(dir + "/db" + std::to_string(i) + ".sqlite").good()) << "database written for case " << i;
  }
  // --set overrides are validated the same way.
  std::string cfg = write_config(dir, "good.json", good);
  auto r = test::run_kvbench("run -c " + cfg + " --set method.params.blok_size=8 --db " + dir + "/dbs.sqlite");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'block_size'"), std::string::npos) << r.err;
}

// Checks that depend on the model or the data (not only on the config) still run before the run row
// exists: each bad config exits 2 with one line naming the input and leaves no run in the database.
TEST(Run, RunTimeInputErrorsExitTwoAndLeaveNoRunRow) {
  std::string dir = test::make_temp_dir("norow");
  const std::string model = "\"model\": \"" + test::models_dir() + "/stories260K\"";
  const std::string empty_jsonl = write_config(dir, "empty.jsonl", "\n\n");
  const std::string bad_jsonl = write_config(dir, "bad.jsonl", "{\"not\": \"longbench\"}\n[1, 2]\n");
  const std::string tasks = test::fixtures_dir() + "/longbench/tasks.json";
  struct Case {
    std::string protocol, needle;
  };
  std::vector<Case> cases = {
      {R"({"name": "perf", "context": 32, "decode_tokens": 4, "batch_sizes": "1,x"})", "config.protocol.batch_sizes: 'x'"},
      {R"({"name": "perf", "context": 32, "decode_tokens": 4, "batch_sizes": "1,,2"})", "config.protocol.batch_sizes"},
      {R"({"name": "stream", "dataset": "no-such-corpus", "window": 64})", "no-such-corpus"},
      {R"({"name": "stream", "window": 1024})", "config.protocol.window: 1024 tokens is longer than the model's context of 512"},
      {R"({"name": "probe", "window": 600})", "config.protocol.window: 600"},
      {R"({"name": "qa", "source": "synthetic", "task": "passkey", "length": 256, "depths": "0,1.5"})", "config.protocol.depths: '1.5'"},
      {R"({"name": "qa", "source": "synthetic", "task": "passkey", "length": 0})", "passkey"},
      {R"({"name": "qa", "source": "synthetic", "task": "passkey", "length": 32})", "passkey"},
      {R"({"name": "qa", "source": "longbench", "length": 0, "path": ")" + empty_jsonl + R"(", "tasks": ")" + tasks + R"("})", "yields no samples"},
      {R"({"name": "qa", "source": "longbench", "length": 0, "skip_bad_lines": true, "path": ")" + bad_jsonl + R"(", "tasks": ")" + tasks + R"("})", "yields no samples"},
      // stories260K's context is 512 tokens: a longer synthetic prompt, or LongBench cap, is refused.
      {R"({"name": "qa", "source": "synthetic", "task": "passkey", "length": 600})", "config.protocol.length: 600 tokens (the prompt, question included) is longer than the context of"},
      {R"({"name": "qa", "source": "longbench", "length": 513, "path": ")" + empty_jsonl + R"(", "tasks": ")" + tasks + R"("})", "config.protocol.length: a context cap of 513 tokens"},
      // The JSONL source truncates to `length`: never by a default.
      {R"({"name": "qa", "source": "longbench", "path": ")" + empty_jsonl + R"(", "tasks": ")" + tasks + R"("})", "config.protocol.length: source 'longbench' needs it given"},
      // A parameter of another source is refused, not ignored.
      {R"({"name": "qa", "source": "longbench", "length": 0, "depths": "0.5", "path": ")" + empty_jsonl + R"(", "tasks": ")" + tasks + R"("})", "config.protocol.depths: applies to source 'synthetic' only, not to source 'longbench'"},
      {R"({"name": "qa", "source": "synthetic", "task": "passkey", "length": 256, "path": "x.jsonl"})", "config.protocol.path: applies to source 'longbench' only"},
      {R"({"name": "qa", "source": "recall", "length": 256})", "config.protocol.length: source 'recall' does not read it"},
      {R"({"name": "serve", "target": "llama-9z", "probe_lengths": "16,32"})", "config.protocol.target"},
      {R"({"name": "serve", "trace": "/nonexistent/trace.jsonl", "probe_lengths": "16,32"})", "/nonexistent/trace.jsonl"},
      {R"({"name": "serve", "trace": "generated", "probe_lengths": "16,4000"})", "config.protocol.probe_lengths: '4000'"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string cfg = write_config(dir, "c" + std::to_string(i) + ".json",
                                         "{" + model + ", \"method\": \"paged\", \"protocol\": " + cases[i].protocol + "}");
    const std::string db = dir + "/db" + std::to_string(i) + ".sqlite";
    auto r = test::run_kvbench("run -q -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
    EXPECT_EQ(r.exit_code, 2) << cases[i].protocol << "\n" << r.err;
    EXPECT_NE(r.err.find(cases[i].needle), std::string::npos) << "want '" << cases[i].needle << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    if (std::ifstream(db).good()) {
      ResultsDb d(db);
      EXPECT_EQ(d.list_runs().size(), 0u) << "a run row was written for case " << i << ": " << cases[i].protocol;
    }
  }
}

TEST(Run, InMemoryDatabaseIsRefused) {
  std::string dir = test::make_temp_dir("memdb");
  std::string cfg = write_config(dir, "c.json", stream_config("paged", 1, 32));
  for (const std::string db : {"':memory:'", "''"}) {
    auto r = test::run_kvbench("run -q -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
    EXPECT_EQ(r.exit_code, 2) << db << ": " << r.err;
    EXPECT_NE(r.err.find("--db"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("results would be lost"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(Run, SigkillThenRerunCompletesWithoutDuplicatesOrPartialRows) {
  std::string dir = test::make_temp_dir("kill");
  const int kWindows = 24;
  std::string cfg = write_config(dir, "c.json", stream_config("paged", kWindows, 256));
  const std::string db_path = dir + "/db.sqlite";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl(test::kvbench_binary().c_str(), "kvbench", "run", "-c", cfg.c_str(), "--db",
          db_path.c_str(), "--data-dir", test::data_dir().c_str(), (char*)nullptr);
    _exit(127);
  }
  // Kill it once a few samples have landed (poll the database read-only through WAL).
  int64_t seen = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!std::ifstream(db_path).good()) continue;
    try {
      ResultsDb db(db_path);
      auto runs = db.list_runs();
      if (!runs.empty()) seen = db.sample_count(runs[0].id);
    } catch (const std::exception&) {
    }
    if (seen >= 3) break;
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run finished before it could be killed";
  {
    ResultsDb db(db_path);
    auto runs = db.list_runs();
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].status, RunStatus::kRunning);
    const int64_t k = db.sample_count(runs[0].id);
    EXPECT_GE(k, 3);
    EXPECT_LT(k, kWindows);
    for (const auto& s : db.samples(runs[0].id)) EXPECT_NO_THROW(nlohmann::json::parse(s.output_json));
    EXPECT_TRUE(db.metrics(runs[0].id).empty());  // no half-finished run-level rows
  }
  auto r = test::run_kvbench("run -q -c " + cfg + " --db " + db_path + " --data-dir " + test::data_dir());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_LT(j["samples_computed"].get<int64_t>(), kWindows);  // resumed, not redone
  ResultsDb db(db_path);
  auto runs = db.list_runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, RunStatus::kDone);
  auto samples = db.samples(runs[0].id);
  ASSERT_EQ(samples.size(), static_cast<size_t>(kWindows));
  for (int i = 0; i < kWindows; ++i) EXPECT_EQ(samples[i].index, i);
  EXPECT_FALSE(db.metrics(runs[0].id).empty());
}

TEST(Run, PerfProtocolRecordsThroughputAndLedger) {
  std::string dir = test::make_temp_dir("perf");
  nlohmann::json cfg = resolve_run_config(nlohmann::json::parse(
      "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"static\", "
      "\"protocol\": {\"name\": \"perf\", \"context\": 64, \"decode_tokens\": 8, \"batch_sizes\": \"1,4\", \"repeats\": 2}}"));
  ResultsDb db(dir + "/db.sqlite");
  RunOutcome o = execute_run(cfg, db, RunEnv{});
  EXPECT_EQ(o.samples_total, 2);
  EXPECT_GT(metric(o.metrics, "decode_tok_s"), 0.0);
  EXPECT_GT(metric(o.metrics, "decode_tok_s_b4"), 0.0);
  EXPECT_GT(metric(o.metrics, "ttft_ms"), 0.0);
  // static reserves the model's 512 positions per sequence while 72 are used.
  EXPECT_GT(metric(o.metrics, "device_reserved_bytes"), metric(o.metrics, "device_payload_bytes"));
}

}  // namespace
}  // namespace kvb

namespace kvb {
namespace {

TEST(Probe, ExactStoresHaveZeroErrorAndEveryLayerIsReported) {
  std::string dir = test::make_temp_dir("probe");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  for (const char* method : {"paged", "static"}) {
    nlohmann::json cfg = resolve_run_config(nlohmann::json::parse(
        "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"" + method +
        "\", \"protocol\": {\"name\": \"probe\", \"window\": 96, \"max_windows\": 1, \"prefill_tokens\": 16, \"every\": 8}}"));
    RunOutcome o = execute_run(cfg, db, env);
    int per_layer = 0;
    for (const auto& m : o.metrics) {
      if (m.layer) ++per_layer;
      EXPECT_LT(m.value, 1e-5) << method << " " << m.name;
    }
    EXPECT_EQ(per_layer, 4 * 5) << method;  // 4 measures x 5 layers
  }
}

// Eviction stores hold the step's own token while it attends (the exact reference does too, once
// attend has written it): the probe compares them index for index. A 50% budget loses attention
// mass (TV > 0) but keeps the kept keys exact (key error 0).
TEST(Probe, EvictionMethodsAreComparedIndexForIndex) {
  std::string dir = test::make_temp_dir("probe-evict");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  for (const char* method : {"h2o", "snapkv", "kvreviver"}) {
    nlohmann::json cfg = resolve_run_config(nlohmann::json::parse(
        "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": {\"name\": \"" + method +
        "\", \"params\": {\"budget\": 0.5" + (std::string(method) == "kvreviver" ? ", \"measure_error\": true" : "") + "}}, \"protocol\": {\"name\": \"probe\", \"window\": 96, "
        "\"max_windows\": 1, \"prefill_tokens\": 32, \"every\": 8}}"));
    RunOutcome o = execute_run(cfg, db, env);
    double tv = 0, kerr = 0;
    for (const auto& m : o.metrics) {
      if (m.name == "attn_prob_tv" && !m.layer) tv = m.value;
      if (m.name == "key_rel_err" && !m.layer) kerr = m.value;
    }
    EXPECT_GT(tv, 1e-3) << method;
    if (std::string(method) != "kvreviver") {
      EXPECT_LT(kerr, 1e-6) << method;
    }
  }
}

}  // namespace
}  // namespace kvb
