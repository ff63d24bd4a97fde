// kvbench grid / merge: expansion (canonical order, per-method parameter lists, excludes, de-dup),
// validation of every cell before anything is written, deterministic shards, 3 shards in 3 processes
// merged = the unsharded run, failures recorded while the grid carries on, and SIGINT / SIGKILL in
// the middle of a grid followed by a re-run that finishes it with no lost or duplicate rows.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "harness/common/error.h"
#include "harness/eval/grid.h"
#include "harness/model/model.h"
#include "tests/harness/grid_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using gridtest::dump_db;
using gridtest::read_file;
using gridtest::spawn;
using gridtest::wait_exit;
using gridtest::write_file;
using json = nlohmann::json;

std::string model_path() { return test::models_dir() + "/stories260K"; }

std::vector<std::string> labels(const GridPlan& p) {
  std::vector<std::string> out;
  for (const auto& c : p.cells) out.push_back(c.label);
  return out;
}

GridOptions no_input_checks() {
  GridOptions o;
  o.check_inputs = false;
  return o;
}

TEST(Grid, CanonicalOrderPerMethodParamListsExcludesAndDedup) {
  json g = json::parse(R"({
    "name": "t",
    "base": {"model": "m", "protocol": {"name": "stream", "window": 64}},
    "axes": {
      "seed": [0, 1],
      "method": ["full", {"name": "paged", "params": {"block_size": [8, 16], "initial_blocks": 4}},
                 {"name": "paged", "params": {"block_size": 8, "initial_blocks": 4}}]
    },
    "exclude": [{"method": {"name": "paged", "params": {"block_size": 16}}, "seed": 1},
                {"method": "static"}]
  })");
  GridPlan p = expand_grid(g, no_input_checks());
  EXPECT_EQ(p.name, "t");
  EXPECT_EQ(p.axis_keys, (std::vector<std::string>{"method", "seed"}));  // sorted; first varies slowest
  EXPECT_EQ(p.expanded, 8u);                                             // (1 + 2 + 1) methods x 2 seeds
  EXPECT_EQ(p.excluded, 1u);
  EXPECT_EQ(p.duplicates, 2u);  // the explicit paged(8) equals the expanded one, for both seeds
  EXPECT_EQ(labels(p), (std::vector<std::string>{
                           "method=full seed=0", "method=full seed=1",
                           "method=paged(block_size=8, initial_blocks=4) seed=0",
                           "method=paged(block_size=8, initial_blocks=4) seed=1",
                           "method=paged(block_size=16, initial_blocks=4) seed=0"}));
  for (size_t i = 0; i < p.cells.size(); ++i) {
    EXPECT_EQ(p.cells[i].index, i);
    EXPECT_EQ(p.cells[i].config_hash.size(), 64u);
    EXPECT_EQ(p.cells[i].expected_samples, 4);  // stream default max_windows
  }
  // `full` was never crossed with a block size; the resolved config carries the defaults.
  EXPECT_TRUE(p.cells[0].resolved["method"]["params"].empty());
  EXPECT_EQ(p.cells[2].resolved["protocol"]["window"], 64);
  ASSERT_EQ(p.warnings.size(), 1u);  // {"method": "static"} matched nothing
  EXPECT_NE(p.warnings[0].find("exclude[1]"), std::string::npos);

  // The same grid with keys in another order gives the same cells in the same order.
  json g2 = g;
  g2["axes"] = json::parse(R"({"method": ["full", {"name": "paged", "params": {"initial_blocks": 4, "block_size": [8, 16]}},
                 {"name": "paged", "params": {"block_size": 8, "initial_blocks": 4}}], "seed": [0, 1]})");
  GridPlan p2 = expand_grid(g2, no_input_checks());
  ASSERT_EQ(p2.cells.size(), p.cells.size());
  for (size_t i = 0; i < p.cells.size(); ++i) EXPECT_EQ(p2.cells[i].config_hash, p.cells[i].config_hash);

  // --set applies after the axes, to every cell; resolution collapses the seeds into duplicates.
  GridOptions o = no_input_checks();
  o.sets = {"seed=7"};
  GridPlan p3 = expand_grid(g, o);
  EXPECT_EQ(p3.cells.size(), 3u);
  for (const auto& c : p3.cells) EXPECT_EQ(c.resolved["seed"], 7);
}

