// What qa settings a config may hold, decided before anything runs: the LongBench source's length
// must be given and its resolved config carries only the parameters it reads (its hash with them);
// a parameter of another source is refused; a length the model cannot hold, or below a task's
// minimum, is refused by `run` and by `grid` (row counts) before any run row exists. Synthetic and
// recall configs keep their hashes (pinned). Long prefills report their progress through the
// engine.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/grid.h"
#include "harness/eval/run_config.h"
#include "harness/store/results_db.h"
#include "tests/harness/grid_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using gridtest::write_file;

json longbench_protocol() {
  const std::string fx = test::fixtures_dir() + "/longbench";
  return {{"name", "qa"},
          {"source", "longbench"},
          {"path", fx + "/tiny.jsonl"},
          {"tasks", fx + "/tasks.json"},
          {"skip_bad_lines", true}};
}

std::string error_of(const json& raw) {
  try {
    resolve_run_config(raw);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QaConfig, LongBenchNeedsItsLengthAndCarriesOnlyWhatItReads) {
  json raw = {{"model", "stories260K"}, {"method", "full"}, {"protocol", longbench_protocol()}};
  EXPECT_NE(error_of(raw).find("config.protocol.length: source 'longbench' needs it given"),
            std::string::npos)
      << error_of(raw);
  raw["protocol"]["length"] = 0;
  const json r = resolve_run_config(raw)["protocol"];
  for (const char* dropped : {"task", "depths", "corpus", "dataset", "questions"})
    EXPECT_FALSE(r.contains(dropped)) << dropped << " in " << r.dump();
  for (const char* kept : {"length", "path", "tasks", "skip_bad_lines", "num_samples", "mode",
                           "chat_template", "max_new_tokens", "prefill_chunk"})
    EXPECT_TRUE(r.contains(kept)) << kept << " missing from " << r.dump();
  EXPECT_EQ(r["length"], 0);
  // The same config with the synthetic default written out is refused, not folded into it.
  raw["protocol"]["task"] = "niah_single_1";
  EXPECT_NE(error_of(raw).find("config.protocol.task: applies to source 'synthetic' only, not to "
                               "source 'longbench'"),
            std::string::npos)
      << error_of(raw);
}

TEST(QaConfig, AParameterOfAnotherSourceIsRefused) {
  struct Case {
    json protocol;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{{"name", "qa"}, {"source", "synthetic"}, {"dataset", "wikitext2-test"}},
       "config.protocol.dataset: applies to source 'recall' only, not to source 'synthetic'"},
      {{{"name", "qa"}, {"source", "synthetic"}, {"skip_bad_lines", true}},
       "config.protocol.skip_bad_lines: applies to source 'longbench' only"},
      {{{"name", "qa"}, {"source", "recall"}, {"depths", "0.5"}},
       "config.protocol.depths: applies to source 'synthetic' only, not to source 'recall'"},
      {{{"name", "qa"}, {"source", "recall"}, {"length", 512}},
       "config.protocol.length: source 'recall' does not read it"},
  };
  for (const auto& c : cases) {
    const std::string err =
        error_of({{"model", "stories260K"}, {"method", "full"}, {"protocol", c.protocol}});
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.protocol.dump() << ": " << err;
  }
  // What each source reads is accepted, written out or not.
  EXPECT_EQ(error_of({{"model", "stories260K"},
                      {"method", "full"},
                      {"protocol",
                       {{"name", "qa"},
                        {"source", "recall"},
                        {"questions", 3},
                        {"dataset", "tinystories-valid-sample"},
                        {"max_new_tokens", 4}}}}),
            "");
  EXPECT_EQ(error_of({{"model", "stories260K"},
                      {"method", "full"},
                      {"protocol",
                       {{"name", "qa"},
                        {"task", "passkey"},
                        {"depths", "0,1"},
                        {"corpus", ""},
                        {"length", 256}}}}),
            "");
}

