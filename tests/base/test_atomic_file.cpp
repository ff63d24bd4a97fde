// write_file_atomically and the results DB when there is no room to write: the file appears whole
// or not at all, a failed write leaves no temporary file behind, and "no room" (ENOSPC from
// /dev/full, EFBIG past RLIMIT_FSIZE in a child process with SIGXFSZ ignored) is a DiskFullError
// naming the file, while the DB keeps everything committed before.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "harness/common/atomic_file.h"
#include "harness/common/disk_full_error.h"
#include "harness/store/config_hash.h"
#include "harness/store/results_db.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

bool exists(const std::string& p) {
  return std::filesystem::exists(std::filesystem::symlink_status(p));
}

// Runs `fn` in a child process under a file size limit of `limit` bytes (SIGXFSZ ignored, so a
// write past it fails with EFBIG); the child's exit status: 0 when `fn` threw DiskFullError naming
// `needle`, 1 for another exception, 2 when nothing was thrown.
int in_child_with_limit(rlim_t limit, const std::string& needle, const std::function<void()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim = {limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(3);
    try {
      fn();
    } catch (const DiskFullError& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "%s\n", e.what());
      ::_exit(what.find(needle) != std::string::npos ? 0 : 4);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "not a DiskFullError: %s\n", e.what());
      ::_exit(1);
    }
    ::_exit(2);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(AtomicFile, WritesWholeFilesAndReplacesAtomically) {
  const std::string dir = ptest::scratch_dir("atomic");
  const std::string path = dir + "/a.bin";
  write_file_atomically(path, std::string("first"));
  EXPECT_EQ(ptest::read_bytes(path), "first");
  const std::string big(3 << 20, 'x');
  write_file_atomically(path, big);
  EXPECT_EQ(ptest::read_bytes(path), big);
  EXPECT_FALSE(exists(atomic_temp_path(path)));
  EXPECT_NE(atomic_temp_path(path).find(std::to_string(::getpid())), std::string::npos);
}

TEST(AtomicFile, NoRoomIsDiskFullErrorAndLeavesNothingBehind) {
  const std::string dir = ptest::scratch_dir("atomic");
  const std::string path = dir + "/full.bin";
  // ENOSPC, as on a full disk: the temporary file is a symlink to /dev/full.
  if (exists("/dev/full")) {
    ASSERT_EQ(::symlink("/dev/full", atomic_temp_path(path).c_str()), 0);
    try {
      write_file_atomically(path, std::string(1 << 16, 'y'));
      ADD_FAILURE() << "no error";
    } catch (const DiskFullError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + ": cannot write: No space left on device"), std::string::npos)
          << what;
      EXPECT_EQ(what.find('\n'), std::string::npos);
    }
    EXPECT_FALSE(exists(atomic_temp_path(path)));
    EXPECT_FALSE(exists(path));
  }
  // EFBIG past the file size limit, and the old file stays as it was.
  write_file_atomically(path, std::string("old"));
  EXPECT_EQ(in_child_with_limit(64 * 1024, path + ": cannot write: File too large",
                                [&] { write_file_atomically(path, std::string(1 << 20, 'z')); }),
            0);
  EXPECT_EQ(ptest::read_bytes(path), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);  // no temporary left
  // Other failures are plain errors naming the file.
  ptest::expect_kvb_error([&] { write_file_atomically(dir + "/no/such/dir/f", std::string("x")); },
                          {dir + "/no/such/dir/f", "cannot create"});
}

TEST(AtomicFile, AResultsDbThatCannotGrowThrowsDiskFullErrorAndKeepsItsCommits) {
  const std::string path = ptest::scratch_dir("atomic") + "/db.sqlite";
  const nlohmann::json config = {{"method", "full"}, {"model", "m"}};
  RunSpec spec;
  spec.config_json = canonical_json(config);
  spec.config_hash = config_hash(config);
  int64_t id = 0;
  {
    ResultsDb db(path);
    id = db.begin_run(spec).id;
    db.add_sample(id, 0, "k0", R"({"x": 0})");
    db.fail_run(id, "handed to the child");
  }
  // The child resumes the run and writes samples until the write-ahead log reaches the limit.
  EXPECT_EQ(in_child_with_limit(256 * 1024, "results DB " + path + ": ",
                                [&] {
                                  ResultsDb db(path);
                                  db.begin_run(spec);
                                  const std::string pad(3000, 'p');
                                  for (int i = 1; i < 100000; ++i)
                                    db.add_sample(id, i, "k", "{\"pad\": \"" + pad + "\"}");
                                }),
            0);
  ResultsDb db(path);
  const int64_t kept = db.sample_count(id);
  EXPECT_GT(kept, 10);
  // Whole samples only, in order: the ones committed before the log could not grow.
  std::set<int64_t> want;
  for (int64_t i = 0; i < kept; ++i) want.insert(i);
  EXPECT_EQ(db.done_sample_indices(id), want);
  db.check_integrity();
  const RunInfo again = db.begin_run(spec);  // the child is gone: taken over
  EXPECT_FALSE(again.taken_over_from.empty());
  db.add_sample(id, static_cast<int>(kept), "k", "{}");
}

}  // namespace
}  // namespace kvb