TEST(Grid, GenericParamAxisAndExcludeByResolvedValue) {
  // A generic method.params axis reaches every cell: full does not take block_size, so it must be
  // excluded (here by name) or the grid is invalid.
  json g = json::parse(R"({
    "base": {"model": "m", "protocol": "stream"},
    "axes": {"method": ["full", "paged"], "method.params.block_size": [8, 32]},
    "exclude": [{"method": "full", "method.params.block_size": 32}]
  })");
  try {
    expand_grid(g, no_input_checks());
    FAIL() << "expected an invalid cell";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cell 1 of 4 (method=full method.params.block_size=8)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unknown parameter 'block_size'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("per-method parameter lists"), std::string::npos) << msg;
  }
  g["exclude"] = json::parse(R"([{"method": "full", "method.params.block_size": [8, 32]}])");
  GridPlan p = expand_grid(g, no_input_checks());
  EXPECT_EQ(labels(p), (std::vector<std::string>{"method=paged method.params.block_size=8",
                                                 "method=paged method.params.block_size=32"}));
  // Excluding by a default value works through the resolved config (window 256 is the default).
  g["exclude"].push_back(json::parse(R"({"protocol.window": 256, "method.params.block_size": 32})"));
  EXPECT_EQ(expand_grid(g, no_input_checks()).cells.size(), 1u);
}

// Every grid the repository ships (configs/grids) expands with its models and datasets found: a
// renamed parameter, method or dataset breaks here, not in a user's grid run. The testbed grids
// need models/kvb-testbed (shipped by scripts/release-testbed.sh); the main grids read texts from the
// asset cache (scripts/fetch-assets.sh, which scripts/test.sh runs), so the data path is searched as
// a run searches it, the tests' data directory first.
TEST(Grid, EveryShippedGridExpandsWithItsInputs) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(test::fixtures_dir()).parent_path().parent_path();
  const bool testbed = fs::exists(root / "models" / "kvb-testbed" / "model.safetensors");
  int checked = 0;
  // Method files (adapters) are named relative to the repository root, where scripts/main.sh runs
  // the grids; the grid builds each method's store, so it reads them from there.
  const fs::path cwd = fs::current_path();
  fs::current_path(root);
  for (const auto& e : fs::directory_iterator(root / "configs" / "grids")) {
    if (e.path().extension() != ".json") continue;
    if (!testbed && read_file(e.path().string()).find("\"kvb-testbed\"") != std::string::npos) continue;
    GridOptions o;
    o.models_dir = test::models_dir();
    // A grid for a GPU machine names checkpoints the repository does not carry: its configs are
    // validated, its inputs are not looked for.
    o.check_inputs = read_file(e.path().string()).find("\"device\": \"cuda\"") == std::string::npos;
    // Likewise a grid over a checkpoint this machine has not fetched (Gemma 3 270M comes only with
    // KVB_FETCH_GEMMA3=1): its configs and stores are checked, not its files.
    const nlohmann::json g = nlohmann::json::parse(read_file(e.path().string()));
    if (g.contains("base") && g["base"].contains("model") && g["base"]["model"].is_string()) {
      try {
        resolve_model_path(g["base"]["model"].get<std::string>(), o.models_dir);
      } catch (const Error&) {
        o.check_inputs = false;
      }
    }
    ::setenv("KVBENCH_DATA", test::data_dir().c_str(), 1);
    try {
      const GridPlan plan = load_grid(e.path().string(), o);
      EXPECT_FALSE(plan.cells.empty()) << e.path();
      ++checked;
    } catch (const Error& err) {
      ADD_FAILURE() << e.path() << ": " << err.what();
    }
  }
  fs::current_path(cwd);
  EXPECT_GE(checked, 3);
}

// A serve cell whose trace is missing fails when the grid is loaded, naming the file, not after its
// footprint probe.
TEST(Grid, MissingServeTraceFailsAtExpansion) {
  json g = json::parse(R"({"base": {"model": "stories260K", "method": "full"},
                           "axes": {"protocol": [{"name": "serve", "trace": "/nonexistent/trace.jsonl"}]}})");
  GridOptions o;
  o.models_dir = test::models_dir();
  o.data_dir = test::data_dir();
  try {
    expand_grid(g, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/trace.jsonl"), std::string::npos) << e.what();
  }
  g["axes"]["protocol"][0]["trace"] = "generated";
  EXPECT_EQ(expand_grid(g, o).cells.size(), 1u);
}