// A stored run's config_json (the resolved config, every default of synthetic and recall written
// out) resolves again to itself, with the same hash: `kvbench run` on it skips the finished run
// instead of refusing its own output.
TEST(QaConfig, AResolvedConfigResolvesToItselfForEverySource) {
  json longbench = longbench_protocol();
  longbench["length"] = 0;
  const std::vector<json> protocols = {
      {{"name", "qa"}, {"task", "passkey"}, {"length", 256}},
      {{"name", "qa"}, {"source", "recall"}, {"questions", 3}},
      longbench,
  };
  for (const json& proto : protocols) {
    const json raw = {{"model", "stories260K"}, {"method", "full"}, {"protocol", proto}};
    const json once = resolve_run_config(raw);
    SCOPED_TRACE(once.dump());
    ASSERT_EQ(error_of(once), "");
    const json twice = resolve_run_config(once);
    EXPECT_EQ(twice, once);
    EXPECT_EQ(run_config_hash(twice), run_config_hash(once));
  }
}

// Synthetic and recall configs keep every default (the hashes of their stored results predate the
// source-specific resolution): the main grids' cells, pinned by label. A change to what enters them
// would orphan every stored result of the main job.
TEST(QaConfig, MainGridCellHashesAreStable) {
  const fs::path root = gridtest::source_dir();
  GridOptions o;
  o.check_inputs = false;
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>
      pinned = {
          {"main.json",
           {{"method=full protocol=qa(depths=0,0.25,0.5,0.75,1, length=1024, num_samples=3, "
             "source=synthetic, task=passkey)",
             "ad2d6be2cc1a735496be29605fb6e729059cbbaffcfb357a335b344d3bc35fd4"},
            {"method=full protocol=qa(corpus=eb1911-shakespeare, depths=0,0.25,0.5,0.75,1, "
             "length=1024, num_samples=3, source=synthetic, task=niah_single_2)",
             "55480da545145307fbe73febe25f2363e182e67dcdd6278d529f8e3a257d6458"},
            {"method=kv_packet(adapter=models/kvb-testbed-kvpacket/h8t8.safetensors) "
             "protocol=qa(corpus=eb1911-shakespeare, depths=0,0.25,0.5,0.75,1, length=1024, "
             "num_samples=3, source=synthetic, task=niah_single_2)",
             "662427d78e39aec9c077d158fe4567a64e8936d3429535399be32b9c843e6ba2"}}},
          {"main_smollm2.json",
           {{"method=streaming_llm(budget=0.25) protocol=qa(corpus=eb1911-shakespeare, "
             "depths=0,0.5,1, length=2048, num_samples=1, source=synthetic, task=niah_single_2)",
             "23af81bdd163086932d8bc54d7329b6c561db8e66ac42fd3f179c908b5f8f7f6"}}},
          {"methods_stories260k.json",
           {{"method=full protocol=qa(dataset=tinystories-valid-sample, num_samples=16, "
             "questions=2, source=recall)",
             "5ab51352f03a3b7701fd2445be65097ae3bc68c4f52e4baf2278745db6690599"}}},
      };
  for (const auto& [grid, cells] : pinned) {
    const GridPlan plan = load_grid((root / "configs" / "grids" / grid).string(), o);
    for (const auto& [label, hash] : cells) {
      bool found = false;
      for (const auto& c : plan.cells)
        if (c.label == label) {
          found = true;
          EXPECT_EQ(c.config_hash, hash) << grid << ": " << label;
        }
      EXPECT_TRUE(found) << grid << ": no cell " << label;
    }
  }
}

// The shipped LongBench example's hash under the source-specific resolution (dropping the synthetic
// and recall defaults moved it from 875e77a1...).
TEST(QaConfig, LongBenchExampleHashIsPinned) {
  const fs::path root = gridtest::source_dir();
  const json raw =
      json::parse(gridtest::read_file((root / "configs/examples/qa_longbench.json").string()));
  EXPECT_EQ(run_config_hash(resolve_run_config(raw)),
            "646d92dafb3be0729e4f63e460ba89bde1054227d99ed0ca2185ed887b65d82a");
}

