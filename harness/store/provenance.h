#pragma once
// Provenance: where a result came from (code version, build, machine), stored with every run so a
// number in the results DB can be traced back and runs from different builds are never silently
// mixed. Torch-free: LibTorch/CUDA versions and the device name are filled in by the caller in
// torch code.

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace kvb {

struct Provenance {
  // The source the binary was built from (harness/store/build_info.h), not the checkout at run time.
  std::string git_commit = "unknown";  // hex HEAD of the source tree at build time, or "unknown" without git
  std::optional<bool> git_dirty;  // uncommitted changes at build time (untracked files count); empty: unknown
  // HEAD of the directory the run started in, where it is a git checkout at another commit than
  // git_commit (a binary older or newer than the checkout it runs in); "" when they agree or no git.
  std::string checkout_git_commit;
  std::string compiler;           // e.g. "gcc 12.2.0"
  std::string build_type;         // "release" (NDEBUG) or "debug", of the store library itself
  std::string host;               // gethostname()
  std::string os;                 // uname: sysname release machine
  std::string cpu_model;          // /proc/cpuinfo "model name", "" where unavailable
  std::string kvbench_version;    // kvbench_version_string(): project version + build commit
  std::string torch_version;      // filled by the caller in torch code
  std::string cuda_version;       // filled by the caller; "" for CPU-only builds
  std::string device_name;        // filled by the caller, e.g. "NVIDIA H200" or "cpu"
  std::string collected_at;       // UTC ISO-8601
  nlohmann::json extra = nlohmann::json::object();  // anything else a caller wants to record

  nlohmann::json to_json() const;
  static Provenance from_json(const nlohmann::json& j);
};

// The git state of a directory at run time. Never throws for a missing git binary or a directory
// that is not a repository: those give commit "unknown" and an empty dirty flag.
struct GitState {
  std::string commit = "unknown";
  std::optional<bool> dirty;
};
GitState git_state_of(const std::string& dir);

// Fills the torch-free fields: the build's commit and version (build_info.h), and checkout_git_commit
// from `checkout_dir` (the runner passes the current directory) when that checkout's HEAD is another
// commit.
Provenance collect_provenance(const std::string& checkout_dir);

// UTC time as ISO-8601 with milliseconds, e.g. "2024-05-01T12:34:56.789Z". Sorting these strings
// sorts by time, which the results DB relies on.
std::string format_utc_iso8601(std::chrono::system_clock::time_point t);
std::string utc_now_iso8601();

// "host:pid": names the process that holds a run, for messages about runs left 'running'.
std::string worker_id();

}  // namespace kvb