TEST(Grid, ShardsPartitionTheCellsByIndexModuloN) {
  EXPECT_EQ(parse_shard("2/5").index, 2);
  EXPECT_EQ(parse_shard("2/5").count, 5);
  for (const char* bad : {"5/5", "-1/3", "1", "a/b", "1/0", "1/3/4", ""})
    EXPECT_THROW(parse_shard(bad), Error) << bad;
  json g = json::parse(R"({"base": {"model": "m", "method": "full", "protocol": "stream"},
                           "axes": {"seed": [0, 1, 2, 3, 4, 5, 6], "protocol.window": [16, 32]}})");
  GridPlan p = expand_grid(g, no_input_checks());
  ASSERT_EQ(p.cells.size(), 14u);
  std::multiset<std::string> seen;
  for (int64_t i = 0; i < 3; ++i) {
    auto part = shard_cells(p.cells, Shard{i, 3});
    EXPECT_EQ(part.size(), i < 2 ? 5u : 4u);
    for (const auto& c : part) {
      EXPECT_EQ(static_cast<int64_t>(c.index % 3), i);
      seen.insert(c.config_hash);
    }
  }
  EXPECT_EQ(seen.size(), 14u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 14u);  // disjoint and complete
}

TEST(Grid, InvalidGridExitsTwoWithOneLineAndWritesNothing) {
  const std::string dir = test::make_temp_dir("grid_bad");
  struct Case {
    std::string grid, needle;
  };
  const std::string base = R"("base": {"model": ")" + model_path() + R"(", "protocol": {"name": "stream", "window": 32}})";
  std::vector<Case> cases = {
      {"{" + base + R"(, "axes": {"method": ["full", "paged"], "method.params.block_size": [8]}})",
       "(method=full method.params.block_size=8) is invalid"},
      {"{" + base + R"(, "axes": {"method": ["full", "pagd"]}})", "did you mean 'paged'"},
      {"{" + base + R"(, "axes": {"metod": ["full"]}})", "did you mean 'method'"},
      {"{" + base + R"(, "axis": {"method": ["full"]}})", "did you mean 'axes'"},
      {"{" + base + R"(, "axes": {"method": []}})", "non-empty list"},
      {"{" + base + R"(, "axes": {"method": ["full"], "protocol.dataset": ["tinystories-valid-sample", "no-such-corpus"]}})",
       "no-such-corpus"},
      {"{" + base + R"(, "axes": {"method": ["full"], "model": ["no-such-model"]}})", "no-such-model"},
      {"{" + base + R"(, "axes": {"method": [{"name": "paged", "params": {"block_size": [8, -1]}}]}})",
       "block_size"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string cfg = dir + "/g" + std::to_string(i) + ".json";
    const std::string db = dir + "/db" + std::to_string(i) + ".sqlite";
    write_file(cfg, cases[i].grid);
    auto r = test::run_kvbench("grid -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
    EXPECT_EQ(r.exit_code, 2) << cases[i].grid << "\n" << r.err;
    EXPECT_NE(r.err.find(cases[i].needle), std::string::npos) << "want '" << cases[i].needle << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(std::ifstream(db).good()) << "database written for case " << i;
  }
}

// What only a method's store or a URL parser can refuse fails the whole grid before its first
// cell, as it fails `run`: exit 2, one line naming the cell and the parameter, no database; the
// dry run refuses it the same way. Many cells sharing a method config cost one store build.
TEST(Grid, StoreChecksAndUrlsFailTheGridBeforeAnyCell) {
  const std::string dir = test::make_temp_dir("grid_store_checks");
  const std::string stream = R"("protocol": {"name": "stream", "window": 32})";
  struct Case {
    std::string grid, needle;
  };
  const std::vector<Case> cases = {
      {R"({"base": {"model": ")" + model_path() + R"(", )" + stream +
           R"(}, "axes": {"method": ["full", {"name": "snapkv", "params": {"budget": [0.5, 7]}}]}})",
       "cell #2 (method=snapkv(budget=7)): method snapkv.budget: 7 is not a valid kept ratio"},
      {R"({"base": {"model": ")" + model_path() + R"(", "method": "full", "protocol": {"name":
           "serve", "trace": "generated", "gen_requests": 10, "prefix_cache_gib": 1}},
           "axes": {"protocol.prefix_store": ["host", "redis://cachehost"]}})",
       "(protocol.prefix_store=redis://cachehost) is invalid: config.protocol.prefix_store: "
       "malformed Redis URL 'redis://cachehost': no port"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string cfg = dir + "/g" + std::to_string(i) + ".json";
    const std::string db = dir + "/db" + std::to_string(i) + ".sqlite";
    write_file(cfg, cases[i].grid);
    for (const std::string mode : {"", " --dry-run"}) {
      auto r = test::run_kvbench("grid -q -c " + cfg + mode + " --db " + db + " --data-dir " +
                                 test::data_dir());
      EXPECT_EQ(r.exit_code, 2) << mode << "\n" << r.out << r.err;
      EXPECT_NE(r.err.find(cases[i].needle), std::string::npos)
          << "want '" << cases[i].needle << "' in: " << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_FALSE(std::ifstream(db).good()) << "database written for case " << i << mode;
    }
  }
  // 400 cells of one method config (the seed axis changes nothing the store sees).
  std::string seeds;
  for (int k = 0; k < 400; ++k) seeds += (k ? "," : "") + std::to_string(k);
  const std::string big = dir + "/big.json";
  write_file(big, R"({"base": {"model": ")" + model_path() + R"(", )" + stream +
                      R"(, "method": {"name": "snapkv", "params": {"budget": 0.5}}},
                      "axes": {"seed": [)" +
                      seeds + "]}}");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = test::run_kvbench("grid --dry-run --json -c " + big + " --data-dir " + test::data_dir());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["cells_total"], 400);
  EXPECT_LT(s, 30.0) << "400 cells of one method config took " << s << " s to validate";
}

