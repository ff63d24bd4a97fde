// The host twin of the demand-paged KV arena (kvb/kernels/virtual_memory.h): mmap reserves,
// mprotect plus a populating fault commits, madvise(MADV_DONTNEED) gives pages back, mincore says
// what is resident.

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "kvb/kernels/virtual_memory.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and we touch the pages
#endif

namespace kvb::kernels {

size_t host_os_page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::string host_transparent_hugepages_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  // "always [madvise] never": the bracketed word is the mode.
  const size_t a = line.find('['), b = line.find(']');
  if (a == std::string::npos || b == std::string::npos || b < a) return "";
  return line.substr(a + 1, b - a - 1);
}

namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

class HostVirtualArena final : public VirtualArena {
 public:
  HostVirtualArena(char* base, size_t bytes, size_t page_bytes)
      : base_(base), bytes_(bytes), page_(page_bytes) {}
  ~HostVirtualArena() override { munmap(base_, bytes_); }

  void* base() const override { return base_; }
  size_t reserved_bytes() const override { return bytes_; }
  size_t page_bytes() const override { return page_; }
  const char* backend() const override { return "host-mmap"; }
  int64_t commit_calls() const override { return calls_; }
  double commit_seconds() const override { return seconds_; }

  std::string commit(size_t offset, size_t bytes) override {
    if (std::string why = check(offset, bytes); !why.empty()) return why;
    if (bytes == 0) return "";
    const auto t0 = std::chrono::steady_clock::now();
    char* p = base_ + offset;
    if (mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) return errno_text("mprotect");
    // Fault every OS page in now: the page is committed as a whole, as a device maps it.
    if (madvise(p, bytes, MADV_POPULATE_WRITE) != 0) {
      if (errno != EINVAL) {
        const std::string why = errno_text("madvise(MADV_POPULATE_WRITE)");
        mprotect(p, bytes, PROT_NONE);
        return why;
      }
      // Kernels before 5.14: a read then a write of the same byte faults the page in and keeps
      // what a committed page already held.
      const size_t os = host_os_page_bytes();
      for (size_t i = 0; i < bytes; i += os) {
        volatile char* c = p + i;
        *c = *c;
      }
    }
    account(t0);
    return "";
  }

  std::string decommit(size_t offset, size_t bytes) override {
    if (std::string why = check(offset, bytes); !why.empty()) return why;
    if (bytes == 0) return "";
    const auto t0 = std::chrono::steady_clock::now();
    char* p = base_ + offset;
    if (madvise(p, bytes, MADV_DONTNEED) != 0) return errno_text("madvise(MADV_DONTNEED)");
    if (mprotect(p, bytes, PROT_NONE) != 0) return errno_text("mprotect");
    account(t0);
    return "";
  }

  int64_t resident_bytes(size_t offset, size_t bytes) const override {
    const size_t os = host_os_page_bytes();
    if (offset > bytes_ || bytes > bytes_ - offset) return -1;
    const size_t begin = offset / os * os, end = (offset + bytes + os - 1) / os * os;
    if (end <= begin) return 0;
    std::vector<unsigned char> vec((end - begin) / os);
    if (mincore(base_ + begin, end - begin, vec.data()) != 0) return -1;
    int64_t n = 0;
    for (unsigned char v : vec) n += v & 1;
    return n * static_cast<int64_t>(os);
  }

  int64_t huge_resident_bytes() const override {
    // /proc/self/smaps: a header line "start-end perms ..." per mapping, then "Key: value kB"
    // lines. Mappings inside our range count whole; one reaching past it (merged with a
    // neighbour) counts at most its overlap.
    std::ifstream f("/proc/self/smaps");
    if (!f) return 0;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(base_), hi = lo + bytes_;
    uintptr_t start = 0, end = 0;
    bool inside = false;
    int64_t total = 0;
    std::string line;
    while (std::getline(f, line)) {
      unsigned long long a = 0, b = 0;
      if (std::sscanf(line.c_str(), "%llx-%llx ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
        start = static_cast<uintptr_t>(a);
        end = static_cast<uintptr_t>(b);
        inside = start < hi && end > lo;
        continue;
      }
      if (!inside || line.rfind("AnonHugePages:", 0) != 0) continue;
      long long kb = 0;
      if (std::sscanf(line.c_str() + 14, "%lld", &kb) != 1) continue;
      const int64_t overlap = static_cast<int64_t>(std::min(end, hi) - std::max(start, lo));
      total += std::min<int64_t>(kb * 1024, overlap);
    }
    return total;
  }

 private:
  std::string check(size_t offset, size_t bytes) const {
    if (offset % page_ != 0 || bytes % page_ != 0)
      return "offset " + std::to_string(offset) + " / size " + std::to_string(bytes) +
             " not a multiple of the " + std::to_string(page_) + "-byte page";
    if (offset > bytes_ || bytes > bytes_ - offset)
      return "range [" + std::to_string(offset) + ", +" + std::to_string(bytes) + ") outside the " +
             std::to_string(bytes_) + "-byte reservation";
    return "";
  }
  void account(std::chrono::steady_clock::time_point t0) {
    ++calls_;
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  char* base_;
  size_t bytes_, page_;
  int64_t calls_ = 0;
  double seconds_ = 0;
};

}  // namespace

std::unique_ptr<VirtualArena> make_host_virtual_arena(size_t bytes, size_t page_bytes,
                                                      HugePages huge, std::string* error) {
  const size_t os = host_os_page_bytes();
  if (page_bytes == 0 || (page_bytes & (page_bytes - 1)) != 0 || page_bytes % os != 0) {
    *error = "page size " + std::to_string(page_bytes) +
             " bytes: must be a power of two and a multiple of the OS page (" + std::to_string(os) +
             " bytes)";
    return nullptr;
  }
  if (bytes == 0 || bytes > (size_t{1} << 46)) {
    *error = "reservation of " + std::to_string(bytes) + " bytes: must be in (0, 64 TiB]";
    return nullptr;
  }
  bytes = (bytes + page_bytes - 1) / page_bytes * page_bytes;
  // Over-reserve by one page and trim, so the base is aligned to the page (2 MiB pages need a
  // 2 MiB-aligned range for the OS to back them with huge pages).
  const size_t span = bytes + page_bytes;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    *error = errno_text("mmap (reserve)");
    return nullptr;
  }
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (r + page_bytes - 1) / page_bytes * page_bytes;
  if (aligned > r) munmap(raw, aligned - r);
  const uintptr_t tail = r + span - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  char* base = reinterpret_cast<char*>(aligned);
  const bool want_huge = huge == HugePages::kAuto && page_bytes >= (size_t{2} << 20);
  // Advice is best effort: a kernel without THP refuses it and the pages stay small (which
  // huge_resident_bytes() then reports).
  madvise(base, bytes, want_huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return std::make_unique<HostVirtualArena>(base, bytes, page_bytes);
}

}  // namespace kvb::kernels
