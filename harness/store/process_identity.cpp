#include "harness/store/process_identity.h"

#include <unistd.h>

#include <array>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

namespace kvb {

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string host_name_of_this_machine() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return std::string(buf.data());
}

// "pid:[4026531836]": two processes see each other's pids only inside one pid namespace.
std::string pid_namespace() {
  std::array<char, 128> buf{};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : "";
}

struct StatFields {
  char state = '?';
  int64_t start_ticks = -1;
};

// /proc/<pid>/stat: "pid (comm) state ppid ... starttime ...". comm may hold spaces and
// parentheses, so the fields are counted after the last ')'.
bool read_stat(int64_t pid, StatFields* out) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return false;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3 (state), f[19] is field 22 (starttime)
  std::string tok;
  while (f.size() < 20 && fields >> tok) f.push_back(tok);
  if (f.size() < 20 || f[0].empty()) return false;
  out->state = f[0][0];
  try {
    out->start_ticks = std::stoll(f[19]);
  } catch (...) {
    return false;
  }
  return true;
}

ProcessIdentity compute_this_process() {
  ProcessIdentity p;
  p.host = host_name_of_this_machine();
  const std::string boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string pid_ns = pid_namespace();
  // Without a boot id or namespace (no /proc) nothing can be checked: an empty machine compares
  // equal to no other, so leases fall back to their expiry.
  p.machine = boot_id.empty() || pid_ns.empty() ? "" : p.host + "|" + boot_id + "|" + pid_ns;
  p.pid = ::getpid();
  p.start_ticks = process_start_ticks(p.pid);
  return p;
}

}  // namespace

int64_t process_start_ticks(int64_t pid) {
  StatFields s;
  if (pid <= 0 || !read_stat(pid, &s)) return -1;
  if (s.state == 'Z' || s.state == 'X') return -1;  // exited: only its exit status is left
  return s.start_ticks;
}

const ProcessIdentity& this_process() {
  static std::mutex mutex;
  static ProcessIdentity cached;
  std::lock_guard<std::mutex> lock(mutex);
  if (cached.pid != ::getpid()) cached = compute_this_process();
  return cached;
}

Liveness liveness_of(const ProcessIdentity& p) {
  const ProcessIdentity& me = this_process();
  if (p.machine.empty() || p.machine != me.machine) return Liveness::kOtherMachine;
  if (p.pid == me.pid) return p.start_ticks == me.start_ticks ? Liveness::kAlive : Liveness::kGone;
  const int64_t ticks = process_start_ticks(p.pid);
  return ticks >= 0 && ticks == p.start_ticks ? Liveness::kAlive : Liveness::kGone;
}

std::string gone_reason(const ProcessIdentity& p) {
  const int64_t ticks = process_start_ticks(p.pid);
  if (ticks < 0) return "pid " + std::to_string(p.pid) + " no longer exists";
  return "pid " + std::to_string(p.pid) + " is another process now (started at tick " +
         std::to_string(ticks) + ", the holder at " + std::to_string(p.start_ticks) + ")";
}

}  // namespace kvb
