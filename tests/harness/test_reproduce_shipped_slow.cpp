// kvbench reproduce on claims of the shipped suites (slow label: their cells take about 20 s, which
// the sanitized build would multiply).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/harness/grid_test_util.h"

namespace kvb {
namespace {

using gridtest::read_file;
using gridtest::write_file;
using json = nlohmann::json;

// The cheapest shipped claims, run as the suites ship them: their cells from an empty store (a few
// seconds each on kvb-testbed, stories260K and the serving simulation), then the verdict, which
// must be the one the shipped report states. The whole run is a command (README); these are its
// part that CI runs.
TEST(Reproduce, CheapestShippedClaimsHoldFromAnEmptyStore) {
  const std::string root = gridtest::source_dir();
  const std::vector<std::pair<std::string, std::string>> picks = {
      {"kvtuner", "keys-more-sensitive"},
      {"kvtc", "dp-beats-uniform-bits-16x"},
      {"pagedattention", "paged-waste-under-4pct"},
      {"pagedattention", "contiguous-max-waste-60pct"}};
  const std::string dir = test::make_temp_dir("reproduce-shipped");
  std::map<std::string, json> suites;  // the shipped suites, cut down to the picked claims
  std::map<std::string, json> shipped_claims;
  for (const auto& [paper, id] : picks) {
    if (!suites.count(paper)) {
      suites[paper] = json::parse(read_file(root + "/configs/reproduce/" + paper + ".json"));
      shipped_claims[paper] = suites[paper]["claims"];
      suites[paper]["claims"] = json::array();
    }
    const json& claims = shipped_claims[paper];
    const auto it = std::find_if(claims.begin(), claims.end(),
                                 [&, id = id](const json& c) { return c["id"] == id; });
    ASSERT_NE(it, claims.end()) << paper << "/" << id << " is not in the shipped suite";
    suites[paper]["claims"].push_back(*it);
    const std::string page = read_file(root + "/results/reproduce/" + paper + ".md");
    EXPECT_NE(page.find("### " + id + ": holds"), std::string::npos)
        << "the shipped report of " << paper << " does not say " << id << " holds";
  }
  for (const auto& [paper, suite] : suites) write_file(dir + "/" + paper + ".json", suite.dump(2));
  const test::CommandResult r = test::run_kvbench(
      "reproduce --all --suites-dir " + dir + " --grids-dir " + root + "/configs/grids" +
      " --db " + dir + "/db.sqlite --out-dir " + dir + "/reports --models-dir " +
      test::models_dir() + " --data-dir " + test::data_dir());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [paper, id] : picks)
    EXPECT_NE(r.out.find(paper + "/" + id + ": holds"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvb
