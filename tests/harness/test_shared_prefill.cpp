// Shared context prefill: a recorded full-cache prefill replayed into a store leaves it where its own
// prefill would (the next steps' logits are bitwise the same), a store that evicts during the
// prefill is told where it differs, and qa runs answer alike on the shared and the per-cell path.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>

#include "harness/engine/engine.h"
#include "harness/engine/prefill_replay.h"
#include "harness/eval/grid.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/shared_prefill.h"
#include "harness/kv/method_registry.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> store(const std::shared_ptr<Model>& m, const std::string& method,
                               const nlohmann::json& params = nlohmann::json::object()) {
  CacheContext ctx{m->config, m->device, m->dtype, m};
  return MethodRegistry::instance().create(method, ctx, params);
}

std::vector<int64_t> prompt(int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(1 + (i * 37) % 500);
  return ids;
}

std::shared_ptr<PrefillRecording> record(const std::shared_ptr<Model>& m,
                                         const std::vector<int64_t>& ids, EngineOptions eo) {
  auto rec = std::make_unique<RecordingKvCache>(store(m, "full"));
  RecordingKvCache* r = rec.get();
  Engine e(m, std::move(rec), eo);
  r->start();
  const int64_t seq = e.new_sequence();
  at::Tensor logits = e.prefill({seq}, {ids}, nullptr, false);
  return r->finish(logits, 0.0);
}

// Greedy steps from a context's last logits; every step's logits, concatenated.
at::Tensor continue_greedy(Engine& e, int64_t seq, at::Tensor logits, int steps) {
  std::vector<at::Tensor> all = {logits};
  for (int i = 0; i < steps; ++i) {
    const int64_t t = logits[0].argmax().item<int64_t>();
    logits = e.decode({seq}, {t});
    all.push_back(logits);
  }
  return at::cat(all);
}

TEST(SharedPrefill, AReplayedStoreContinuesBitwiseAsAfterItsOwnPrefill) {
  auto m = test::stories260k();
  EngineOptions eo;
  eo.prefill_chunk = 16;  // several chunks
  const std::vector<int64_t> ids = prompt(70);
  const auto rec = record(m, ids, eo);
  EXPECT_EQ(rec->steps.size(), 5u);
  EXPECT_EQ(rec->tokens, 70);
  for (const char* method : {"full", "snapkv"}) {
    nlohmann::json params = nlohmann::json::object();
    if (std::string(method) == "snapkv") params = {{"budget", 0.5}};
    Engine own(m, store(m, method, params), eo);
    const int64_t s_own = own.new_sequence();
    at::Tensor l_own = own.prefill({s_own}, {ids});
    Engine shared(m, store(m, method, params), eo);
    ReplayResult r = replay_prefill(shared, *rec);
    ASSERT_GE(r.seq, 0) << method << ": " << r.mismatch;
    EXPECT_EQ(shared.position(r.seq), 70);
    shared.kv().end_prefill(r.seq);
    EXPECT_EQ(shared.kv().seq_len(r.seq), own.kv().seq_len(s_own)) << method;
    EXPECT_TRUE(at::equal(continue_greedy(own, s_own, l_own, 6),
                          continue_greedy(shared, r.seq, r.logits, 6)))
        << method;
  }
}

TEST(SharedPrefill, AStoreThatEvictsDuringThePrefillIsToldWhereAndHoldsNothing) {
  auto m = test::stories260k();
  EngineOptions eo;
  eo.prefill_chunk = 16;
  const auto rec = record(m, prompt(70), eo);
  Engine e(m, store(m, "streaming_llm", {{"budget", 0.25}, {"schedule", "continuous"}}), eo);
  ReplayResult r = replay_prefill(e, *rec);
  EXPECT_EQ(r.seq, -1);
  EXPECT_NE(r.mismatch.find("attends differently from the full cache"), std::string::npos)
      << r.mismatch;
  EXPECT_EQ(e.kv().footprint().tokens_held, 0);
}

