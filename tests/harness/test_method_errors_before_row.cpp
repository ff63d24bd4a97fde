// Method parameters that only the method's store can check (a kept ratio above 1, a token budget
// that is not an integer: they depend on budget_unit) and a serve prefix store URL that does not
// parse fail `kvbench run` with exit 2 and one line naming the parameter before the database is
// opened: the config checker (run_config.h) builds the method's store for the model's shapes and
// parses every URL first.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

TEST(MethodErrors, AreFoundBeforeTheRunRowExists) {
  const std::string dir = test::make_temp_dir("method_errors");
  struct Case {
    std::string method, needle;
  };
  const std::vector<Case> cases = {
      {R"({"name": "snapkv", "params": {"budget": 7}})",
       "method snapkv.budget: 7 is not a valid kept ratio"},
      {R"({"name": "h2o", "params": {"budget": 1.5}})",
       "method h2o.budget: 1.5 is not a valid kept ratio"},
      {R"({"name": "tova", "params": {"budget": 2.5, "budget_unit": "tokens_per_layer"}})",
       "is not a token count"},
      // Two parameters that only fit together: per-channel key groups tile the residual.
      {R"({"name": "kivi", "params": {"group_size": 32, "residual_length": 100}})",
       "method kivi.residual_length: 100 is not a multiple of group_size 32"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string cfg = dir + "/c" + std::to_string(i) + ".json";
    std::ofstream(cfg) << R"({"model": ")" << test::models_dir() << R"(/stories260K", "method": )"
                       << cases[i].method
                       << R"(, "protocol": {"name": "stream", "window": 64, "max_windows": 1}})";
    const std::string db = dir + "/db" + std::to_string(i) + ".sqlite";
    auto r =
        test::run_kvbench("run -q -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
    EXPECT_EQ(r.exit_code, 2) << cases[i].method << "\n" << r.err;
    EXPECT_NE(r.err.find(cases[i].needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(std::ifstream(db).good()) << "a database was created for " << cases[i].method;
  }
}

TEST(MethodErrors, AServePrefixStoreUrlThatDoesNotParseIsRefusedBeforeTheDatabase) {
  const std::string dir = test::make_temp_dir("serve_url_errors");
  for (const std::string url : {"redis://cachehost", "redis://h:99999", "unix://relative.sock"}) {
    const std::string cfg = dir + "/c.json";
    std::ofstream(cfg) << R"({"model": ")" << test::models_dir()
                       << R"(/stories260K", "method": "full", "protocol": {"name": "serve",
      "trace": "generated", "gen_requests": 10, "prefix_cache_gib": 1, "prefix_store": ")"
                       << url << R"("}})";
    const std::string db = dir + "/db.sqlite";
    auto r =
        test::run_kvbench("run -q -c " + cfg + " --db " + db + " --data-dir " + test::data_dir());
    EXPECT_EQ(r.exit_code, 2) << url << "\n" << r.err;
    EXPECT_NE(r.err.find("config.protocol.prefix_store: malformed Redis URL '" + url + "'"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(std::ifstream(db).good()) << url;
  }
}

}  // namespace
}  // namespace kvb
