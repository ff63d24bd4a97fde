#pragma once
// A KV-block pool in POSIX shared memory that several processes on one machine map at once: the
// serve protocol's "shm" tier, standing in for TraCT's CXL shared memory (a rack-wide KV tier that
// prefill and decode workers reach by load/store, with no network stack). Labelled "CXL emulated by
// host shared memory" wherever its figures appear.
//
// Inside one shm_open object (/dev/shm/<name>):
//   header    geometry, a process-shared robust mutex, counters, the attached processes (<= 64)
//   index     an open-addressing table of max_blocks entries: key, state and generation (one atomic
//             word), owner pid, offset, size, checksum, holders (a bit per attached process), LRU
//             tick
//   bitmap    one bit per chunk of the data region (the allocator: first fit over chunks)
//   data      the blocks' bytes
//
// Ordering is explicit, as on non-coherent CXL memory where a store is not seen by another host
// until it is written back and the reader drops its stale copy:
//   writer   begin_write (under the mutex: an index entry in state WRITING, chunks allocated, LRU
//            blocks no one holds evicted for room) -> fill the bytes -> publish: checksum, write
//            the lines back (clflush + sfence), then a release store of state READY;
//   reader   acquire (lock-free: an acquire load of the state word, the process's holder bit set,
//            the state re-checked, so an evictor that raced sees the hold or the reader sees the
//            eviction) -> drop the cached lines (clflush) -> read -> verify the checksum ->
//            release.
// A block is visible only after that release store; nothing a writer did before it can be taken
// as valid.
//
// Crash safety (tests/base/test_shm_kv_pool.cpp kills real processes with SIGKILL):
//   - a writer killed before publishing leaves its entry in WRITING: never returned by acquire,
//     reclaimed (chunks freed) by the next writer that finds its owner dead;
//   - a process killed holding the mutex: the robust mutex hands the next locker EOWNERDEAD; it
//     rebuilds the chunk bitmap from the index, reclaims dead writers and dead readers' holds, and
//     marks the mutex consistent;
//   - a reader killed holding blocks: its holder bits are cleared when its process slot is reused
//   or
//     the mutex is recovered, so its blocks become evictable again.
// What is not protected: a process that scribbles over the mapping. The checksum catches torn or
// overwritten payloads (get() throws, naming the key); the index is trusted.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvb {

struct ShmPoolGeometry {
  int64_t data_bytes = int64_t{64} << 20;  // the blocks' region
  int64_t max_blocks = 4096;               // index entries (rounded up to a power of two)
  int64_t chunk_bytes = 4096;              // allocation granule
};

class ShmKvPool {
 public:
  // Creates `name` ("/kvb-..." as shm_open wants: one leading slash, no other) exclusively and
  // attaches to it. kvb::Error naming the pool if it exists or the geometry is out of range.
  static std::unique_ptr<ShmKvPool> create(const std::string& name, const ShmPoolGeometry& g);
  // Attaches to an existing pool, waiting up to timeout_ms for its creator to finish initialising.
  static std::unique_ptr<ShmKvPool> attach(const std::string& name, int timeout_ms = 5000);
  // Removes the name (mappings stay valid until each process unmaps). False when it did not exist.
  static bool unlink(const std::string& name);
  ~ShmKvPool();  // drops this process's holds and its slot, then unmaps
  ShmKvPool(const ShmKvPool&) = delete;
  ShmKvPool& operator=(const ShmKvPool&) = delete;

  // A block being written: fill data[0, bytes), then publish() (or abort()).
  struct Write {
    int64_t entry = -1;
    uint8_t* data = nullptr;  // null: the key is present already, or there is no room
    size_t bytes = 0;
    uint64_t version = 0;
  };
  Write begin_write(uint64_t key, size_t bytes);
  void publish(const Write& w);
  void abort(const Write& w);
  // begin_write + copy + publish. False when the key is present or no room could be made.
  bool put(uint64_t key, const void* data, size_t bytes);

  // A block held against eviction until release().
  struct Read {
    int64_t entry = -1;
    const uint8_t* data = nullptr;  // null: absent or not yet published
    size_t bytes = 0;
    uint64_t checksum = 0;
  };
  Read acquire(uint64_t key);
  // Drops the cache lines of r's bytes (a non-coherent reader's step before reading them).
  void invalidate(const Read& r) const;
  bool verify(const Read& r) const;  // the payload's checksum is the one published
  void release(const Read& r);
  // acquire + invalidate + copy into *out + verify + release. False when absent or unpublished;
  // kvb::Error naming the pool and key when the payload fails its checksum.
  bool get(uint64_t key, std::vector<uint8_t>* out);
  bool contains(uint64_t key) const;  // published

  struct Stats {
    int64_t published = 0, writing = 0, used_bytes = 0, capacity_bytes = 0;
    int64_t evictions = 0, reclaimed_writes = 0, reclaimed_holds = 0, recoveries = 0;
    int64_t attached = 0;
  };
  Stats stats() const;
  const std::string& name() const { return name_; }
  int slot() const { return slot_; }  // this process's slot (holder bit)

  struct Shared;  // the mapped layout (shm_kv_pool.cpp)

 private:
  friend struct ShmKvPoolTestAccess;  // tests: die holding the mutex
  ShmKvPool(std::string name, void* base, size_t bytes);
  void lock() const;
  void unlock() const;
  void recover_locked() const;          // after EOWNERDEAD
  int64_t reclaim_dead_locked() const;  // dead writers' entries and dead readers' holds
  bool evict_one_locked();
  int64_t find_locked(uint64_t key) const;  // entry index or -1
  int64_t alloc_chunks_locked(int64_t n);   // first chunk or -1
  void free_chunks_locked(int64_t first, int64_t n);

  std::string name_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  Shared* s_ = nullptr;
  int slot_ = -1;
};

// The payload checksum the pool publishes (64-bit, four lanes of 8-byte words).
uint64_t shm_block_checksum(const void* data, size_t bytes);

// Two real processes on this machine: a prefill-side writer (this process) publishes `repeats`
// blocks of value_bytes into a fresh private pool, a decode-side reader (a forked child) acquires
// each as soon as it is visible, reads it with the non-coherent protocol and verifies it byte for
// byte. GB/s are 1e9 payload bytes/s over the summed put (or get) calls (a put: allocate, copy,
// checksum, write back, release; a get: invalidate, copy, checksum). The latency comes from 64
// one-line blocks published after them: from just before the writer's publish to the reader
// seeing the block (CLOCK_MONOTONIC, one clock for both processes). copy_gbps: a plain memcpy of
// the same blocks in this process, the ceiling both rates are read against. kvb::Error when the
// reader fails, times out or reads a wrong byte.
struct ShmBandwidth {
  int64_t value_bytes = 0, repeats = 0;
  double put_gbps = 0, get_gbps = 0;
  double put_ms_p50 = 0, get_ms_p50 = 0;
  double visible_us_p50 = 0;  // publish -> visible to the other process
  double copy_gbps = 0;       // the ceiling, same run: memcpy between two private buffers
};
ShmBandwidth measure_shm_bandwidth(int64_t value_bytes, int repeats, uint64_t seed);

}  // namespace kvb
