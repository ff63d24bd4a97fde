#pragma once
// ProcessIdentity: names a process well enough that another process can tell whether it still
// exists. A pid alone cannot: pids are reused, and the same pid on another machine (or in another
// container's pid namespace) is another process. So an identity also carries the machine it runs on
// (host name, kernel boot id, pid namespace) and the process's start time; a pid whose start time
// differs is a different process that reused the number.
//
// The results store uses it for run leases (results_db.h): a process that begins a run records its
// identity; another process on the same machine takes the run over only once that identity is
// gone. Across machines no such check is possible, and the lease's expiry decides instead.

#include <cstdint>
#include <string>

namespace kvb {

struct ProcessIdentity {
  std::string host;     // gethostname()
  std::string machine;  // host + kernel boot id + pid namespace: pids compare only within one
  int64_t pid = 0;
  int64_t start_ticks = 0;  // start time in clock ticks after boot (/proc/<pid>/stat field 22)

  std::string display() const { return host + ":" + std::to_string(pid); }  // "host:pid"
  bool operator==(const ProcessIdentity& o) const {
    return machine == o.machine && pid == o.pid && start_ticks == o.start_ticks;
  }
  bool operator!=(const ProcessIdentity& o) const { return !(*this == o); }
};

// The calling process. Computed once per process (again after fork(): the child is another one).
const ProcessIdentity& this_process();

// What can be said about `p` from here.
enum class Liveness {
  kAlive,         // same machine: the pid exists, is not a zombie, and started when `p` did
  kGone,          // same machine: no such pid, a zombie, or another process with the same pid
  kOtherMachine,  // cannot be checked from here (another host, kernel or pid namespace)
};
Liveness liveness_of(const ProcessIdentity& p);

// Why `p` is gone, for messages ("pid 123 no longer exists", "pid 123 is another process now").
std::string gone_reason(const ProcessIdentity& p);

// The start time of `pid` on this machine in clock ticks after boot, or -1 when there is no such
// process (or it is a zombie: exited, not yet reaped by its parent).
int64_t process_start_ticks(int64_t pid);

}  // namespace kvb