// A dotted key of 100,000 components (a grid axis, an exclude key, a --set) is refused at once
// with the bound named, instead of nesting a config 100,000 deep (which overflowed the stack).
TEST(Grid, KeyPathsLongerThanAConfigNestsAreRefused) {
  const std::string dir = test::make_temp_dir("grid_deep_keys");
  std::string deep = "protocol";
  for (int k = 0; k < 100000; ++k) deep += ".a";
  const std::string cfg = dir + "/g.json";
  write_file(cfg, R"({"base": {"model": ")" + model_path() +
                      R"(", "method": "full", "protocol": {"name": "stream", "window": 32}},
                      "axes": {")" +
                      deep + R"(": [1]}})");
  const std::string db = dir + "/db.sqlite";
  auto g = test::run_kvbench("grid --dry-run -c " + cfg + " --db " + db);
  EXPECT_EQ(g.exit_code, 2) << g.err.substr(0, 400);
  EXPECT_NE(g.err.find("grid.axes: the key 'protocol.a.a."), std::string::npos)
      << g.err.substr(0, 400);
  EXPECT_NE(g.err.find("has 100001 components, more than the 128"), std::string::npos)
      << g.err.substr(0, 400);
  EXPECT_LT(g.err.size(), 1000u);  // the key is cut in the message
  // --set on run: the same bound, before anything is read or written (50,000 components: one
  // argument of a command line holds at most 128 KiB).
  std::string set = "protocol";
  for (int k = 0; k < 50000; ++k) set += ".a";
  const std::string run_cfg = dir + "/r.json";
  write_file(run_cfg, R"({"model": ")" + model_path() +
                          R"(", "method": "full", "protocol": {"name": "stream", "window": 32}})");
  auto r = test::run_kvbench("run -q -c " + run_cfg + " --db " + db + " --set " + set + "=1");
  EXPECT_EQ(r.exit_code, 2) << r.err.substr(0, 400);
  EXPECT_NE(r.err.find("--set: the key 'protocol.a.a."), std::string::npos) << r.err.substr(0, 400);
  EXPECT_FALSE(std::ifstream(db).good());
  // 128 components are still a key (refused only as a protocol parameter it is not).
  std::string ok = "protocol";
  for (int k = 1; k < 128; ++k) ok += ".a";
  auto r128 = test::run_kvbench("run -q -c " + run_cfg + " --db " + db + " --set " + ok + "=1");
  EXPECT_EQ(r128.exit_code, 2);
  EXPECT_EQ(r128.err.find("components"), std::string::npos) << r128.err;
}

// A small stream grid: 8 cells, 2 windows each.
std::string small_grid(const std::string& name, int windows = 2) {
  return R"({"name": ")" + name + R"(", "base": {"model": ")" + model_path() +
         R"(", "protocol": {"name": "stream", "dataset": "tinystories-valid-sample", "max_windows": )" +
         std::to_string(windows) + R"(, "prefill_tokens": 8}},
    "axes": {"method": ["full", "static", {"name": "paged", "params": {"block_size": [4, 16]}}],
             "protocol.window": [48, 80]}})";
}

