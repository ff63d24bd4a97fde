// kvbench show: a run by id or config hash prefix, as text and JSON, with its config, provenance,
// metrics and samples; output bounded by --samples, --max-chars and --max-items.

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::run_kvbench;

// A results database with one finished run of five samples, each holding a long prompt and a long array.
struct ShowDb {
  std::string dir = test::make_temp_dir("show");
  std::string path = dir + "/db.sqlite";
  std::string hash = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789";
  int64_t run_id = 0;
  ShowDb() {
    ResultsDb db(path);
    RunSpec spec;
    spec.config_hash = hash;
    spec.config_json = R"({"method":{"name":"full","params":{}},"model":"m","protocol":{"name":"qa"}})";
    spec.method = "full";
    spec.model = "m";
    spec.dataset = "d";
    spec.protocol = "qa";
    spec.provenance_json = R"({"git_commit":"0123456789abcdef0123456789abcdef01234567"})";
    run_id = db.begin_run(spec).id;
    for (int i = 0; i < 5; ++i) {
      nlohmann::json out = {{"prompt", "p" + std::to_string(i) + std::string(1000, 'x')},
                            {"prediction", "the answer é"},
                            {"score", 0.5 * i},
                            {"tokens", std::vector<int>(100, 7)}};
      db.add_sample(run_id, i, "key" + std::to_string(i), out.dump());
    }
    db.finish_run(run_id, {Metric("accuracy", 0.75, "", Direction::kHigher)}, 1.5);
  }
};

TEST(CliShow, RunByIdOrHashPrefixAsJsonWithBoundedSamples) {
  ShowDb d;
  auto by_id = run_kvbench("show " + std::to_string(d.run_id) + " --json --db " + d.path);
  ASSERT_EQ(by_id.exit_code, 0) << by_id.err;
  auto by_hash = run_kvbench("show abcdef01 --json --db " + d.path);
  ASSERT_EQ(by_hash.exit_code, 0) << by_hash.err;
  EXPECT_EQ(by_id.out, by_hash.out);
  auto j = nlohmann::json::parse(by_id.out);
  EXPECT_EQ(j["config_hash"], d.hash);
  EXPECT_EQ(j["status"], "done");
  EXPECT_EQ(j["config"]["method"]["name"], "full");
  EXPECT_EQ(j["provenance"]["git_commit"], "0123456789abcdef0123456789abcdef01234567");
  ASSERT_EQ(j["metrics"].size(), 1u);
  EXPECT_EQ(j["metrics"][0]["name"], "accuracy");
  EXPECT_EQ(j["metrics"][0]["value"], 0.75);
  EXPECT_EQ(j["samples_total"], 5);
  ASSERT_EQ(j["samples_shown"], 3);  // the default
  ASSERT_EQ(j["samples"].size(), 3u);
  const auto& s1 = j["samples"][1];
  EXPECT_EQ(s1["index"], 1);
  EXPECT_EQ(s1["key"], "key1");
  EXPECT_EQ(s1["output"]["prediction"], "the answer é");
  EXPECT_EQ(s1["output"]["score"], 0.5);
  const std::string prompt = s1["output"]["prompt"];
  EXPECT_EQ(prompt.rfind("p1xxx", 0), 0u) << prompt;
  EXPECT_NE(prompt.find("[... 702 more bytes of 1002]"), std::string::npos) << prompt;
  ASSERT_EQ(s1["output"]["tokens"].size(), 33u);
  EXPECT_EQ(s1["output"]["tokens"][32], "[... 68 more items of 100]");

  auto all = nlohmann::json::parse(
      run_kvbench("show " + std::to_string(d.run_id) + " --json --samples -1 --max-chars 2000 --max-items 200 --db " + d.path).out);
  EXPECT_EQ(all["samples"].size(), 5u);
  EXPECT_EQ(all["samples"][4]["output"]["prompt"].get<std::string>().size(), 1002u);
  EXPECT_EQ(all["samples"][4]["output"]["tokens"].size(), 100u);
  // A cut never splits a UTF-8 character: "the answer é" cut at 12 bytes keeps "the answer ".
  auto cut = nlohmann::json::parse(run_kvbench("show abcdef01 --json -n 1 --max-chars 12 --db " + d.path).out);
  EXPECT_EQ(cut["samples"][0]["output"]["prediction"], "the answer  [... 2 more bytes of 13]");
}

TEST(CliShow, TextNamesEveryPart) {
  ShowDb d;
  auto r = run_kvbench("show abcdef01 --samples 1 --db " + d.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& needle : {"run " + std::to_string(d.run_id) + "  " + d.hash + "  done", std::string("config:"),
                                    std::string("provenance:"), std::string("accuracy"), std::string("samples: 1 of 5 shown"),
                                    std::string("#0  key key0"), std::string("prediction: the answer é"),
                                    std::string("more bytes of 1002]")})
    EXPECT_NE(r.out.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << r.out;
  EXPECT_EQ(r.out.find("#1"), std::string::npos) << r.out;
}

TEST(CliShow, UnknownRunOrMissingDatabaseIsOneLineAndCreatesNothing) {
  ShowDb d;
  auto none = run_kvbench("show 99 --db " + d.path);
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("99"), std::string::npos) << none.err;
  const std::string missing = d.dir + "/nope.sqlite";
  auto r = run_kvbench("show 1 --db " + missing);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(missing + ": no such results database"), std::string::npos) << r.err;
  EXPECT_NE(::access(missing.c_str(), F_OK), 0);
  auto bad = run_kvbench("show 1 --samples -2 --db " + d.path);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--samples"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvb
