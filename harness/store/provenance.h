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
  std::string git_commit = "unknown";  // 40-hex HEAD of the source tree, or "unknown" without git
  std::optional<bool> git_dirty;  // uncommitted changes (untracked files count); empty: unknown
  std::string compiler;           // e.g. "gcc 12.2.0"
  std::string build_type;         // "release" (NDEBUG) or "debug", of the store library itself
  std::string host;               // gethostname()
  std::string os;                 // uname: sysname release machine
  std::string cpu_model;          // /proc/cpuinfo "model name", "" where unavailable
  std::string kvbench_version;    // filled by the caller (the binary knows its version)
  std::string torch_version;      // filled by the caller in torch code
  std::string cuda_version;       // filled by the caller; "" for CPU-only builds
  std::string device_name;        // filled by the caller, e.g. "NVIDIA H200" or "cpu"
  std::string collected_at;       // UTC ISO-8601
  nlohmann::json extra = nlohmann::json::object();  // anything else a caller wants to record

  nlohmann::json to_json() const;
  static Provenance from_json(const nlohmann::json& j);
};

// Fills the torch-free fields. `source_dir` is the kvbench checkout (the CLI passes its
// compile-time source directory). Never throws for a missing git binary or a directory that is not
// a repository: those give git_commit "unknown" and an empty git_dirty.
Provenance collect_provenance(const std::string& source_dir);

// UTC time as ISO-8601 with milliseconds, e.g. "2024-05-01T12:34:56.789Z". Sorting these strings
// sorts by time, which the results DB relies on.
std::string format_utc_iso8601(std::chrono::system_clock::time_point t);
std::string utc_now_iso8601();

// "host:pid": names the process that holds a run, for messages about runs left 'running'.
std::string worker_id();

}  // namespace kvb
