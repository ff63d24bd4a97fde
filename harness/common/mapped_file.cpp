#include "harness/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "harness/common/error.h"

namespace kvb {

namespace {

// Opens `path` for reading without blocking (a FIFO or a device would block open() until a writer
// came, forever) and refuses anything but a regular file. Returns the fd and fills *st.
int open_regular(const std::string& path, struct stat* st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  KVB_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    ::close(fd);
    KVB_FAIL(path, ": not a regular file");
  }
  return fd;
}

}  // namespace

void check_regular_file(const std::string& path) {
  struct stat st {};
  KVB_CHECK(::stat(path.c_str(), &st) == 0, path, ": cannot open: ", std::strerror(errno));
  KVB_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  struct stat st {};
  int fd = open_regular(path, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    KVB_CHECK(p != MAP_FAILED, path, ": mmap failed: ", std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
  struct stat st {};
  int fd = open_regular(path, &st);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    KVB_FAIL(path, ": ", size, " bytes, more than the ", max_bytes, " a text file may have");
  }
  std::string out(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      KVB_CHECK(n == 0, path, ": read error: ", std::strerror(err));
      break;  // the file shrank while read: what is there
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace kvb