// A qa length beyond the model's context, or below the task's minimum with the model's tokenizer:
// the grid refuses it before its first cell (exit 2, the cell named, no run row), and runs the
// same grid without the bad cell.
TEST(QaConfig, GridRefusesLengthsTheModelCannotHoldBeforeAnyCell) {
  const std::string dir = test::make_temp_dir("qa_len_grid");
  const std::string model = test::models_dir() + "/stories260K";
  auto grid = [&](const std::string& name, const std::string& lengths) {
    const std::string path = dir + "/" + name + ".json";
    write_file(
        path,
        R"({"name": ")" + name + R"(", "base": {"model": ")" + model +
            R"(", "threads": 1, "protocol": {"name": "qa", "task": "passkey", "num_samples": 1, "depths": "0.5"}},
      "axes": {"method": ["full", "paged"], "protocol.length": [)" +
            lengths + "]}}");
    return path;
  };
  struct Case {
    std::string lengths, needle;
  };
  // stories260K's context is 512 tokens; passkey's instructions alone take more than 70.
  for (const Case& c : std::vector<Case>{{"256, 600",
                                          "config.protocol.length: 600 tokens (the prompt, "
                                          "question included) is longer than the context of"},
                                         {"70, 256", "task 'passkey'"}}) {
    const std::string db = dir + "/refused.sqlite";
    auto r = test::run_kvbench("grid -q -c " + grid("bad", c.lengths) + " --db " + db);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("grid 'bad': cell #"), std::string::npos) << r.err;
    if (fs::exists(db)) {
      ResultsDb d(db);
      EXPECT_EQ(d.list_runs().size(), 0u) << c.lengths;
    }
    // The dry run refuses it the same way.
    auto dry = test::run_kvbench("grid --dry-run -c " + grid("bad", c.lengths) + " --db " + db);
    EXPECT_EQ(dry.exit_code, 2) << dry.out << dry.err;
    EXPECT_NE(dry.err.find(c.needle), std::string::npos) << dry.err;
  }
  const std::string db = dir + "/ok.sqlite";
  auto ok = test::run_kvbench("grid -q -c " + grid("ok", "256") + " --db " + db);
  ASSERT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  ResultsDb d(db);
  EXPECT_EQ(d.list_runs().size(), 2u);
}

// A grid reads a LongBench cell's JSONL and task files before its first cell, as the run will.
TEST(QaConfig, GridReadsLongBenchFilesBeforeAnyCell) {
  const std::string dir = test::make_temp_dir("qa_lb_grid");
  const std::string fx = test::fixtures_dir() + "/longbench";
  auto grid = [&](const std::string& jsonl) {
    const std::string path = dir + "/grid.json";
    write_file(
        path,
        R"({"name": "lb", "base": {"model": ")" + test::models_dir() +
            R"(/stories260K", "method": "full", "protocol": {"name": "qa", "source": "longbench",
      "length": 0, "num_samples": 2, "skip_bad_lines": true, "path": ")" +
            jsonl + R"(", "tasks": ")" + fx + R"(/tasks.json"}},
      "axes": {"seed": [0, 1]}})");
    return path;
  };
  const std::string db = dir + "/db.sqlite";
  auto missing = test::run_kvbench("grid -q -c " + grid(dir + "/none.jsonl") + " --db " + db);
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_NE(missing.err.find(dir + "/none.jsonl"), std::string::npos) << missing.err;
  EXPECT_FALSE(fs::exists(db));
  // No line is a LongBench sample: the file yields none.
  write_file(dir + "/bad.jsonl", "{\"context\": 1}\n");
  auto bad = test::run_kvbench("grid -q -c " + grid(dir + "/bad.jsonl") + " --db " + db);
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("bad.jsonl"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(db));
  auto ok = test::run_kvbench("grid -q -c " + grid(fx + "/tiny.jsonl") + " --db " + db);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ResultsDb(db).list_runs().size(), 2u);
}

TEST(QaConfig, RunRefusesALengthBeyondTheContextAndWritesNoRunRow) {
  const std::string dir = test::make_temp_dir("qa_len_run");
  const std::string cfg = dir + "/run.json";
  write_file(cfg, R"({"model": ")" + test::models_dir() + R"(/stories260K", "method": "full",
    "protocol": {"name": "qa", "task": "passkey", "length": 513, "num_samples": 1}})");
  const std::string db = dir + "/db.sqlite";
  auto r = test::run_kvbench("run -q -c " + cfg + " --db " + db);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("config.protocol.length: 513 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(512 tokens)"), std::string::npos) << r.err;
  if (fs::exists(db)) {
    ResultsDb d(db);
    EXPECT_EQ(d.list_runs().size(), 0u);
  }
}

