// A full disk, for real and without root: kvbench runs under RLIMIT_FSIZE (setrlimit in the child;
// kvbench ignores SIGXFSZ itself, as a batch job under a scheduler's file size limit needs), so a
// write past the limit fails with EFBIG exactly where a full disk fails with ENOSPC. A baseline cache file that cannot be written fails the run with one line naming the file
// and leaves no temporary file; a results DB that cannot grow stops the grid with a non-zero exit,
// keeps every committed sample, and the run resumes (taken over from the dead process) once there
// is room, ending equal to a run that never lacked it.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/harness/grid_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using gridtest::dump_db;
using gridtest::read_file;
using gridtest::write_file;
using json = nlohmann::json;

// Runs kvbench with `args` under a file size limit of `limit_bytes`, SIGXFSZ at its default action
// (as a scheduler leaves it); returns the exit code (128 + signal when killed); stdout and stderr go
// to `out` and `err` ("-" for stdout: closed).
int run_limited(const std::vector<std::string>& args, rlim_t limit_bytes, const std::string& out,
                const std::string& err) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(e, 2);
    if (e != 2) ::close(e);
    if (out == "-") {
      ::close(1);
    } else {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      if (o != 1) ::close(o);
    }
    ::signal(SIGXFSZ, SIG_DFL);
    const struct rlimit lim = {limit_bytes, limit_bytes};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(126);
    std::vector<char*> argv;
    const std::string bin = test::kvbench_binary();
    argv.push_back(const_cast<char*>(bin.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Every file under `dir` whose name says it is a temporary one.
std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path());
  return out;
}

std::string stream_config(int window, int windows) {
  return R"({"model": ")" + test::models_dir() +
         R"(/stories260K", "method": "full", "protocol": {"name": "stream", "dataset": "tinystories-valid-sample", "window": )" +
         std::to_string(window) + R"(, "max_windows": )" + std::to_string(windows) +
         R"(, "prefill_tokens": 4}})";
}

TEST(DiskFull, ACacheFileThatCannotBeWrittenFailsTheRunNamingItAndLeavesNothingBehind) {
  const std::string dir = test::make_temp_dir("diskfull_cache");
  write_file(dir + "/run.json", stream_config(192, 3));
  const std::string db = dir + "/db.sqlite", cache = dir + "/cache";
  // A window's full-cache log-probabilities: 192 x 512 floats = 384 KiB, past the 200 KiB limit;
  // the DB stays below it.
  const int code = run_limited({"run", "-q", "-c", dir + "/run.json", "--db", db, "--cache-dir",
                                cache, "--data-dir", test::data_dir()},
                               200 * 1024, dir + "/out", dir + "/err");
  const std::string err = read_file(dir + "/err");
  EXPECT_EQ(code, 2) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;  // one line
  EXPECT_NE(err.find("kvbench: error: " + cache + "/"), std::string::npos) << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_TRUE(temp_files(dir).empty()) << temp_files(dir).front();
  {
    ResultsDb d(db);
    const auto runs = d.list_runs();
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].status, RunStatus::kFailed);
    EXPECT_NE(runs[0].error.find(cache + "/"), std::string::npos) << runs[0].error;
    EXPECT_FALSE(d.lease(runs[0].id).has_value());
  }
  // With room again the same command resumes the failed run and finishes it.
  auto again = test::run_kvbench("run -q -c " + dir + "/run.json --db " + db + " --cache-dir " +
                                 cache + " --data-dir " + test::data_dir());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  ResultsDb d(db);
  EXPECT_EQ(d.list_runs().at(0).status, RunStatus::kDone);
  EXPECT_EQ(d.sample_count(d.list_runs().at(0).id), 3);
}

