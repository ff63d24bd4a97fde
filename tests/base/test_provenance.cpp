// Provenance: git state of a real (temporary) repository, tolerance of a non-repository,
// timestamps.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "harness/store/build_info.h"
#include "harness/store/provenance.h"

namespace kvb {
namespace {

std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvb_prov_XXXXXX").string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

bool sh(const std::string& command) { return std::system(command.c_str()) == 0; }

TEST(StoreProvenance, GitStateOfADirectory) {
  if (!sh("git --version >/dev/null 2>&1")) GTEST_SKIP() << "git is not installed";
  const std::string dir = make_temp_dir();
  const std::string git = "git -C '" + dir + "' -c user.name=kvb -c user.email=kvb@example.com ";
  ASSERT_TRUE(sh(git + "init -q"));
  std::ofstream(dir + "/a.txt") << "one\n";
  ASSERT_TRUE(sh(git + "add a.txt && " + git + "commit -q -m init"));

  GitState clean = git_state_of(dir);
  // Compare with git's own answer, read independently.
  const std::string head_file = dir + "/head.out";
  ASSERT_TRUE(sh(git + "rev-parse HEAD > '" + head_file + "'"));
  std::string head;
  std::ifstream(head_file) >> head;
  std::filesystem::remove(head_file);
  EXPECT_EQ(clean.commit, head);
  ASSERT_TRUE(clean.dirty.has_value());
  EXPECT_FALSE(*clean.dirty);

  std::ofstream(dir + "/a.txt") << "two\n";
  GitState dirty = git_state_of(dir);
  EXPECT_EQ(dirty.commit, head);
  ASSERT_TRUE(dirty.dirty.has_value());
  EXPECT_TRUE(*dirty.dirty);

  // Provenance records the commit the binary was built from, whatever checkout the run starts in;
  // the checkout's other commit is recorded beside it.
  Provenance p = collect_provenance(dir);
  EXPECT_EQ(p.git_commit, build_info().git_commit);
  EXPECT_NE(p.git_commit, head);
  EXPECT_EQ(p.checkout_git_commit, head);
  EXPECT_EQ(p.kvbench_version, kvbench_version_string());
  std::filesystem::remove_all(dir);
}

TEST(StoreProvenance, VersionNamesTheProjectVersionAndTheBuildCommit) {
  const BuildInfo& b = build_info();
  const std::string v = kvbench_version_string();
  EXPECT_EQ(v.rfind(std::string(b.version) + "+" + b.git_commit, 0), 0u) << v;
  EXPECT_FALSE(std::string(b.version).empty());
  EXPECT_EQ(v.size() > 6 && v.substr(v.size() - 6) == ".dirty", b.git_dirty == 1) << v;
  EXPECT_GE(b.git_dirty, -1);
  EXPECT_LE(b.git_dirty, 1);
}

// cmake/build_info.cmake on a scratch repository and on a plain directory (a tarball): the commit, the
// dirty flag, "unknown", and no rewrite when nothing changed (so the object is not recompiled).
TEST(StoreProvenance, BuildInfoScriptRecordsTheTreeAndRewritesOnlyOnChange) {
  if (!sh("git --version >/dev/null 2>&1") || !sh("cmake --version >/dev/null 2>&1"))
    GTEST_SKIP() << "git or cmake is not installed";
  const std::string script = std::string(KVB_TEST_FIXTURES) + "/../../cmake/build_info.cmake";
  const std::string dir = make_temp_dir();
  const std::string out = dir + "/build_info.cpp";
  auto generate = [&](const std::string& src) {
    return sh("cmake -DSRC_DIR='" + src + "' -DOUT='" + out + "' -DVERSION=9.8.7 -P '" + script + "'");
  };
  auto text = [&] {
    std::ifstream in(out);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string plain = dir + "/tarball";
  std::filesystem::create_directories(plain);
  ASSERT_TRUE(generate(plain));
  EXPECT_NE(text().find("{\"9.8.7\", \"unknown\", -1}"), std::string::npos) << text();

  const std::string repo = dir + "/repo";
  std::filesystem::create_directories(repo);
  const std::string git = "git -C '" + repo + "' -c user.name=kvb -c user.email=kvb@example.com ";
  ASSERT_TRUE(sh(git + "init -q"));
  std::ofstream(repo + "/a.txt") << "one\n";
  ASSERT_TRUE(sh(git + "add a.txt && " + git + "commit -q -m init"));
  const std::string head = git_state_of(repo).commit;
  ASSERT_TRUE(generate(repo));
  EXPECT_NE(text().find("{\"9.8.7\", \"" + head + "\", 0}"), std::string::npos) << text();
  const auto written = std::filesystem::last_write_time(out);
  std::filesystem::last_write_time(out, written - std::chrono::hours(1));
  ASSERT_TRUE(generate(repo));
  EXPECT_EQ(std::filesystem::last_write_time(out), written - std::chrono::hours(1)) << "rewritten unchanged";
  std::ofstream(repo + "/a.txt") << "two\n";
  ASSERT_TRUE(generate(repo));
  EXPECT_NE(text().find("{\"9.8.7\", \"" + head + "\", 1}"), std::string::npos) << text();
  std::filesystem::remove_all(dir);
}

TEST(StoreProvenance, NotARepositoryIsUnknownNotAnError) {
  const std::string dir = make_temp_dir();
  GitState g = git_state_of(dir + "/it's missing");  // quote in the path: shell-safe
  EXPECT_EQ(g.commit, "unknown");
  EXPECT_FALSE(g.dirty.has_value());
  Provenance p = collect_provenance(dir + "/it's missing");
  EXPECT_EQ(p.checkout_git_commit, "");
  EXPECT_FALSE(p.compiler.empty());
  EXPECT_FALSE(p.host.empty());
  nlohmann::json j = p.to_json();
  EXPECT_EQ(j["git_commit"], build_info().git_commit);
  EXPECT_EQ(j["checkout_git_commit"], "");
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
  // Provenance written before checkout_git_commit and kvbench_version were recorded still loads.
  Provenance old = Provenance::from_json({{"git_commit", p.git_commit}, {"git_dirty", nullptr}});
  EXPECT_EQ(old.git_commit, p.git_commit);
  EXPECT_EQ(old.checkout_git_commit, "");
  EXPECT_EQ(old.kvbench_version, "");
  EXPECT_FALSE(old.git_dirty.has_value());
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