// A LongBench sample longer than the model's context with `length: 0` (no truncation) is refused
// before anything is written, naming the line and the lengths, by run and by grid (its dry run
// too); a cap middle-truncates it, as LongBench does, and the same file plans.
TEST(QaConfig, LongBenchPromptsPastTheContextAreRefusedUnlessTruncated) {
  const std::string dir = test::make_temp_dir("qa_lb_context");
  const std::string fx = test::fixtures_dir() + "/longbench";
  std::string story;
  for (int k = 0; k < 600; ++k) story += "Tom had a red ball and he liked to play with it. ";
  const std::string jsonl = dir + "/long.jsonl";
  write_file(jsonl, json({{"context", story},
                          {"input", "What color was the ball?"},
                          {"answers", {"red"}},
                          {"length", 6000},
                          {"dataset", "tinyqa"},
                          {"all_classes", nullptr},
                          {"_id", "long1"}})
                            .dump() +
                        "\n");
  auto config = [&](int length) {
    return json({{"model", test::models_dir() + "/stories260K"},
                 {"method", "full"},
                 {"protocol",
                  {{"name", "qa"},
                   {"source", "longbench"},
                   {"path", jsonl},
                   {"tasks", fx + "/tasks.json"},
                   {"length", length},
                   {"num_samples", 1}}}});
  };
  const std::string db = dir + "/db.sqlite";
  const std::string run_cfg = dir + "/run.json";
  write_file(run_cfg, config(0).dump());
  auto r = test::run_kvbench("run -q -c " + run_cfg + " --db " + db);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(jsonl + ":1: the prompt is "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("longer than the context of"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(512 tokens); set config.protocol.length to at most"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(db));
  const std::string grid_cfg = dir + "/grid.json";
  write_file(grid_cfg,
             json({{"name", "lb"}, {"base", config(0)}, {"axes", {{"seed", {0, 1}}}}}).dump());
  for (const std::string mode : {"", " --dry-run"}) {
    auto g = test::run_kvbench("grid -q -c " + grid_cfg + mode + " --db " + db);
    EXPECT_EQ(g.exit_code, 2) << mode << g.err;
    EXPECT_NE(g.err.find("grid 'lb': cell #0"), std::string::npos) << g.err;
    EXPECT_NE(g.err.find(jsonl + ":1: the prompt is "), std::string::npos) << g.err;
    EXPECT_FALSE(fs::exists(db)) << mode;
  }
  write_file(grid_cfg, json({{"name", "lb"}, {"base", config(448)}}).dump());
  auto ok = test::run_kvbench("grid --dry-run -c " + grid_cfg + " --db " + db);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// The engine tells how far a prefill has got, chunk by chunk, and prefill_progress_lines turns it
// into lines with an ETA (thresholds at 0 here: every chunk prints), one meter per prefill.
TEST(QaConfig, PrefillProgressCountsEveryChunkAndPrintsAnEta) {
  auto m = test::stories260k();
  std::vector<std::pair<int64_t, int64_t>> calls;
  EngineOptions eo;
  eo.prefill_chunk = 16;
  eo.prefill_progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  Engine e(m, make_default_kv(*m), eo);
  std::vector<int64_t> ids(50, 300);
  ids[0] = 1;
  e.prefill({e.new_sequence()}, {ids});
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {0, 50}, {16, 50}, {32, 50}, {48, 50}, {50, 50}};
  EXPECT_EQ(calls, want);

  std::vector<std::string> lines;
  EngineOptions lo;
  lo.prefill_chunk = 16;
  lo.prefill_progress =
      prefill_progress_lines([&](const std::string& s) { lines.push_back(s); }, 0, 0);
  Engine e2(m, make_default_kv(*m), lo);
  e2.prefill({e2.new_sequence()}, {ids});
  ASSERT_EQ(lines.size(), 4u) << (lines.empty() ? "" : lines[0]);
  EXPECT_EQ(lines[0].rfind("prefill 16/50 tokens (32%), ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(" elapsed, ETA "), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2].rfind("prefill 48/50 tokens (96%), ", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("prefill 50/50 tokens done in ", 0), 0u) << lines[3];
  // A second prefill gets its own meter (its own count from 0).
  lines.clear();
  e2.prefill({e2.new_sequence()}, {std::vector<int64_t>(20, 300)});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("prefill 16/20 tokens (80%), ", 0), 0u) << lines[0];
  // The default thresholds keep a sub-second prefill silent.
  lines.clear();
  EngineOptions quiet;
  quiet.prefill_progress =
      prefill_progress_lines([&](const std::string& s) { lines.push_back(s); });
  Engine e3(m, make_default_kv(*m), quiet);
  e3.prefill({e3.new_sequence()}, {ids});
  EXPECT_TRUE(lines.empty());
}

}  // namespace
}  // namespace kvb
