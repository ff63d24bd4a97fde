#include "harness/common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "harness/common/disk_full_error.h"
#include "harness/common/error.h"

namespace kvb {

bool is_disk_full_errno(int err) { return err == ENOSPC || err == EDQUOT || err == EFBIG; }

std::string atomic_temp_path(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

void throw_write_error(const std::string& path, const std::string& what, int err) {
  if (is_disk_full_errno(err))
    throw DiskFullError(detail::concat(path, ": ", what, ": ", std::strerror(err),
                                       " (no room left to write it; nothing was left behind)"));
  KVB_FAIL(path, ": ", what, ": ", std::strerror(err));
}

void make_directories(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      throw_write_error(prefix, "cannot create the directory", errno);
  }
  struct stat st {};
  KVB_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": not a directory");
}

void write_file_atomically(const std::string& path, const void* bytes, size_t size) {
  const std::string tmp = atomic_temp_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error(path, "cannot create " + tmp, errno);
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw_write_error(path, what, err);
  };
  const char* p = static_cast<const char*>(bytes);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    // A short count is retried: the next write reports why (ENOSPC, EFBIG) with -1.
    if (n < 0) fail("cannot write", errno);
    if (n == 0) fail("cannot write", ENOSPC);
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_write_error(path, "cannot write", err);  // e.g. a delayed ENOSPC on NFS
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_write_error(path, "cannot move " + tmp + " into place", err);
  }
}

}  // namespace kvb