TEST(Grid, ThreeShardsInThreeProcessesMergedEqualTheUnshardedRun) {
  const std::string dir = test::make_temp_dir("grid_shards");
  const std::string cfg = dir + "/grid.json";
  write_file(cfg, small_grid("shards"));
  auto all = test::run_kvbench("grid -c " + cfg + " --db " + dir + "/all/db.sqlite --data-dir " + test::data_dir());
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_NE(all.out.find("8 cells: 8 ran"), std::string::npos) << all.out;

  // The three shards run concurrently through the launcher script, the index taken from the
  // environment as a Slurm array task or a Kubernetes indexed pod would set it.
  const std::string script = gridtest::source_dir() + "/scripts/grid_shard.sh";
  std::vector<std::map<std::string, std::string>> envs = {
      {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_COUNT", "3"}},
      {{"JOB_COMPLETION_INDEX", "1"}, {"KVB_SHARD_COUNT", "3"}},
      // A resubmitted task (--array=2): its id is its shard; the count comes from KVB_SHARD_COUNT.
      {{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_MIN", "2"}, {"SLURM_ARRAY_TASK_MAX", "2"},
       {"SLURM_ARRAY_TASK_COUNT", "1"}, {"KVB_SHARD_COUNT", "3"}},
  };
  std::vector<pid_t> pids;
  for (size_t i = 0; i < envs.size(); ++i) {
    auto env = envs[i];
    env["KVB"] = test::kvbench_binary();
    env["KVBENCH_DATA"] = test::data_dir();
    pids.push_back(spawn({"/bin/bash", script, cfg, dir + "/shards"}, dir + "/out" + std::to_string(i),
                         dir + "/err" + std::to_string(i), env));
  }
  for (size_t i = 0; i < pids.size(); ++i)
    ASSERT_EQ(wait_exit(pids[i]), 0) << read_file(dir + "/err" + std::to_string(i));
  for (int i = 0; i < 3; ++i) {
    const std::string out = read_file(dir + "/out" + std::to_string(i));
    EXPECT_NE(out.find("[shard " + std::to_string(i) + "/3]: " + (i < 2 ? "3" : "2") + " cells"), std::string::npos)
        << out;
  }
  auto m = test::run_kvbench("merge --json " + dir + "/merged.sqlite " + dir + "/shards/shard-0.sqlite " + dir +
                             "/shards/shard-1.sqlite " + dir + "/shards/shard-2.sqlite");
  ASSERT_EQ(m.exit_code, 0) << m.err;
  json ms = json::parse(m.out);
  EXPECT_EQ(ms["runs_added"], 8);
  EXPECT_EQ(ms["runs_skipped"], 0);
  EXPECT_EQ(ms["samples_copied"], 16);
  EXPECT_EQ(ms["runs_done"], 8);

  const auto a = dump_db(dir + "/all/db.sqlite"), b = dump_db(dir + "/merged.sqlite");
  ASSERT_EQ(a.runs.size(), 8u);
  EXPECT_EQ(a.runs, b.runs);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.metrics, b.metrics);

  // Merging a shard again adds nothing (de-duplicated by config hash).
  auto again = test::run_kvbench("merge --json " + dir + "/merged.sqlite " + dir + "/shards/shard-1.sqlite");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(json::parse(again.out)["runs_added"], 0);
  EXPECT_EQ(json::parse(again.out)["runs_skipped"], 3);
  EXPECT_EQ(dump_db(dir + "/merged.sqlite").samples, a.samples);
}

// The shard script reads scheduler variables as plain integers only (a crafted value never reaches
// bash arithmetic, which would run it as a command), and refuses a Slurm array that does not say how
// many shards the grid has: a resubmitted task alone would otherwise run the whole grid as shard
// 0/1, and a stepped array would leave shards unrun.
TEST(Grid, ShardScriptRefusesCraftedAndPartialSchedulerVariablesBeforeRunning) {
  const std::string dir = test::make_temp_dir("grid_shard_env");
  const std::string script = gridtest::source_dir() + "/scripts/grid_shard.sh";
  const std::string marker = dir + "/ran-a-command";
  const std::string inject = "a[$(touch " + marker + ")]";
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"SLURM_ARRAY_TASK_ID", inject}, {"SLURM_ARRAY_TASK_COUNT", "3"}}, "SLURM_ARRAY_TASK_ID="},
      {{{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_MIN", inject}, {"SLURM_ARRAY_TASK_COUNT", "3"}},
       "SLURM_ARRAY_TASK_MIN="},
      {{{"JOB_COMPLETION_INDEX", "1"}, {"KVB_SHARD_COUNT", inject}}, "KVB_SHARD_COUNT="},
      {{{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_MIN", "2"}, {"SLURM_ARRAY_TASK_MAX", "2"},
        {"SLURM_ARRAY_TASK_COUNT", "1"}},
       "set KVB_SHARD_COUNT"},
      {{{"SLURM_ARRAY_TASK_ID", "4"}, {"SLURM_ARRAY_TASK_MIN", "0"}, {"SLURM_ARRAY_TASK_MAX", "6"},
        {"SLURM_ARRAY_TASK_STEP", "2"}, {"SLURM_ARRAY_TASK_COUNT", "4"}},
       "set KVB_SHARD_COUNT"},
      {{{"KVB_SHARD_INDEX", "3"}, {"KVB_SHARD_COUNT", "3"}}, "not below the shard count"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto env = cases[i].first;
    env["KVB"] = test::kvbench_binary();
    const std::string out_dir = dir + "/out" + std::to_string(i);
    const pid_t pid = spawn({"/bin/bash", script, dir + "/none.json", out_dir}, dir + "/stdout",
                            dir + "/stderr", env);
    EXPECT_EQ(wait_exit(pid), 2) << "case " << i;
    EXPECT_NE(read_file(dir + "/stderr").find(cases[i].second), std::string::npos)
        << "case " << i << ": " << read_file(dir + "/stderr");
    EXPECT_FALSE(std::ifstream(out_dir).good()) << "case " << i << " created its output folder";
  }
  EXPECT_FALSE(std::ifstream(marker).good()) << "a scheduler variable ran a command";
}

// A ~3 KB grid whose method parameter lists multiply to 200^4 = 1.6e9 methods: refused from the
// list lengths before any method is expanded (the old check ran after expansion, building every
// config in memory first), with bounded time and memory.
TEST(Grid, LongMethodListsAreCountedBeforeExpansion) {
  const std::string dir = test::make_temp_dir("grid_lists");
  std::string list;
  for (int i = 0; i < 200; ++i) list += (i ? "," : "") + std::to_string(i + 1);
  const std::string cfg = dir + "/grid.json";
  write_file(cfg, R"({"name": "big", "base": {"model": ")" + model_path() + R"(", "protocol": "stream"},
    "axes": {"method": [{"name": "paged", "params": {"block_size": [)" + list + R"(]}},
                        {"name": "quest", "params": {"budget": [)" + list + "], \"page_size\": [" + list +
                      "], \"a\": [" + list + "], \"b\": [" + list + R"(]}}]}})");
  ASSERT_LT(read_file(cfg).size(), 4000u);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = test::run_kvbench("grid --dry-run -c " + cfg + " --db " + dir + "/db.sqlite");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("method parameter lists included"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("more than 100000 cells"), std::string::npos) << r.err;
  EXPECT_LT(s, 10.0);
  // Plain axes too: three lists of 100 values (1.3 KB) are 10^6 cells, refused before any is built.
  json big = {{"base", {{"model", model_path()}, {"protocol", "stream"}}},
              {"axes", json::object()}};
  for (const char* axis : {"seed", "protocol.window", "protocol.max_windows"})
    for (int i = 1; i <= 100; ++i) big["axes"][axis].push_back(16 + i);
  ASSERT_LT(big.dump().size(), 1500u);
  write_file(cfg, big.dump());
  const auto t1 = std::chrono::steady_clock::now();
  r = test::run_kvbench("grid --dry-run --schema-only -c " + cfg);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("more than 100000 cells"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 10.0);
  // In the library too: the same grid through expand_grid throws at once.
  EXPECT_THROW(expand_grid(json::parse(read_file(cfg)), GridOptions{}), Error);
  // Lists whose product is within the limit still expand, in the same order as before.
  write_file(cfg, R"({"base": {"model": ")" + model_path() + R"(", "protocol": "stream"},
    "axes": {"method": [{"name": "paged", "params": {"block_size": [4, 8, 16]}}, "full"]}})");
  GridPlan plan = expand_grid(json::parse(read_file(cfg)), GridOptions{});
  ASSERT_EQ(plan.cells.size(), 4u);
}

// Found by fuzz_run_config: a protocol axis value whose name is not a string made the cell's label
// throw the JSON library's exception (an internal error, exit 1) before the cell was resolved.
TEST(Grid, AnyValueWhereANameBelongsIsAConfigError) {
  for (const char* axes :
       {R"({"protocol": [{"name": 2, "window": 64}]})", R"({"protocol": [{"name": null}]})",
        R"({"method": [{"name": 5}]})", R"({"method": [7]})", R"({"method": [["full"]]})"}) {
    json grid = {{"base", {{"model", "stories260K"}, {"method", "full"}, {"protocol", "stream"}}},
                 {"axes", json::parse(axes)}};
    try {
      expand_grid(grid, no_input_checks());
      ADD_FAILURE() << axes << ": accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("protocol") != std::string::npos ||
                  what.find("method") != std::string::npos)
          << axes << ": " << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << axes << ": not a kvb::Error: " << e.what();
    }
  }
  const std::string dir = test::make_temp_dir("grid_names");
  write_file(dir + "/g.json", R"({"base": {"model": ")" + model_path() +
                                  R"("}, "axes": {"protocol": [{"name": 2}]}})");
  auto r = test::run_kvbench("grid --dry-run --schema-only -c " + dir + "/g.json");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

TEST(Grid, DryRunPlansWithoutWritingAndShowsWhatIsDone) {
  const std::string dir = test::make_temp_dir("grid_dry");
  const std::string cfg = dir + "/grid.json";
  write_file(cfg, small_grid("dry"));
  const std::string db = dir + "/db.sqlite";
  auto plan = test::run_kvbench("grid --dry-run --json -c " + cfg + " --db " + db);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_FALSE(std::ifstream(db).good());
  json p = json::parse(plan.out);
  EXPECT_EQ(p["cells_total"], 8);
  EXPECT_EQ(p["to_run"], 8);
  auto shard = test::run_kvbench("grid -q -c " + cfg + " --db " + db + " --shard 1/2 --data-dir " + test::data_dir());
  ASSERT_EQ(shard.exit_code, 0) << shard.err;
  auto text = test::run_kvbench("grid --dry-run -c " + cfg + " --db " + db);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("8 of 8 cells"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("4 done, 0 partial, 0 failed, 4 new -> 4 to run"), std::string::npos) << text.out;
  p = json::parse(test::run_kvbench("grid --dry-run --json -c " + cfg + " --db " + db).out);
  for (const auto& c : p["cells"]) EXPECT_EQ(c["status"], c["index"].get<int>() % 2 == 1 ? "done" : "new");
}

TEST(Grid, FailingCellIsRecordedAndTheGridCarriesOn) {
  const std::string dir = test::make_temp_dir("grid_fail");
  // A corpus that exists (so validation passes) but is too short for one window: those cells fail
  // when they run.
  write_file(dir + "/tiny.txt", "Once upon a time.\n");
  const std::string cfg = dir + "/grid.json";
  write_file(cfg, R"({"name": "f", "base": {"model": ")" + model_path() +
                      R"(", "protocol": {"name": "stream", "window": 48, "max_windows": 2}},
    "axes": {"protocol.dataset": ["tinystories-valid-sample", ")" + dir + R"(/tiny.txt"], "method": ["full", "paged"]}})");
  const std::string db = dir + "/db.sqlite";
  auto r = test::run_kvbench("grid -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("4 cells: 2 ran, 0 already done, 2 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAILED #1"), std::string::npos) << r.out;
  ResultsDb d(db);
  int done = 0, failed = 0;
  for (const auto& run : d.list_runs()) {
    if (run.status == RunStatus::kDone) done++;
    if (run.status == RunStatus::kFailed) {
      failed++;
      EXPECT_EQ(run.grid, "f");
      EXPECT_NE(run.error.find("tiny.txt"), std::string::npos) << run.error;
    }
  }
  EXPECT_EQ(done, 2);
  EXPECT_EQ(failed, 2);
}

