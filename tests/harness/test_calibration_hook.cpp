// The calibration hook through the runner: a calibrating method's artifact is computed before the
// run's first sample, recorded in the results DB's artifacts table (by the file's sha256, with its
// size and inputs) and named in the run's provenance; a second run of another setting of the same
// method reads the same file instead of computing it; a run whose calibration text is missing fails
// before any run row exists, naming the corpus.

#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

nlohmann::json duo_run(const std::string& cache_dir, double ratio, const std::string& corpus) {
  return resolve_run_config(
      {{"model", test::fixtures_dir() + "/../../models/kvb-testbed"},
       {"method",
        {{"name", "duo_attention"},
         {"params",
          {{"cache_dir", cache_dir},
           {"data_dir", test::data_dir()},
           {"calib_corpus", corpus},
           {"calib_samples", 4},
           {"calib_tokens", 128},
           {"sink_size", 8},
           {"recent_size", 32},
           {"head_compression_ratio", ratio}}}}},
       {"protocol", {{"name", "stream"}, {"window", 128}, {"max_windows", 1}, {"prefill_tokens", 96}}}});
}

TEST(CalibrationHook, RunnerRecordsTheArtifactAndReusesIt) {
  const std::string dir = test::make_temp_dir("calib_hook");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const RunOutcome a = execute_run(duo_run(dir + "/cache", 0.5, "tinystories-valid-sample"), db, env);
  const std::vector<Artifact> rows = db.list_artifacts("calibration");
  ASSERT_EQ(rows.size(), 1u);
  const Artifact& r = rows[0];
  EXPECT_EQ(r.hash, sha256_file_hex(r.path));
  EXPECT_EQ(r.bytes, static_cast<int64_t>(MappedFile(r.path).size()));
  const nlohmann::json meta = parse_json(r.meta_json, "artifact meta");
  EXPECT_EQ(meta.at("method"), "duo_attention");
  EXPECT_EQ(meta.at("config_hash"), a.config_hash);
  const auto run_a = db.find_run_by_hash(a.config_hash);
  ASSERT_TRUE(run_a.has_value());
  const nlohmann::json prov_a = parse_json(run_a->provenance_json, "provenance");
  EXPECT_EQ(prov_a.at("calibration").at("key"), meta.at("key"));
  EXPECT_EQ(prov_a.at("calibration").at("path"), r.path);
  EXPECT_FALSE(prov_a.at("calibration").at("from_cache").get<bool>());
  // Another split of the heads: the same calibration, read from its file (a new model object).
  const RunOutcome b = execute_run(duo_run(dir + "/cache", 0.25, "tinystories-valid-sample"), db, env);
  EXPECT_NE(b.config_hash, a.config_hash);
  const nlohmann::json prov_b =
      parse_json(db.find_run_by_hash(b.config_hash)->provenance_json, "provenance");
  EXPECT_EQ(prov_b.at("calibration").at("key"), meta.at("key"));
  EXPECT_TRUE(prov_b.at("calibration").at("from_cache").get<bool>());
  EXPECT_EQ(db.list_artifacts("calibration").size(), 1u);  // the same file, recorded once
  // Missing calibration text: one error naming it, and no run row.
  const size_t runs = db.list_runs().size();
  try {
    execute_run(duo_run(dir + "/cache", 0.5, "no-such-corpus"), db, env);
    FAIL() << "ran without its calibration text";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-corpus"), std::string::npos) << e.what();
  }
  EXPECT_EQ(db.list_runs().size(), runs);
}

}  // namespace
}  // namespace kvb