// Results printed to a stdout that cannot take them (a full disk, here /dev/full; a file past the size
// limit; a closed stream) are an error naming standard output, not exit 0 with nothing written.
TEST(DiskFull, ResultsThatCannotBeWrittenToStdoutAreAnError) {
  const std::string dir = test::make_temp_dir("diskfull_stdout");
  const std::vector<std::string> args = {"methods"};
  const rlim_t unlimited = RLIM_INFINITY;
  EXPECT_EQ(run_limited(args, unlimited, dir + "/out", dir + "/err"), 0) << read_file(dir + "/err");
  ASSERT_GT(read_file(dir + "/out").size(), 1000u);  // the listing is larger than the limit below
  struct Case {
    std::string out;
    rlim_t limit;
    std::string says;
  };
  for (const Case& c : {Case{"/dev/full", unlimited, "No space left on device"},
                        Case{dir + "/small", 512, "File too large"}, Case{"-", unlimited, ""}}) {
    const int code = run_limited(args, c.limit, c.out, dir + "/err");
    const std::string err = read_file(dir + "/err");
    EXPECT_EQ(code, 2) << c.out << ": " << err;
    EXPECT_NE(err.find("kvbench: error: cannot write the results to standard output"), std::string::npos)
        << c.out << ": " << err;
    EXPECT_NE(err.find(c.says), std::string::npos) << c.out << ": " << err;
  }
}

TEST(DiskFull, ADbThatCannotGrowStopsTheGridKeepsItsSamplesAndARerunFinishes) {
  const std::string dir = test::make_temp_dir("diskfull_db");
  const int kWindows = 120;
  // Two cells; small windows, so that each cache file (32 x 512 floats) fits under the limit while
  // the DB's write-ahead log, one commit per sample, does not.
  write_file(dir + "/grid.json", R"({"name": "full", "base": )" + stream_config(32, kWindows) +
                                     R"(, "axes": {"method": ["full", "static"]}})");
  const std::string db = dir + "/db.sqlite", ref = dir + "/ref.sqlite";
  auto r = test::run_kvbench("grid -q -c " + dir + "/grid.json --db " + ref + " --data-dir " +
                             test::data_dir());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const int code = run_limited({"grid", "--progress", "lines", "-c", dir + "/grid.json", "--db", db,
                                "--data-dir", test::data_dir()},
                               160 * 1024, dir + "/out", dir + "/err");
  const std::string out = read_file(dir + "/out"), err = read_file(dir + "/err");
  EXPECT_EQ(code, 3) << err;
  EXPECT_NE(out.find("stopped for want of disk space with 1 not reached"), std::string::npos)
      << out;
  EXPECT_NE(out.find("FAILED #0"), std::string::npos) << out;
  EXPECT_NE(out.find("results DB " + db + ": "), std::string::npos) << out;
  EXPECT_NE(out.find("no room left to write it"), std::string::npos) << out;
  EXPECT_NE(err.find("grid: stopped: no room left to write"), std::string::npos) << err;
  EXPECT_TRUE(temp_files(dir).empty()) << temp_files(dir).front();
  int64_t kept = 0;
  {
    ResultsDb d(db);
    const auto runs = d.list_runs();
    ASSERT_EQ(runs.size(), 1u);  // the second cell was never started
    // Either failed with the DB named, or (the failure record itself found no room) still running
    // with a lease whose holder is gone: both resume.
    if (runs[0].status == RunStatus::kFailed) {
      EXPECT_NE(runs[0].error.find(db), std::string::npos) << runs[0].error;
    } else {
      ASSERT_EQ(runs[0].status, RunStatus::kRunning);
      ASSERT_TRUE(d.lease(runs[0].id).has_value());
      EXPECT_FALSE(d.lease(runs[0].id)->live);
      EXPECT_NE(out.find("stays 'running' and resumes"), std::string::npos) << out;
    }
    kept = d.sample_count(runs[0].id);
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, kWindows);
  }
  auto again = test::run_kvbench("grid -c " + dir + "/grid.json --db " + db + " --data-dir " +
                                 test::data_dir());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto a = dump_db(ref), b = dump_db(db);
  EXPECT_EQ(b.runs, a.runs);
  EXPECT_EQ(b.samples, a.samples);  // nothing lost, nothing duplicated
  EXPECT_EQ(b.metrics, a.metrics);
}

}  // namespace
}  // namespace kvb
