// Method parameters that only the method's store can check (a kept ratio above 1, a token budget
// that is not an integer: they depend on budget_unit) fail `kvbench run` with exit 2 and one line
// naming the parameter before the run row exists: the runner builds the method's store once before
// it begins the run.

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
    if (std::ifstream(db).good()) {
      ResultsDb d(db);
      EXPECT_EQ(d.list_runs().size(), 0u) << "a run row was written for " << cases[i].method;
    }
  }
}

}  // namespace
}  // namespace kvb
