#include "harness/store/provenance.h"

#include "harness/store/build_info.h"

#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>

namespace kvb {
namespace {

// Single-quotes `s` for /bin/sh, so a source directory with spaces or quotes cannot break the
// command.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

// Runs `command` through popen and returns its stdout, or nullopt when it could not run or exited
// non-zero (no git, not a repository, ...).
std::optional<std::string> run_capture(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

bool is_hex_commit(const std::string& s) {
  if (s.size() != 40 && s.size() != 64) return false;  // SHA-1 or SHA-256 repositories
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string compiler_string() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return std::string(buf.data());
}

std::string os_string() {
  struct utsname u {};
  if (::uname(&u) != 0) return "unknown";
  return std::string(u.sysname) + " " + u.release + " " + u.machine;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return trim(line.substr(colon + 1));
    }
  }
  return "";
}

}  // namespace

nlohmann::json Provenance::to_json() const {
  nlohmann::json j;
  j["git_commit"] = git_commit;
  j["git_dirty"] = git_dirty.has_value() ? nlohmann::json(*git_dirty) : nlohmann::json(nullptr);
  j["checkout_git_commit"] = checkout_git_commit;
  j["compiler"] = compiler;
  j["build_type"] = build_type;
  j["host"] = host;
  j["os"] = os;
  j["cpu_model"] = cpu_model;
  j["kvbench_version"] = kvbench_version;
  j["torch_version"] = torch_version;
  j["cuda_version"] = cuda_version;
  j["device_name"] = device_name;
  j["collected_at"] = collected_at;
  j["extra"] = extra;
  return j;
}

Provenance Provenance::from_json(const nlohmann::json& j) {
  // Lenient on purpose: provenance written by older builds may lack fields, and must still load.
  Provenance p;
  auto str = [&](const char* key, std::string& field) {
    if (j.contains(key) && j[key].is_string()) field = j[key].get<std::string>();
  };
  str("git_commit", p.git_commit);
  if (j.contains("git_dirty") && j["git_dirty"].is_boolean())
    p.git_dirty = j["git_dirty"].get<bool>();
  str("checkout_git_commit", p.checkout_git_commit);
  str("compiler", p.compiler);
  str("build_type", p.build_type);
  str("host", p.host);
  str("os", p.os);
  str("cpu_model", p.cpu_model);
  str("kvbench_version", p.kvbench_version);
  str("torch_version", p.torch_version);
  str("cuda_version", p.cuda_version);
  str("device_name", p.device_name);
  str("collected_at", p.collected_at);
  if (j.contains("extra") && j["extra"].is_object()) p.extra = j["extra"];
  return p;
}

GitState git_state_of(const std::string& dir) {
  GitState g;
  const std::string git = "git -C " + shell_quote(dir.empty() ? "." : dir);
  if (auto head = run_capture(git + " rev-parse HEAD 2>/dev/null")) {
    std::string commit = trim(*head);
    if (is_hex_commit(commit)) {
      g.commit = commit;
      // --porcelain output is empty exactly when the tree matches HEAD (ignored files excluded).
      if (auto status = run_capture(git + " status --porcelain 2>/dev/null")) {
        g.dirty = !trim(*status).empty();
      }
    }
  }
  return g;
}

std::string kvbench_version_string() {
  const BuildInfo& b = build_info();
  std::string v = std::string(b.version) + "+" + b.git_commit;
  if (b.git_dirty == 1) v += ".dirty";
  return v;
}

Provenance collect_provenance(const std::string& checkout_dir) {
  Provenance p;
  const BuildInfo& b = build_info();
  p.git_commit = b.git_commit;
  if (b.git_dirty >= 0) p.git_dirty = b.git_dirty == 1;
  p.kvbench_version = kvbench_version_string();
  // Both are recorded when they differ: the build's commit is what ran, the checkout's says which
  // tree the run's configs and data scripts came from.
  const GitState checkout = git_state_of(checkout_dir);
  if (checkout.commit != "unknown" && checkout.commit != p.git_commit) p.checkout_git_commit = checkout.commit;
  p.compiler = compiler_string();
#ifdef NDEBUG
  p.build_type = "release";
#else
  p.build_type = "debug";
#endif
  p.host = host_name();
  p.os = os_string();
  p.cpu_model = cpu_model();
  p.collected_at = utc_now_iso8601();
  return p;
}

std::string format_utc_iso8601(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto since_epoch = t.time_since_epoch();
  auto secs = duration_cast<seconds>(since_epoch);
  auto millis = duration_cast<milliseconds>(since_epoch - secs).count();
  if (millis < 0) {  // times before 1970: floor, not truncate
    secs -= seconds(1);
    millis += 1000;
  }
  std::time_t tt = static_cast<std::time_t>(secs.count());
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[80];  // room for any int year, so the compiler can prove no truncation
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  return buf;
}

std::string utc_now_iso8601() { return format_utc_iso8601(std::chrono::system_clock::now()); }

std::string worker_id() { return host_name() + ":" + std::to_string(::getpid()); }

}  // namespace kvb
