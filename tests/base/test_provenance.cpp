// Provenance: git state of a real (temporary) repository, tolerance of a non-repository,
// timestamps.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/store/provenance.h"

namespace kvb {
namespace {

std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvb_prov_XXXXXX").string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

bool sh(const std::string& command) { return std::system(command.c_str()) == 0; }

TEST(StoreProvenance, GitCommitAndDirtyFlag) {
  if (!sh("git --version >/dev/null 2>&1")) GTEST_SKIP() << "git is not installed";
  const std::string dir = make_temp_dir();
  const std::string git = "git -C '" + dir + "' -c user.name=kvb -c user.email=kvb@example.com ";
  ASSERT_TRUE(sh(git + "init -q"));
  std::ofstream(dir + "/a.txt") << "one\n";
  ASSERT_TRUE(sh(git + "add a.txt && " + git + "commit -q -m init"));

  Provenance clean = collect_provenance(dir);
  // Compare with git's own answer, read independently.
  const std::string head_file = dir + "/head.out";
  ASSERT_TRUE(sh(git + "rev-parse HEAD > '" + head_file + "'"));
  std::string head;
  std::ifstream(head_file) >> head;
  std::filesystem::remove(head_file);
  EXPECT_EQ(clean.git_commit, head);
  ASSERT_TRUE(clean.git_dirty.has_value());
  EXPECT_FALSE(*clean.git_dirty);

  std::ofstream(dir + "/a.txt") << "two\n";
  Provenance dirty = collect_provenance(dir);
  EXPECT_EQ(dirty.git_commit, head);
  ASSERT_TRUE(dirty.git_dirty.has_value());
  EXPECT_TRUE(*dirty.git_dirty);
  std::filesystem::remove_all(dir);
}

TEST(StoreProvenance, NotARepositoryIsUnknownNotAnError) {
  const std::string dir = make_temp_dir();
  Provenance p = collect_provenance(dir + "/it's missing");  // quote in the path: shell-safe
  EXPECT_EQ(p.git_commit, "unknown");
  EXPECT_FALSE(p.git_dirty.has_value());
  EXPECT_FALSE(p.compiler.empty());
  EXPECT_FALSE(p.host.empty());
  nlohmann::json j = p.to_json();
  EXPECT_TRUE(j["git_dirty"].is_null());
  EXPECT_EQ(j["git_commit"], "unknown");
  std::filesystem::remove_all(dir);
}

TEST(StoreProvenance, JsonRoundTrip) {
  Provenance p;
  p.git_commit = "0123456789abcdef0123456789abcdef01234567";
  p.git_dirty = true;
  p.torch_version = "2.3.0";
  p.cuda_version = "12.4";
  p.device_name = "NVIDIA H200";
  p.extra = {{"argv", "kvbench run"}};
  Provenance q = Provenance::from_json(nlohmann::json::parse(p.to_json().dump()));
  EXPECT_EQ(q.git_commit, p.git_commit);
  ASSERT_TRUE(q.git_dirty.has_value());
  EXPECT_TRUE(*q.git_dirty);
  EXPECT_EQ(q.torch_version, "2.3.0");
  EXPECT_EQ(q.cuda_version, "12.4");
  EXPECT_EQ(q.device_name, "NVIDIA H200");
  EXPECT_EQ(q.extra["argv"], "kvbench run");
}

TEST(StoreProvenance, Iso8601Utc) {
  using namespace std::chrono;
  EXPECT_EQ(format_utc_iso8601(system_clock::time_point(milliseconds(0))),
            "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(format_utc_iso8601(system_clock::time_point(milliseconds(1700000000123LL))),
            "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(format_utc_iso8601(system_clock::time_point(milliseconds(-1))),
            "1969-12-31T23:59:59.999Z");
  // Shape "dddd-dd-ddTdd:dd:dd.dddZ" (no std::regex: it warns under the sanitizer build).
  const std::string now = utc_now_iso8601();
  const std::string shape = "0000-00-00T00:00:00.000Z";
  ASSERT_EQ(now.size(), shape.size()) << now;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == '0') {
      EXPECT_TRUE(now[i] >= '0' && now[i] <= '9') << now;
    } else {
      EXPECT_EQ(now[i], shape[i]) << now;
    }
  }
  EXPECT_GE(now, "2024-01-01T00:00:00.000Z");
}

}  // namespace
}  // namespace kvb