// qa runs of several methods on one context set: every answer, score, ledger and counter is the
// same on the shared path as on the per-cell path; the stores that reproduce the prefill took the
// shared one, the one that evicts during it did not and says why.
TEST(SharedPrefill, QaRunsAnswerAlikeOnTheSharedAndThePerCellPath) {
  const std::string proto = R"({"name": "qa", "source": "recall", "num_samples": 3, "prefill_chunk": 16})";
  const std::vector<std::pair<std::string, nlohmann::json>> methods = {
      {"full", nlohmann::json::object()},
      {"snapkv", {{"budget", 0.5}}},
      {"knorm", {{"budget", 0.5}}},
      {"streaming_llm", {{"budget", 0.5}, {"schedule", "continuous"}}}};
  std::map<std::string, std::vector<nlohmann::json>> by_path[2];
  for (int shared = 1; shared >= 0; --shared) {
    SharedPrefills::instance().clear();
    SharedPrefills::instance().set_budget(shared ? (int64_t{256} << 20) : 0);
    const std::string dir = test::make_temp_dir("shared_prefill");
    ResultsDb db(dir + "/db.sqlite");
    RunEnv env;
    env.data_dir = test::data_dir();
    env.cache_dir = dir + "/cache";
    env.grid = "g";
    for (const auto& [method, params] : methods) {
      nlohmann::json cfg = {{"model", test::models_dir() + "/stories260K"},
                            {"method", {{"name", method}, {"params", params}}},
                            {"protocol", nlohmann::json::parse(proto)}};
      RunOutcome o = execute_run(resolve_run_config(cfg), db, env);
      for (const auto& row : db.samples(o.run_id))
        by_path[shared][method].push_back(nlohmann::json::parse(row.output_json));
    }
  }
  SharedPrefills::instance().clear();
  SharedPrefills::instance().set_budget(int64_t{2048} << 20);
  for (const auto& [method, params] : methods) {
    const auto& a = by_path[1][method];
    const auto& b = by_path[0][method];
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (size_t i = 0; i < a.size(); ++i) {
      for (const char* field : {"items", "ledger", "counters", "context_tokens"})
        EXPECT_EQ(a[i][field], b[i][field]) << method << " sample " << i << " " << field;
      EXPECT_EQ(b[i]["prefill"]["path"], "own");
      EXPECT_EQ(b[i]["prefill"]["why"], "");
      const std::string path = a[i]["prefill"]["path"];
      if (method == "full") EXPECT_EQ(path, "recorded");
      else if (method == "streaming_llm") {
        EXPECT_EQ(path, "own");
        EXPECT_NE(a[i]["prefill"]["why"].get<std::string>().find("chunk"), std::string::npos);
      } else {
        EXPECT_EQ(path, "shared") << method << ": " << a[i]["prefill"]["why"];
        // The method's own prefill is attributed: the recorded model time and its own calls.
        EXPECT_GT(a[i]["prefill"]["shared_model_s"].get<double>(), 0.0);
        EXPECT_GE(a[i]["timing"]["context_s"].get<double>(),
                  a[i]["prefill"]["shared_model_s"].get<double>());
      }
    }
  }
}

// A grid whose recordings do not all fit the budget computes its qa cells in sample windows (one
// sample each here): every cell's first sample, then every cell's second, ...; each window's cells
// replay its prefills, and the answers are the per-cell path's.
TEST(SharedPrefill, AGridInSampleWindowsSharesEveryWindowAndAnswersAlike) {
  const nlohmann::json grid = nlohmann::json::parse(R"({
    "name": "windows",
    "base": {"protocol": {"name": "qa", "source": "recall", "num_samples": 3, "prefill_chunk": 16}},
    "axes": {"method": ["full", {"name": "snapkv", "params": {"budget": 0.5}},
                        {"name": "knorm", "params": {"budget": 0.5}}]}
  })");
  nlohmann::json g = grid;
  g["base"]["model"] = test::models_dir() + "/stories260K";
  const ModelConfig config = read_model_config(g["base"]["model"], "");
  // Room for one context's recording (a recall context is estimated at the model's context).
  const int64_t one = recording_bytes_estimate(config, 4, std::min<int64_t>(config.max_seq_len, 4096));
  std::map<std::string, std::vector<nlohmann::json>> by_path[2];
  for (int shared = 1; shared >= 0; --shared) {
    SharedPrefills::instance().clear();
    SharedPrefills::instance().set_budget(shared ? one * 3 / 2 : 0);
    const std::string dir = test::make_temp_dir("shared_prefill_windows");
    ResultsDb db(dir + "/db.sqlite");
    GridOptions go;
    go.data_dir = test::data_dir();
    const GridPlan plan = expand_grid(g, go);
    GridRunOptions ro;
    ro.env.data_dir = test::data_dir();
    ro.env.cache_dir = dir + "/cache";
    const GridSummary sum = run_grid(plan.name, plan.cells, db, ro);
    EXPECT_EQ(sum.ran, 3u);
    EXPECT_EQ(sum.failed, 0u);
    for (const GridCell& c : plan.cells) {
      const auto run = db.find_run_by_hash(c.config_hash);
      ASSERT_TRUE(run && run->status == RunStatus::kDone) << c.label;
      for (const auto& row : db.samples(run->id))
        by_path[shared][c.label].push_back(nlohmann::json::parse(row.output_json));
    }
  }
  SharedPrefills::instance().clear();
  SharedPrefills::instance().set_budget(int64_t{2048} << 20);
  for (const auto& [label, a] : by_path[1]) {
    const auto& b = by_path[0][label];
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]["items"], b[i]["items"]) << label << " sample " << i;
      EXPECT_EQ(a[i]["ledger"], b[i]["ledger"]) << label << " sample " << i;
      const std::string path = a[i]["prefill"]["path"];
      EXPECT_TRUE(path == (label.find("full") != std::string::npos ? "recorded" : "shared"))
          << label << " sample " << i << ": " << path << " " << a[i]["prefill"]["why"];
    }
  }
}

}  // namespace
}  // namespace kvb
