// Where kvbench's code comes from: the dynamic loader never searches the working directory (a
// downloaded model or results folder may hold a libz.so.1 whose constructor would run), and a plugin
// named on the command line is the file the user named, not one found on the library path.
//
// An empty or relative entry in a binary's RUNPATH/RPATH means "the working directory" (or a path
// below it) to the loader, so every binary and shared library this build links is checked for one,
// and the binary is run from a directory holding a hostile copy of each library it needs.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/common/strings.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;

struct Shell {
  int exit_code = -1;
  std::string out;
};

// Runs `cmd` with sh; stdout captured, stderr to the same file.
Shell sh(const std::string& cmd) {
  Shell r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The lines of `readelf -d FILE` with `tag` (NEEDED, RUNPATH, RPATH), each entry's bracketed value.
std::vector<std::string> dynamic_entries(const std::string& file, const std::string& tag) {
  const Shell r = sh("readelf -d '" + file + "'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> out;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.find("(" + tag + ")") == std::string::npos) continue;
    const size_t open = line.find('['), close = line.rfind(']');
    if (open != std::string::npos && close > open) out.push_back(line.substr(open + 1, close - open - 1));
  }
  return out;
}

// The build's own ELF outputs: the kvbench binary, this test binary, the test plugins.
std::vector<std::string> built_binaries() {
  return {test::kvbench_binary(), fs::read_symlink("/proc/self/exe").string(), KVB_TEST_TOOL_PLUGIN,
          KVB_TEST_HOSTILE_LIBRARY};
}

TEST(LibraryPaths, NoRunpathEntryIsEmptyOrRelative) {
  for (const std::string& file : built_binaries()) {
    for (const char* tag : {"RUNPATH", "RPATH"}) {
      for (const std::string& value : dynamic_entries(file, tag)) {
        // An empty entry anywhere ("a::b", a leading or trailing ':') is the working directory.
        for (const std::string& e : split(value, ':')) {
          EXPECT_TRUE(starts_with(e, "/") || starts_with(e, "$ORIGIN") || starts_with(e, "${ORIGIN}"))
              << file << ": " << tag << " '" << value << "' has the entry '" << e
              << "', which the loader resolves against the working directory";
        }
      }
    }
  }
}

TEST(LibraryPaths, ALibraryInTheWorkingDirectoryIsNeverLoaded) {
  const std::string dir = test::make_temp_dir("hostile_cwd");
  const std::vector<std::string> needed = dynamic_entries(test::kvbench_binary(), "NEEDED");
  ASSERT_FALSE(needed.empty());
  for (const std::string& name : needed) fs::copy_file(KVB_TEST_HOSTILE_LIBRARY, dir + "/" + name);
  const std::string marker = dir + "/a-library-here-was-loaded";
  const Shell r = sh("cd '" + dir + "' && KVB_HOSTILE_MARKER='" + marker + "' '" +
                     test::kvbench_binary() + "' --version");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("kvbench "), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(marker)) << "kvbench loaded a library from its working directory";
}

TEST(LibraryPaths, ABarePluginNameIsTheFileInTheWorkingDirectoryNotOneOnTheLibraryPath) {
  const std::string dir = test::make_temp_dir("plugin_name");
  fs::create_directories(dir + "/cwd");
  fs::create_directories(dir + "/elsewhere");
  fs::copy_file(KVB_TEST_TOOL_PLUGIN, dir + "/cwd/p.so");
  // Another library of the same name earlier on the search path: dlopen("p.so") would take it.
  fs::copy_file(KVB_TEST_HOSTILE_LIBRARY, dir + "/elsewhere/p.so");
  const std::string marker = dir + "/the-other-p-was-loaded";
  const Shell r = sh("cd '" + dir + "/cwd' && KVB_HOSTILE_MARKER='" + marker + "' LD_LIBRARY_PATH='" + dir +
                     "/elsewhere' '" + test::kvbench_binary() + "' --plugin p.so fixture-tool");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"ok\": true"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(marker));
  const Shell missing = sh("cd '" + dir + "' && '" + test::kvbench_binary() + "' --plugin p.so methods");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("--plugin p.so: file not found"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace kvb