TEST(Grid, ProgressLinesCarryElapsedAndAnEtaFromFinishedCells) {
  const std::string dir = test::make_temp_dir("grid_eta");
  const std::string cfg = dir + "/grid.json";
  write_file(cfg, R"({"name": "eta", "base": {"model": ")" + model_path() +
                      R"(", "protocol": {"name": "stream", "window": 32, "max_windows": 2}},
    "axes": {"method": ["full", {"name": "paged", "params": {"block_size": [8, 16]}}]}})");
  const std::string db = dir + "/db.sqlite";
  auto r = test::run_kvbench("grid --progress lines --json -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Before any cell finished nothing is known; after, the finished cells' time per sample times the
  // samples left; nothing left at the end.
  for (int k = 1; k <= 3; ++k) {
    const std::string head = "grid: [" + std::to_string(k) + "/3] done ";
    const size_t at = r.err.find(head);
    ASSERT_NE(at, std::string::npos) << r.err;
    const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
    EXPECT_NE(line.find("(elapsed "), std::string::npos) << line;
    EXPECT_EQ(line.find("ETA ?"), std::string::npos) << line;
    if (k == 3) {
      EXPECT_NE(line.find(", ETA 0s)"), std::string::npos) << line;
    }
  }
  // Progress stays on stderr: --json stdout is the summary alone.
  EXPECT_EQ(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ran"], 3);
}

// Interrupts a grid run once `min_samples` samples are stored, then re-runs it; the result must equal
// an uninterrupted run row for row.
void interrupt_and_resume(int sig) {
  const std::string dir = test::make_temp_dir(sig == SIGINT ? "grid_sigint" : "grid_sigkill");
  const std::string cfg = dir + "/grid.json";
  const int kWindows = 12;
  write_file(cfg, R"({"name": "intr", "base": {"model": ")" + model_path() +
                      R"(", "protocol": {"name": "stream", "dataset": "tinystories-valid-sample", "window": 160, "max_windows": )" +
                      std::to_string(kWindows) + R"(, "prefill_tokens": 4}},
    "axes": {"method": ["full", "static", {"name": "paged", "params": {"block_size": [4, 16]}}]}})");
  const std::string ref_db = dir + "/ref/db.sqlite", db = dir + "/db.sqlite";
  auto ref = test::run_kvbench("grid -q -c " + cfg + " --db " + ref_db + " --data-dir " + test::data_dir());
  ASSERT_EQ(ref.exit_code, 0) << ref.err;

  pid_t pid = spawn({test::kvbench_binary(), "grid", "-c", cfg, "--db", db, "--data-dir", test::data_dir()},
                    dir + "/out", dir + "/err");
  int64_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && seen < kWindows + 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!std::ifstream(db).good()) continue;
    try {
      ResultsDb d(db);
      seen = 0;
      for (const auto& r : d.list_runs()) seen += d.sample_count(r.id);
    } catch (const std::exception&) {
    }
  }
  kill(pid, sig);
  const int code = wait_exit(pid);
  ASSERT_EQ(code, 128 + sig) << "the grid finished before it could be interrupted\n" << read_file(dir + "/err");
  {
    ResultsDb d(db);
    auto runs = d.list_runs();
    ASSERT_GE(runs.size(), 2u);
    EXPECT_EQ(runs[0].status, RunStatus::kDone);
    EXPECT_NE(runs.back().status, RunStatus::kDone);  // the run that was going on
    if (sig == SIGINT) {
      // Stopped at a sample boundary and recorded as such.
      EXPECT_EQ(runs.back().status, RunStatus::kFailed);
      EXPECT_NE(runs.back().error.find("interrupted"), std::string::npos) << runs.back().error;
      EXPECT_NE(read_file(dir + "/out").find("re-run the same command"), std::string::npos);
    }
    EXPECT_TRUE(d.metrics(runs.back().id).empty());  // no half-finished run-level rows
    EXPECT_LT(d.sample_count(runs.back().id), kWindows);
  }
  auto again = test::run_kvbench("grid -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("already done"), std::string::npos) << again.out;
  EXPECT_NE(again.err.find("resuming run"), std::string::npos) << again.err;
  const auto a = dump_db(ref_db), b = dump_db(db);
  ASSERT_EQ(a.runs.size(), 4u);
  EXPECT_EQ(b.runs, a.runs);
  EXPECT_EQ(b.samples, a.samples);  // none lost, none duplicated, same outputs
  EXPECT_EQ(b.metrics, a.metrics);
  for (const auto& [hash, rows] : b.samples) EXPECT_EQ(rows.size(), static_cast<size_t>(kWindows));
}

TEST(Grid, SigintStopsAtASampleBoundaryExits130AndARerunFinishes) { interrupt_and_resume(SIGINT); }

TEST(Grid, SigkillMidGridThenRerunFinishesWithNoLostOrDuplicateRows) { interrupt_and_resume(SIGKILL); }

}  // namespace
}  // namespace kvb
