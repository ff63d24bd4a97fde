// A results DB names a run's model by path (its config hash), so a checkpoint replaced in place with
// other weights (`kvbench train` into the same OUT) would leave the old weights' results standing as
// the new model's. A finished run is skipped only while its model's files are unchanged or, when they
// changed, while the model's content is the one the run recorded; otherwise the run is refused
// naming both contents, and the DB is left as it was.

#include <gtest/gtest.h>
#include <utime.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/store/results_db.h"
#include "tests/harness/grid_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;
using gridtest::write_file;

// Flips the sign of every float of the first tensor of a safetensors file: same size, other weights.
void negate_first_tensor(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), sizeof n);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json h = nlohmann::json::parse(header);
  std::string first;
  for (auto it = h.begin(); it != h.end(); ++it)
    if (it.key() != "__metadata__" && (first.empty() || it.key() < first)) first = it.key();
  const uint64_t a = h[first]["data_offsets"][0], b = h[first]["data_offsets"][1];
  ASSERT_EQ(h[first]["dtype"], "F32");
  std::string data(b - a, '\0');
  f.seekg(static_cast<std::streamoff>(8 + n + a));
  f.read(data.data(), static_cast<std::streamsize>(data.size()));
  for (size_t i = 3; i < data.size(); i += 4) data[i] = static_cast<char>(data[i] ^ 0x80);
  f.seekp(static_cast<std::streamoff>(8 + n + a));
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

TEST(StaleRuns, AFinishedRunOfAReplacedCheckpointIsRefusedNotSkipped) {
  const std::string dir = test::make_temp_dir("stale_runs");
  const std::string model = dir + "/model";
  fs::copy(test::models_dir() + "/stories260K-hf", model);
  write_file(dir + "/run.json", R"({"model": ")" + model +
                                    R"(", "method": "full", "protocol": {"name": "stream", "window": 32,
                                    "max_windows": 1, "prefill_tokens": 4}})");
  const std::string cmd = "run -c " + dir + "/run.json --db " + dir + "/db.sqlite --cache-dir " + dir +
                          "/cache --data-dir " + test::data_dir();
  auto first = test::run_kvbench(cmd);
  ASSERT_EQ(first.exit_code, 0) << first.err;

  // Files touched, content the same: loaded, compared, skipped.
  const std::string weights = model + "/model.safetensors";
  ASSERT_EQ(::utime(weights.c_str(), nullptr), 0);
  auto touched = test::run_kvbench(cmd);
  EXPECT_EQ(touched.exit_code, 0) << touched.err;
  EXPECT_NE(touched.err.find("already done"), std::string::npos) << touched.err;

  const auto size = fs::file_size(weights);
  negate_first_tensor(weights);
  ASSERT_EQ(fs::file_size(weights), size);
  auto replaced = test::run_kvbench(cmd);
  EXPECT_EQ(replaced.exit_code, 2) << replaced.err;
  EXPECT_NE(replaced.err.find("was computed from model " + model + " with other weights"), std::string::npos)
      << replaced.err;
  EXPECT_NE(replaced.err.find("Use another --db"), std::string::npos) << replaced.err;
  ResultsDb db(dir + "/db.sqlite");
  ASSERT_EQ(db.list_runs().size(), 1u);
  EXPECT_EQ(db.list_runs()[0].status, RunStatus::kDone);

  // Into another DB the new weights run as any model does.
  auto fresh = test::run_kvbench("run -c " + dir + "/run.json --db " + dir + "/new.sqlite --cache-dir " + dir +
                                 "/cache --data-dir " + test::data_dir());
  EXPECT_EQ(fresh.exit_code, 0) << fresh.err;
}

}  // namespace
}  // namespace kvb
