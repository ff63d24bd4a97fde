// Several `kvbench grid` processes on one grid and one results DB (run leases, results_db.h): each
// skips the cells another live process holds, says so, waits for them at the end, and takes a cell
// over only once its holder is gone. Real processes on the testbed model: three at once compute
// every run exactly once and all exit 0 with the DB equal to a single process's; a holder killed
// while another process waits for its cell has that cell taken over from its stored samples.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

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

constexpr int kWindows = 16;

// Four stream cells on stories260K, each of kWindows windows: long enough (about a second each)
// that processes started together meet on the same cells.
std::string write_grid(const std::string& dir) {
  const std::string cfg = dir + "/grid.json";
  write_file(
      cfg,
      R"({"name": "lease", "base": {"model": ")" + test::models_dir() +
          R"(/stories260K", "protocol": {"name": "stream", "dataset": "tinystories-valid-sample", "window": 192, "max_windows": )" +
          std::to_string(kWindows) + R"(, "prefill_tokens": 4}},
    "axes": {"method": ["full", "static", {"name": "paged", "params": {"block_size": [4, 16]}}]}})");
  return cfg;
}

std::vector<std::string> grid_argv(const std::string& cfg, const std::string& db) {
  return {test::kvbench_binary(),
          "grid",
          "--json",
          "--progress",
          "lines",
          "-c",
          cfg,
          "--db",
          db,
          "--data-dir",
          test::data_dir()};
}

int64_t stored_samples(const std::string& db) {
  if (!std::ifstream(db).good()) return 0;
  try {
    ResultsDb d(db);
    int64_t n = 0;
    for (const auto& r : d.list_runs()) n += d.sample_count(r.id);
    return n;
  } catch (const std::exception&) {
    return 0;
  }
}

template <typename Pred>
bool wait_until(Pred pred, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(GridLease, ThreeProcessesOnOneDbComputeEveryRunOnceAndAllExitZero) {
  const std::string dir = test::make_temp_dir("grid_lease3");
  const std::string cfg = write_grid(dir);
  const std::string ref_db = dir + "/ref.sqlite", db = dir + "/db.sqlite";
  auto ref = test::run_kvbench("grid -q -c " + cfg + " --db " + ref_db + " --data-dir " +
                               test::data_dir());
  ASSERT_EQ(ref.exit_code, 0) << ref.err;

  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p)
    pids.push_back(spawn(grid_argv(cfg, db), dir + "/out" + std::to_string(p),
                         dir + "/err" + std::to_string(p)));
  // The first to exit has waited for the others' cells: the whole grid is done by then.
  int status = 0;
  const pid_t first = ::waitpid(-1, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(
      dir + "/err" + std::to_string(std::find(pids.begin(), pids.end(), first) - pids.begin()));
  {
    ResultsDb d(db);
    const auto runs = d.list_runs();
    ASSERT_EQ(runs.size(), 4u);
    for (const auto& r : runs) EXPECT_EQ(r.status, RunStatus::kDone) << r.method;
  }
  int64_t computed = 0, ran = 0, held = 0;
  for (int p = 0; p < 3; ++p) {
    if (pids[p] != first) {
      EXPECT_EQ(wait_exit(pids[p]), 0) << read_file(dir + "/err" + std::to_string(p));
    }
    const json summary = json::parse(read_file(dir + "/out" + std::to_string(p)));
    EXPECT_EQ(summary["failed"], 0);
    EXPECT_EQ(summary["held"], 0);
    for (const auto& c : summary["cells"]) {
      computed += c["samples_computed"].get<int64_t>();
      ran += c["status"] == "ran";
    }
    const std::string err = read_file(dir + "/err" + std::to_string(p));
    for (size_t at = err.find("held elsewhere"); at != std::string::npos;
         at = err.find("held elsewhere", at + 1))
      held++;
  }
  EXPECT_EQ(ran, 4);                  // each cell ran in exactly one process
  EXPECT_EQ(computed, 4 * kWindows);  // and no sample was computed twice
  EXPECT_GT(held, 0);                 // the processes did meet on cells
  ResultsDb d(db);
  for (const auto& r : d.list_runs()) {
    EXPECT_EQ(r.attempts, 1) << r.method;  // never resumed or taken over
    EXPECT_TRUE(r.error.empty()) << r.error;
  }
  EXPECT_EQ(d.list_runs().size(), 4u);
  const auto a = dump_db(ref_db), b = dump_db(db);
  EXPECT_EQ(b.runs, a.runs);
  EXPECT_EQ(b.samples, a.samples);
  EXPECT_EQ(b.metrics, a.metrics);
}

TEST(GridLease, AKilledHoldersCellIsTakenOverByTheProcessWaitingForIt) {
  const std::string dir = test::make_temp_dir("grid_lease_kill");
  const std::string cfg = write_grid(dir);
  const std::string ref_db = dir + "/ref.sqlite", db = dir + "/db.sqlite";
  auto ref = test::run_kvbench("grid -q -c " + cfg + " --db " + ref_db + " --data-dir " +
                               test::data_dir());
  ASSERT_EQ(ref.exit_code, 0) << ref.err;

  // A holds the first cell; B starts once A has stored some of its samples, skips it, and runs the
  // rest; A is killed while B goes on, and B must take A's cell over, not redo or fail it.
  const pid_t a = spawn(grid_argv(cfg, db), dir + "/outA", dir + "/errA");
  ASSERT_TRUE(wait_until([&] { return stored_samples(db) >= 3; }, 120)) << read_file(dir + "/errA");
  const pid_t b = spawn(grid_argv(cfg, db), dir + "/outB", dir + "/errB");
  ASSERT_TRUE(wait_until(
      [&] { return read_file(dir + "/errB").find("held elsewhere") != std::string::npos; }, 120))
      << read_file(dir + "/errB");
  ::kill(a, SIGKILL);
  ASSERT_EQ(wait_exit(a), 128 + SIGKILL) << "A finished before it could be killed";
  ASSERT_EQ(wait_exit(b), 0) << read_file(dir + "/errB");

  const std::string err_b = read_file(dir + "/errB");
  EXPECT_NE(err_b.find("held by "), std::string::npos) << err_b;
  EXPECT_NE(err_b.find("taking over run"), std::string::npos) << err_b;
  EXPECT_NE(err_b.find("no longer exists"), std::string::npos) << err_b;
  const json summary = json::parse(read_file(dir + "/outB"));
  EXPECT_EQ(summary["failed"], 0);
  int64_t computed = 0;
  for (const auto& c : summary["cells"]) computed += c["samples_computed"].get<int64_t>();
  EXPECT_LT(computed, 4 * kWindows);  // A's stored samples were kept, not recomputed

  ResultsDb d(db);
  int taken_over = 0;
  for (const auto& r : d.list_runs()) {
    EXPECT_EQ(r.status, RunStatus::kDone) << r.method;
    taken_over += r.attempts == 2;
  }
  EXPECT_GE(taken_over, 1);
  const auto ra = dump_db(ref_db), rb = dump_db(db);
  EXPECT_EQ(rb.runs, ra.runs);
  EXPECT_EQ(rb.samples, ra.samples);  // none lost, none duplicated, the same outputs
  EXPECT_EQ(rb.metrics, ra.metrics);
}

}  // namespace
}  // namespace kvb
