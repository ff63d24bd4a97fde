#pragma once
// Demand-paged virtual memory for a KV cache (vAttention): a virtual address range reserved up
// front and never moved, whose physical pages are committed as the tokens that need them arrive and
// released when they go. Attention kernels then read one contiguous range per sequence, with no
// block table. Torch-free and CUDA-free here; the CUDA twin (cuMemAddressReserve / cuMemCreate /
// cuMemMap / cuMemSetAccess) is kernels/cuda/virtual_memory_cuda.h and has the same contract.
//
// Page granularity: every commit and decommit covers whole pages of page_bytes. Where the page is
// larger than the OS page (64 KiB or 2 MiB on a 4 KiB host), a commit faults in every OS page of it
// at once, so the physical memory grows in page_bytes steps exactly as a device's VMM commits it.
//
// Failures are returned as a non-empty string (the kernels' status convention), never thrown.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvb::kernels {

class VirtualArena {
 public:
  virtual ~VirtualArena() = default;
  // The first byte of the reserved range; aligned to page_bytes().
  virtual void* base() const = 0;
  virtual size_t reserved_bytes() const = 0;
  virtual size_t page_bytes() const = 0;
  // Makes the pages covering [offset, offset + bytes) readable, writable and physically backed.
  // offset and bytes must be multiples of page_bytes() inside the range. Committing a committed
  // page is a no-op. "" on success, else why not (the range is left as it was where possible).
  virtual std::string commit(size_t offset, size_t bytes) = 0;
  // Gives the pages covering [offset, offset + bytes) back (their contents are lost) and makes
  // them inaccessible again. Same alignment rules; decommitting an uncommitted page is a no-op.
  virtual std::string decommit(size_t offset, size_t bytes) = 0;
  // Physical bytes backing [offset, offset + bytes) as the OS or driver reports them (the host
  // arena asks mincore(2), page by OS page; the CUDA arena counts the physical allocations it has
  // mapped there). -1 when the OS will not say.
  virtual int64_t resident_bytes(size_t offset, size_t bytes) const = 0;
  // Of the resident bytes of the whole range, those the OS backs with huge pages (the host arena
  // reads AnonHugePages from /proc/self/smaps); 0 where huge pages are not a separate notion.
  virtual int64_t huge_resident_bytes() const = 0;
  // Calls and wall time spent in commit / decommit (the map and unmap latency vAttention hides).
  virtual int64_t commit_calls() const = 0;
  virtual double commit_seconds() const = 0;
  virtual const char* backend() const = 0;  // "host-mmap" | "cuda-vmm"
};

// How the host arena asks for huge pages.
enum class HugePages {
  kOff,   // never (MADV_NOHUGEPAGE on the range): the OS page is the physical unit
  kAuto,  // for pages of 2 MiB or more: transparent huge pages (MADV_HUGEPAGE) when the kernel
          // has them enabled; huge_resident_bytes() says what the OS really gave
};

// The host's virtual memory page (sysconf(_SC_PAGESIZE)).
size_t host_os_page_bytes();
// "always" | "madvise" | "never" | "" (unknown): /sys/kernel/mm/transparent_hugepage/enabled.
std::string host_transparent_hugepages_mode();

// Reserves `bytes` (rounded up to page_bytes) of host address space with mmap(PROT_NONE,
// MAP_NORESERVE): no memory is committed or charged until commit(). page_bytes must be a power of
// two and a multiple of the OS page. On failure returns null and sets *error.
std::unique_ptr<VirtualArena> make_host_virtual_arena(size_t bytes, size_t page_bytes,
                                                      HugePages huge, std::string* error);

}  // namespace kvb::kernels
