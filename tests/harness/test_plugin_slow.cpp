// The out-of-tree plugin path: install kvbench, build methods/example_plugin against the installed
// package, load it with --plugin, run it into a database (the window method, the scorer plugin
// under the head-adaptive allocator, and the plugin's protocol); a plugin built for another ABI or
// against another LibTorch is refused.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/kv/plugin.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

int sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/tmp/kvb_plugin_build.log 2>&1").c_str());
  if (rc != 0) {
    std::ifstream in("/tmp/kvb_plugin_build.log");
    std::cerr << in.rdbuf();
  }
  return rc;
}

TEST(Plugin, BuildsOutOfTreeLoadsRunsAndRejectsOtherAbi) {
  const char* env_build = std::getenv("KVB_BUILD_DIR");
  const char* build = env_build && *env_build ? env_build : KVB_BUILD_DIR_DEFAULT;
  const char* env_src = std::getenv("KVB_SOURCE_DIR");
  const std::string src = env_src && *env_src ? env_src : KVB_SOURCE_DIR_DEFAULT;
  const std::string dir = test::make_temp_dir("plugin");
  ASSERT_EQ(sh("cmake --install " + std::string(build) + " --prefix " + dir + "/prefix"), 0);
  const std::string cfg = "cmake -S " + src + "/methods/example_plugin -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + dir + "/prefix";
  ASSERT_EQ(sh(cfg + " -B " + dir + "/good && cmake --build " + dir + "/good"), 0);
  const std::string so = dir + "/good/libkvb_example_window.so";

  auto listed = test::run_kvbench("--plugin " + so + " methods --json");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  bool found = false;
  for (const auto& m : nlohmann::json::parse(listed.out))
    if (m["name"] == "example_window") {
      found = true;
      EXPECT_EQ(m["origin"], "plugin:" + so);
    }
  EXPECT_TRUE(found) << listed.out;

  std::ofstream(dir + "/c.json") << "{\"model\": \"" << test::models_dir()
                                  << "/stories260K\", \"method\": {\"name\": \"example_window\", \"params\": {\"window\": 32}}, "
                                     "\"protocol\": {\"name\": \"stream\", \"window\": 128, \"max_windows\": 2}}";
  auto run = test::run_kvbench("--plugin " + so + " run -q -c " + dir + "/c.json --db " + dir + "/db.sqlite --data-dir " + test::data_dir());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto j = nlohmann::json::parse(run.out);
  EXPECT_EQ(j["method"], "example_window");
  EXPECT_GT(j["metrics"]["kl_mean"].get<double>(), 0.0);  // it really evicts
  EXPECT_GT(j["metrics"]["compression_ratio"].get<double>(), 2.0);

  // The scorer plugin: one scorer, composed with a built-in allocator by a parameter.
  const std::string scorer_so = dir + "/good/libkvb_example_scorer.so";
  std::ofstream(dir + "/s.json") << "{\"model\": \"" << test::models_dir()
                                  << "/stories260K\", \"method\": {\"name\": \"example_scorer\", \"params\": "
                                     "{\"budget\": 0.25, \"allocator\": \"ada\"}}, "
                                     "\"protocol\": {\"name\": \"stream\", \"window\": 128, \"max_windows\": 1}}";
  auto scored = test::run_kvbench("--plugin " + scorer_so + " run -q -c " + dir + "/s.json --db " + dir + "/db.sqlite --data-dir " + test::data_dir());
  ASSERT_EQ(scored.exit_code, 0) << scored.err;
  auto sj = nlohmann::json::parse(scored.out);
  EXPECT_EQ(sj["method"], "example_scorer");
  EXPECT_GT(sj["metrics"]["kl_mean"].get<double>(), 0.0);

  // The plugin's protocol: listed with its origin, refused without the plugin, run through the
  // generic loop with the plugin's method and with the full cache.
  auto protocols = test::run_kvbench("--plugin " + so + " protocols --json");
  ASSERT_EQ(protocols.exit_code, 0) << protocols.err;
  bool protocol_found = false;
  for (const auto& p : nlohmann::json::parse(protocols.out))
    if (p["name"] == "example_prefill_bytes") {
      protocol_found = true;
      EXPECT_EQ(p["origin"], "plugin:" + so);
    }
  EXPECT_TRUE(protocol_found) << protocols.out;
  auto prefill_config = [&](const std::string& method) {
    const std::string path = dir + "/prefill_" + method + ".json";
    std::ofstream(path) << "{\"model\": \"" << test::models_dir() << "/stories260K\", \"method\": {\"name\": \""
                        << method << "\"" << (method == "example_window" ? ", \"params\": {\"window\": 32}" : "")
                        << "}, \"protocol\": {\"name\": \"example_prefill_bytes\", \"lengths\": \"64,128\"}}";
    return path;
  };
  auto unknown = test::run_kvbench("run -q -c " + prefill_config("full") + " --db " + dir + "/p.sqlite");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown protocol 'example_prefill_bytes'"), std::string::npos) << unknown.err;
  for (const std::string method : {"full", "example_window"}) {
    auto pr = test::run_kvbench("--plugin " + so + " run -q -c " + prefill_config(method) + " --db " + dir + "/p.sqlite");
    ASSERT_EQ(pr.exit_code, 0) << pr.err;
    const auto pj = nlohmann::json::parse(pr.out);
    const double vs_full = pj["metrics"]["prefill_held_vs_full"].get<double>();
    if (method == "full") EXPECT_EQ(vs_full, 1.0);
    else EXPECT_LT(vs_full, 0.5);  // 32 of 64 and of 128 tokens kept
    EXPECT_GT(pj["metrics"]["prefill_held_bytes_per_token"].get<double>(), 0.0);
  }

  ASSERT_EQ(sh(cfg + " -B " + dir + "/bad -DCMAKE_CXX_FLAGS=-DKVB_PLUGIN_ABI_VERSION=99 && cmake --build " + dir + "/bad"), 0);
  auto refused = test::run_kvbench("--plugin " + dir + "/bad/libkvb_example_window.so methods");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("ABI version 99 but this kvbench has ABI version " +
                            std::to_string(KVB_PLUGIN_ABI_VERSION)),
            std::string::npos)
      << refused.err;

  // Built against another LibTorch (as reported by the plugin): refused before any call into it.
  ASSERT_EQ(sh(cfg + " -B " + dir + "/torch -DCMAKE_CXX_FLAGS='-DKVB_PLUGIN_TORCH_VERSION=\\\"0.0.1\\\"'" +
               " && cmake --build " + dir + "/torch"), 0);
  auto other = test::run_kvbench("--plugin " + dir + "/torch/libkvb_example_window.so methods");
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_NE(other.err.find("built against LibTorch 0.0.1 but this kvbench uses LibTorch "), std::string::npos)
      << other.err;
}

}  // namespace
}  // namespace kvb
