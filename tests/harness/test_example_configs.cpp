// Every shipped example run config (configs/examples) resolves and finds its inputs, and the LongBench
// JSONL example runs end to end from the repository root as the README shows it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>
#include <sstream>

#include "harness/common/error.h"
#include "harness/eval/grid.h"
#include "harness/eval/run_config.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;

fs::path source_root() { return fs::path(test::fixtures_dir()).parent_path().parent_path(); }

// The example's paths are relative to the repository root (as `kvbench run -c configs/examples/...`
// is run from there): the test works from there too.
struct InRoot {
  fs::path before = fs::current_path();
  InRoot() { fs::current_path(source_root()); }
  ~InRoot() { fs::current_path(before); }
};

TEST(ExampleConfigs, EveryShippedExampleResolvesWithItsInputs) {
  InRoot in_root;
  const std::string scratch = test::make_temp_dir("examples");
  ::setenv("KVBENCH_DATA", test::data_dir().c_str(), 1);
  std::set<std::string> protocols, qa_sources;
  int checked = 0;
  for (const auto& e : fs::directory_iterator("configs/examples")) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json example = nlohmann::json::parse(text.str());
    const nlohmann::json& raw_proto = example["protocol"];
    protocols.insert(raw_proto.is_string() ? raw_proto.get<std::string>() : raw_proto["name"].get<std::string>());
    // The testbed's weights may be absent from a checkout (as in Grid.EveryShippedGridExpandsWithItsInputs).
    if (example["model"] == "kvb-testbed" && !fs::exists(fs::path("models") / "kvb-testbed" / "model.safetensors"))
      continue;
    // Through the grid loader: it resolves the config and looks for the model and data files.
    const std::string grid = scratch + "/" + e.path().filename().string();
    std::ofstream(grid) << nlohmann::json({{"name", "example"}, {"base", example}, {"axes", {{"seed", {0}}}}}).dump();
    GridOptions o;
    o.models_dir = test::models_dir();
    try {
      const GridPlan plan = load_grid(grid, o);
      ASSERT_EQ(plan.cells.size(), 1u) << e.path();
      const nlohmann::json& proto = plan.cells[0].resolved["protocol"];
      if (proto["name"] == "qa") qa_sources.insert(proto["source"].get<std::string>());
      ++checked;
    } catch (const Error& err) {
      ADD_FAILURE() << e.path() << ": " << err.what();
    }
  }
  EXPECT_GE(checked, 6);
  // An example for every protocol and every qa data source.
  EXPECT_EQ(protocols, (std::set<std::string>{"perf", "probe", "qa", "serve", "stream"}));
  EXPECT_EQ(qa_sources, (std::set<std::string>{"longbench", "recall", "synthetic"}));
}

// The config hashes of shipped examples, pinned: a change to what enters a synthetic, recall or stream
// config (a default, a parameter) would orphan every stored result of it.
TEST(ExampleConfigs, ConfigHashesOfStoredResultsAreStable) {
  InRoot in_root;
  const std::vector<std::pair<std::string, std::string>> pinned = {
      {"configs/examples/qa_ruler.json", "ef9cfd795b4943ad636bebd6e8d0d10d0455154512db08301e1782e957b8e7c8"},
      {"configs/examples/qa_recall.json", "477a5417fcf813cccbacff4e413ff1d13590cf29e753f5f38bab11f298526cd8"},
      {"configs/examples/stream_paged.json", "a0a4303c2d9b1095cdfb0974badd8e998544aadff694e275ceab26081d96c7b2"},
  };
  for (const auto& [file, hash] : pinned) {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(run_config_hash(resolve_run_config(nlohmann::json::parse(text.str()))), hash) << file;
  }
}

TEST(ExampleConfigs, LongBenchJsonlExampleRunsFromTheRepositoryRoot) {
  InRoot in_root;
  const std::string dir = test::make_temp_dir("example_lb");
  auto r = test::run_kvbench("run -q -c configs/examples/qa_longbench.json --models-dir " + test::models_dir() +
                             " --db " + dir + "/db.sqlite");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["samples"], 3);
  EXPECT_EQ(j["protocol"], "qa");
  // The task's stop strings end each answer: none holds a newline.
  auto show = test::run_kvbench("show " + std::to_string(j["run_id"].get<int64_t>()) + " --json -n -1 --db " + dir +
                                "/db.sqlite");
  ASSERT_EQ(show.exit_code, 0) << show.err;
  const auto shown = nlohmann::json::parse(show.out);  // held: the loop reads into it
  for (const auto& s : shown["samples"])
    EXPECT_EQ(s["output"]["items"][0]["prediction"].get<std::string>().find('\n'), std::string::npos) << s.dump();
}

}  // namespace
}  // namespace kvb
