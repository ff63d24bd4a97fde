#pragma once
// What the binary was built from, fixed at build time (cmake/build_info.cmake writes the one source
// that defines it): provenance names the source of the code that ran, not whatever the checkout holds
// when a run starts, so a grid that runs while HEAD moves still records one commit.

#include <string>

namespace kvb {

struct BuildInfo {
  const char* version;     // the CMake project VERSION, e.g. "0.1.0"
  const char* git_commit;  // hex HEAD of the source tree at build time, or "unknown" (no git, a tarball)
  int git_dirty;           // 1: the tree had uncommitted changes (untracked files count), 0: clean, -1: unknown
};

const BuildInfo& build_info();

// "VERSION+COMMIT", "+COMMIT.dirty" when the tree had changes, "VERSION+unknown" without git: what
// `kvbench --version` prints and provenance's kvbench_version records.
std::string kvbench_version_string();

}  // namespace kvb
