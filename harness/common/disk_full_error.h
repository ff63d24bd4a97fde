#pragma once
// DiskFullError: a write failed because the file system (or the process's file size limit) has no
// room: ENOSPC, EDQUOT, EFBIG, or SQLite's SQLITE_FULL. It is a kvb::Error (one line naming the
// file) with a type of its own because what to do differs: a grid stops at once instead of failing
// every remaining cell the same way, leaving what it committed for a re-run once there is room.

#include <string>
#include <utility>

#include "harness/common/error.h"

namespace kvb {

class DiskFullError : public Error {
 public:
  explicit DiskFullError(std::string message) : Error(std::move(message)) {}
};

// Whether errno value `err` means "no room to write".
bool is_disk_full_errno(int err);

}  // namespace kvb
