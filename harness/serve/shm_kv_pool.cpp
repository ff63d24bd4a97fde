#include "harness/serve/shm_kv_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <thread>
#include <unordered_map>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVB_SHM_X86 1
#endif

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/metrics/statistics.h"

namespace kvb {

namespace {

constexpr uint64_t kMagic = 0x316d68735f62766bULL;  // "kvb_shm1"
constexpr uint32_t kLayout = 1;
constexpr int kMaxProcs = 64;
constexpr uint64_t kLine = 64;
enum : uint64_t { kEmpty = 0, kWriting = 1, kReady = 2, kDead = 3 };

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

uint64_t state_of(uint64_t version) { return version & 3; }
uint64_t with_state(uint64_t version, uint64_t state) { return (version & ~uint64_t{3}) | state; }

// One index entry, a cache line pair of its own (a writer's flush of it touches nothing else).
struct alignas(64) Entry {
  std::atomic<uint64_t> version;  // generation << 2 | state
  std::atomic<uint64_t> key;
  std::atomic<int64_t> owner_pid;
  uint64_t first_chunk;
  uint64_t chunks;
  uint64_t bytes;
  uint64_t checksum;
  std::atomic<uint64_t> holders;  // a bit per attached process slot
  std::atomic<uint64_t> last_use;
};

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: spreads keys over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool process_alive(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // A killed child that nobody has reaped yet still answers kill(): ask /proc for zombies.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

#if KVB_SHM_X86
// CPUID leaf 7: EBX bit 23 CLFLUSHOPT, bit 24 CLWB.
bool cpu_has_leaf7_ebx(unsigned bit) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b >> bit) & 1u;
}
const bool kHasClwb = cpu_has_leaf7_ebx(24);
const bool kHasClflushopt = cpu_has_leaf7_ebx(23);

__attribute__((target("clwb"))) void lines_clwb(uintptr_t lo, uintptr_t hi) {
  for (uintptr_t a = lo; a < hi; a += kLine) _mm_clwb(reinterpret_cast<void*>(a));
}
__attribute__((target("clflushopt"))) void lines_clflushopt(uintptr_t lo, uintptr_t hi) {
  for (uintptr_t a = lo; a < hi; a += kLine) _mm_clflushopt(reinterpret_cast<void*>(a));
}
void lines_clflush(uintptr_t lo, uintptr_t hi) {
  for (uintptr_t a = lo; a < hi; a += kLine) _mm_clflush(reinterpret_cast<const void*>(a));
}
#endif

// Writes the lines of [p, p + n) back to memory, then fences: what a writer to non-coherent shared
// memory must do before its release store. CLWB (write back, keep the line) where the CPU has it,
// else CLFLUSHOPT, else CLFLUSH (the serialising legacy form).
void write_back(const void* p, size_t n) {
#if KVB_SHM_X86
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + n;
  if (kHasClwb)
    lines_clwb(lo, hi);
  else if (kHasClflushopt)
    lines_clflushopt(lo, hi);
  else
    lines_clflush(lo, hi);
  _mm_sfence();
#else
  (void)p;
  (void)n;
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Drops the lines of [p, p + n) from this core's caches (written back if dirty), so the next loads
// come from memory: what a reader of non-coherent shared memory does before reading a block.
void drop_lines(const void* p, size_t n) {
#if KVB_SHM_X86
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + n;
  if (kHasClflushopt)
    lines_clflushopt(lo, hi);
  else
    lines_clflush(lo, hi);
  _mm_mfence();
#else
  (void)p;
  (void)n;
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Waits politely: spins with yields for a while, then sleeps in short naps, so that a waiting
// process does not take the CPU from the one it waits for on a small machine.
void pause_wait(int64_t& spins) {
  if (++spins < 2000) {
    sched_yield();
  } else {
    timespec ts{0, 20000};  // 20 us
    nanosleep(&ts, nullptr);
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void check_name(const std::string& name) {
  KVB_CHECK(name.size() >= 2 && name.size() <= 200 && name[0] == '/' &&
                name.find('/', 1) == std::string::npos,
            "shm pool name '", name,
            "': must be '/' followed by 1-199 characters without another '/'");
}

}  // namespace

struct ShmKvPool::Shared {
  uint64_t magic;
  uint32_t layout;
  std::atomic<uint32_t> ready;
  uint64_t total_bytes, data_bytes, chunk_bytes, max_blocks, chunks;
  uint64_t entries_offset, bitmap_offset, data_offset;
  pthread_mutex_t mutex;
  std::atomic<uint64_t> tick;
  int64_t evictions, reclaimed_writes, reclaimed_holds, recoveries;
  std::atomic<int64_t> procs[kMaxProcs];  // pid per slot, 0 = free

  Entry* entries() {
    return reinterpret_cast<Entry*>(reinterpret_cast<char*>(this) + entries_offset);
  }
  uint64_t* bitmap() {
    return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(this) + bitmap_offset);
  }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(this) + data_offset; }
};

namespace {

// The per-object count of holds on each entry (the shared holder bit is one per process slot).
std::unordered_map<const ShmKvPool*, std::unordered_map<int64_t, int>>& local_holds() {
  static thread_local std::unordered_map<const ShmKvPool*, std::unordered_map<int64_t, int>> h;
  return h;
}

}  // namespace

uint64_t shm_block_checksum(const void* data, size_t bytes) {
  constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  const auto* b = static_cast<const uint8_t*>(data);
  uint64_t h[4] = {P1 + P2, P2, 0, 0 - P1};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, b + i + 8 * k, 8);
      h[k] = rotl(h[k] + w * P2, 31) * P1;
    }
  }
  uint64_t tail = 0;
  for (size_t j = 0; i + j < bytes; ++j) tail |= static_cast<uint64_t>(b[i + j]) << (8 * (j % 8));
  uint64_t out = rotl(h[0], 1) + rotl(h[1], 7) + rotl(h[2], 12) + rotl(h[3], 18);
  out = mix(out ^ mix(tail) ^ static_cast<uint64_t>(bytes));
  return out;
}

ShmKvPool::ShmKvPool(std::string name, void* base, size_t bytes)
    : name_(std::move(name)), base_(base), bytes_(bytes), s_(static_cast<Shared*>(base)) {}

std::unique_ptr<ShmKvPool> ShmKvPool::create(const std::string& name, const ShmPoolGeometry& g) {
  check_name(name);
  KVB_CHECK(g.chunk_bytes >= 64 && (g.chunk_bytes & (g.chunk_bytes - 1)) == 0, "shm pool ", name,
            ": chunk_bytes ", g.chunk_bytes, " (a power of two >= 64)");
  KVB_CHECK(g.data_bytes >= g.chunk_bytes && g.data_bytes <= (int64_t{1} << 40), "shm pool ", name,
            ": data_bytes ", g.data_bytes, " (one chunk to 1 TiB)");
  KVB_CHECK(g.max_blocks >= 1 && g.max_blocks <= (int64_t{1} << 24), "shm pool ", name,
            ": max_blocks ", g.max_blocks, " (1 to 2^24)");
  uint64_t max_blocks = 1;
  while (max_blocks < static_cast<uint64_t>(g.max_blocks)) max_blocks <<= 1;
  const uint64_t chunk = static_cast<uint64_t>(g.chunk_bytes);
  const uint64_t chunks = (static_cast<uint64_t>(g.data_bytes) + chunk - 1) / chunk;
  auto up = [](uint64_t n, uint64_t a) { return (n + a - 1) / a * a; };
  const uint64_t entries_offset = up(sizeof(Shared), 4096);
  const uint64_t bitmap_offset = up(entries_offset + max_blocks * sizeof(Entry), 64);
  const uint64_t data_offset = up(bitmap_offset + (chunks + 63) / 64 * 8, 4096);
  const uint64_t total = data_offset + chunks * chunk;

  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  KVB_CHECK(fd >= 0, "shm pool ", name, ": cannot create (", std::strerror(errno), ")");
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    KVB_FAIL("shm pool ", name, ": cannot size to ", total, " bytes (", std::strerror(e), ")");
  }
  // MAP_POPULATE: the pool is memory set aside up front (as a CXL pool is), so its pages are
  // faulted in here rather than inside the first writes.
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    KVB_FAIL("shm pool ", name, ": cannot map ", total, " bytes (", std::strerror(map_errno), ")");
  }
  // The object is zero-filled: every atomic starts at 0 and every entry is kEmpty.
  Shared* s = new (base) Shared();
  s->magic = kMagic;
  s->layout = kLayout;
  s->total_bytes = total;
  s->data_bytes = chunks * chunk;
  s->chunk_bytes = chunk;
  s->max_blocks = max_blocks;
  s->chunks = chunks;
  s->entries_offset = entries_offset;
  s->bitmap_offset = bitmap_offset;
  s->data_offset = data_offset;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int init = pthread_mutex_init(&s->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (init != 0) {
    munmap(base, total);
    shm_unlink(name.c_str());
    KVB_FAIL("shm pool ", name, ": cannot initialise its mutex (", std::strerror(init), ")");
  }
  for (uint64_t i = 0; i < max_blocks; ++i) new (&s->entries()[i]) Entry();
  write_back(base, data_offset);
  s->ready.store(1, std::memory_order_release);
  auto pool = std::unique_ptr<ShmKvPool>(new ShmKvPool(name, base, total));
  pool->lock();
  s->procs[0].store(getpid());
  pool->slot_ = 0;
  pool->unlock();
  return pool;
}

std::unique_ptr<ShmKvPool> ShmKvPool::attach(const std::string& name, int timeout_ms) {
  check_name(name);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  KVB_CHECK(fd >= 0, "shm pool ", name, ": cannot open (", std::strerror(errno), ")");
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Shared))) {
    close(fd);
    KVB_FAIL("shm pool ", name, ": too small to be a pool (", st.st_size, " bytes)");
  }
  const size_t total = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  KVB_CHECK(base != MAP_FAILED, "shm pool ", name, ": cannot map (", std::strerror(map_errno), ")");
  auto pool = std::unique_ptr<ShmKvPool>(new ShmKvPool(name, base, total));
  Shared* s = pool->s_;
  const double deadline = now_s() + timeout_ms / 1e3;
  while (s->ready.load(std::memory_order_acquire) == 0) {
    KVB_CHECK(now_s() < deadline, "shm pool ", name, ": its creator did not finish within ",
              timeout_ms, " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  KVB_CHECK(s->magic == kMagic && s->layout == kLayout && s->total_bytes == total &&
                s->data_offset + s->data_bytes == total &&
                s->data_bytes == s->chunks * s->chunk_bytes,
            "shm pool ", name, ": not a kvbench pool of this layout (or corrupt)");
  pool->lock();
  pool->reclaim_dead_locked();
  for (int i = 0; i < kMaxProcs && pool->slot_ < 0; ++i) {
    if (s->procs[i].load() == 0) {
      s->procs[i].store(getpid());
      pool->slot_ = i;
    }
  }
  pool->unlock();
  KVB_CHECK(pool->slot_ >= 0, "shm pool ", name, ": ", kMaxProcs, " processes attached already");
  return pool;
}

bool ShmKvPool::unlink(const std::string& name) {
  check_name(name);
  return shm_unlink(name.c_str()) == 0;
}

ShmKvPool::~ShmKvPool() {
  local_holds().erase(this);
  if (slot_ >= 0) {
    try {
      lock();
      const uint64_t bit = uint64_t{1} << slot_;
      for (uint64_t i = 0; i < s_->max_blocks; ++i) s_->entries()[i].holders.fetch_and(~bit);
      s_->procs[slot_].store(0);
      unlock();
    } catch (...) {
      // A pool whose mutex cannot be taken is left as a dead process would leave it.
    }
  }
  munmap(base_, bytes_);
}

void ShmKvPool::lock() const {
  const int r = pthread_mutex_lock(&s_->mutex);
  if (r == EOWNERDEAD) {
    // Its last owner died inside: the index may be mid-update. Rebuild what can be derived.
    recover_locked();
    pthread_mutex_consistent(&s_->mutex);
    return;
  }
  KVB_CHECK(r == 0, "shm pool ", name_, ": its mutex failed (", std::strerror(r), ")");
}

void ShmKvPool::unlock() const { pthread_mutex_unlock(&s_->mutex); }

void ShmKvPool::recover_locked() const {
  s_->recoveries++;
  reclaim_dead_locked();
  // The bitmap follows from the live entries; a death between marking chunks and publishing the
  // entry (or the reverse) is undone here.
  uint64_t* bm = s_->bitmap();
  std::fill(bm, bm + (s_->chunks + 63) / 64, 0);
  for (uint64_t i = 0; i < s_->max_blocks; ++i) {
    const Entry& e = s_->entries()[i];
    const uint64_t st = state_of(e.version.load());
    if (st != kWriting && st != kReady) continue;
    for (uint64_t c = e.first_chunk; c < e.first_chunk + e.chunks && c < s_->chunks; ++c)
      bm[c / 64] |= uint64_t{1} << (c % 64);
  }
}

int64_t ShmKvPool::reclaim_dead_locked() const {
  uint64_t dead = 0;
  for (int i = 0; i < kMaxProcs; ++i) {
    const int64_t pid = s_->procs[i].load();
    if (pid != 0 && !process_alive(pid)) {
      dead |= uint64_t{1} << i;
      s_->procs[i].store(0);
    }
  }
  int64_t n = 0;
  auto* self = const_cast<ShmKvPool*>(this);
  for (uint64_t i = 0; i < s_->max_blocks; ++i) {
    Entry& e = s_->entries()[i];
    if (dead && (e.holders.load() & dead)) {
      e.holders.fetch_and(~dead);
      s_->reclaimed_holds++;
      n++;
    }
    const uint64_t v = e.version.load();
    if (state_of(v) == kWriting && !process_alive(e.owner_pid.load())) {
      // Its writer died before publishing: the bytes were never valid. Free them.
      e.version.store(with_state(v, kDead), std::memory_order_release);
      self->free_chunks_locked(static_cast<int64_t>(e.first_chunk), static_cast<int64_t>(e.chunks));
      s_->reclaimed_writes++;
      n++;
    }
  }
  return n;
}

int64_t ShmKvPool::find_locked(uint64_t key) const {
  const uint64_t mask = s_->max_blocks - 1;
  for (uint64_t n = 0, i = mix(key) & mask; n < s_->max_blocks; ++n, i = (i + 1) & mask) {
    const Entry& e = s_->entries()[i];
    const uint64_t st = state_of(e.version.load());
    if (st == kEmpty) return -1;
    if ((st == kWriting || st == kReady) && e.key.load() == key) return static_cast<int64_t>(i);
  }
  return -1;
}

int64_t ShmKvPool::alloc_chunks_locked(int64_t n) {
  const uint64_t* bm = s_->bitmap();
  const int64_t total = static_cast<int64_t>(s_->chunks);
  int64_t run = 0;
  for (int64_t c = 0; c < total; ++c) {
    if (run == 0 && c % 64 == 0 && bm[c / 64] == ~uint64_t{0}) {
      c += 63;  // a full word: skip it
      continue;
    }
    if (bm[c / 64] & (uint64_t{1} << (c % 64))) {
      run = 0;
      continue;
    }
    if (++run == n) {
      const int64_t first = c - n + 1;
      uint64_t* w = s_->bitmap();
      for (int64_t k = first; k <= c; ++k) w[k / 64] |= uint64_t{1} << (k % 64);
      return first;
    }
  }
  return -1;
}

void ShmKvPool::free_chunks_locked(int64_t first, int64_t n) {
  uint64_t* w = s_->bitmap();
  for (int64_t k = first; k < first + n && k < static_cast<int64_t>(s_->chunks); ++k)
    w[k / 64] &= ~(uint64_t{1} << (k % 64));
}

bool ShmKvPool::evict_one_locked() {
  // Least recently used among the published blocks no process holds.
  std::vector<uint8_t> tried(s_->max_blocks, 0);
  for (;;) {
    int64_t victim = -1;
    uint64_t oldest = ~uint64_t{0};
    for (uint64_t i = 0; i < s_->max_blocks; ++i) {
      const Entry& e = s_->entries()[i];
      if (tried[i] || state_of(e.version.load()) != kReady || e.holders.load() != 0) continue;
      if (e.last_use.load() < oldest) {
        oldest = e.last_use.load();
        victim = static_cast<int64_t>(i);
      }
    }
    if (victim < 0) return false;
    tried[static_cast<size_t>(victim)] = 1;
    Entry& e = s_->entries()[victim];
    uint64_t v = e.version.load();
    if (state_of(v) != kReady) continue;
    // Claim it, then look for holders: a reader sets its bit before re-reading the version, so
    // either it sees the claim or we see its bit (both sequentially consistent).
    if (!e.version.compare_exchange_strong(v, with_state(v, kDead), std::memory_order_seq_cst))
      continue;
    if (e.holders.load(std::memory_order_seq_cst) != 0) {
      e.version.store(v, std::memory_order_seq_cst);  // held after all: put it back
      continue;
    }
    free_chunks_locked(static_cast<int64_t>(e.first_chunk), static_cast<int64_t>(e.chunks));
    s_->evictions++;
    return true;
  }
}

ShmKvPool::Write ShmKvPool::begin_write(uint64_t key, size_t bytes) {
  KVB_CHECK(bytes > 0, "shm pool ", name_, ": an empty block (key ", key, ")");
  const int64_t chunks = static_cast<int64_t>((bytes + s_->chunk_bytes - 1) / s_->chunk_bytes);
  if (chunks > static_cast<int64_t>(s_->chunks)) return {};
  lock();
  struct Unlock {
    const ShmKvPool* p;
    ~Unlock() { p->unlock(); }
  } unlock_at_exit{this};
  if (find_locked(key) >= 0) return {};
  int64_t first = alloc_chunks_locked(chunks);
  while (first < 0) {
    if (reclaim_dead_locked() == 0 && !evict_one_locked()) return {};
    first = alloc_chunks_locked(chunks);
  }
  // An entry: the first free (empty or dead) on the key's probe path; a full table gives one up.
  const uint64_t mask = s_->max_blocks - 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (uint64_t n = 0, i = mix(key) & mask; n < s_->max_blocks; ++n, i = (i + 1) & mask) {
      Entry& e = s_->entries()[i];
      const uint64_t v = e.version.load();
      if (state_of(v) != kEmpty && state_of(v) != kDead) continue;
      const uint64_t writing = (((v >> 2) + 1) << 2) | kWriting;
      e.key.store(key, std::memory_order_relaxed);
      e.owner_pid.store(getpid(), std::memory_order_relaxed);
      e.first_chunk = static_cast<uint64_t>(first);
      e.chunks = static_cast<uint64_t>(chunks);
      e.bytes = bytes;
      e.checksum = 0;
      e.holders.store(0, std::memory_order_relaxed);
      e.last_use.store(s_->tick.fetch_add(1), std::memory_order_relaxed);
      e.version.store(writing, std::memory_order_release);
      return {static_cast<int64_t>(i), s_->data() + first * s_->chunk_bytes, bytes, writing};
    }
    if (!evict_one_locked()) break;
  }
  free_chunks_locked(first, chunks);
  return {};
}

void ShmKvPool::publish(const Write& w) {
  KVB_ASSERT(w.entry >= 0 && w.data, "shm_kv_pool", "publish of a write that was not begun");
  Entry& e = s_->entries()[w.entry];
  KVB_ASSERT(e.version.load() == w.version, "shm_kv_pool", "entry ", w.entry,
             " changed under its writer");
  e.checksum = shm_block_checksum(w.data, w.bytes);
  // Non-coherent memory: the payload and the entry's fields reach memory before the flag does.
  write_back(w.data, w.bytes);
  write_back(&e, sizeof(Entry));
  e.version.store(with_state(w.version, kReady), std::memory_order_release);
  write_back(&e.version, sizeof(e.version));
}

void ShmKvPool::abort(const Write& w) {
  if (w.entry < 0 || !w.data) return;
  lock();
  Entry& e = s_->entries()[w.entry];
  if (e.version.load() == w.version) {
    e.version.store(with_state(w.version, kDead), std::memory_order_release);
    free_chunks_locked(static_cast<int64_t>(e.first_chunk), static_cast<int64_t>(e.chunks));
  }
  unlock();
}

bool ShmKvPool::put(uint64_t key, const void* data, size_t bytes) {
  Write w = begin_write(key, bytes);
  if (!w.data) return false;
  std::memcpy(w.data, data, bytes);
  publish(w);
  return true;
}

ShmKvPool::Read ShmKvPool::acquire(uint64_t key) {
  const uint64_t mask = s_->max_blocks - 1;
  const uint64_t bit = uint64_t{1} << slot_;
  for (uint64_t n = 0, i = mix(key) & mask; n < s_->max_blocks; ++n, i = (i + 1) & mask) {
    Entry& e = s_->entries()[i];
    const uint64_t v1 = e.version.load(std::memory_order_acquire);
    if (state_of(v1) == kEmpty) return {};
    if (state_of(v1) != kReady || e.key.load(std::memory_order_relaxed) != key) continue;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.version.load(std::memory_order_relaxed) != v1) continue;  // reused while we looked
    int& held = local_holds()[this][static_cast<int64_t>(i)];
    if (held == 0) e.holders.fetch_or(bit, std::memory_order_seq_cst);
    if (e.version.load(std::memory_order_seq_cst) != v1) {  // an evictor claimed it first
      if (held == 0) e.holders.fetch_and(~bit, std::memory_order_release);
      return {};
    }
    held++;
    e.last_use.store(s_->tick.fetch_add(1), std::memory_order_relaxed);
    return {static_cast<int64_t>(i), s_->data() + e.first_chunk * s_->chunk_bytes, e.bytes,
            e.checksum};
  }
  return {};
}

void ShmKvPool::invalidate(const Read& r) const {
  if (r.data) drop_lines(r.data, r.bytes);
}

bool ShmKvPool::verify(const Read& r) const {
  return r.data && shm_block_checksum(r.data, r.bytes) == r.checksum;
}

void ShmKvPool::release(const Read& r) {
  if (r.entry < 0 || !r.data) return;
  auto& holds = local_holds()[this];
  auto it = holds.find(r.entry);
  KVB_ASSERT(it != holds.end() && it->second > 0, "shm_kv_pool", "release of entry ", r.entry,
             " that this pool object does not hold");
  if (--it->second == 0) {
    holds.erase(it);
    s_->entries()[r.entry].holders.fetch_and(~(uint64_t{1} << slot_), std::memory_order_release);
  }
}

bool ShmKvPool::get(uint64_t key, std::vector<uint8_t>* out) {
  const Read r = acquire(key);
  if (!r.data) {
    out->clear();
    return false;
  }
  invalidate(r);
  out->assign(r.data, r.data + r.bytes);
  release(r);
  KVB_CHECK(shm_block_checksum(out->data(), out->size()) == r.checksum, "shm pool ", name_,
            ": block ", key, " failed its checksum (", r.bytes, " bytes)");
  return true;
}

bool ShmKvPool::contains(uint64_t key) const {
  const uint64_t mask = s_->max_blocks - 1;
  for (uint64_t n = 0, i = mix(key) & mask; n < s_->max_blocks; ++n, i = (i + 1) & mask) {
    const Entry& e = s_->entries()[i];
    const uint64_t v = e.version.load(std::memory_order_acquire);
    if (state_of(v) == kEmpty) return false;
    if (state_of(v) == kReady && e.key.load(std::memory_order_relaxed) == key) return true;
  }
  return false;
}

ShmKvPool::Stats ShmKvPool::stats() const {
  lock();
  Stats st;
  for (uint64_t i = 0; i < s_->max_blocks; ++i) {
    const Entry& e = s_->entries()[i];
    const uint64_t state = state_of(e.version.load());
    if (state == kReady) st.published++;
    if (state == kWriting) st.writing++;
    if (state == kReady || state == kWriting)
      st.used_bytes += static_cast<int64_t>(e.chunks * s_->chunk_bytes);
  }
  st.capacity_bytes = static_cast<int64_t>(s_->data_bytes);
  st.evictions = s_->evictions;
  st.reclaimed_writes = s_->reclaimed_writes;
  st.reclaimed_holds = s_->reclaimed_holds;
  st.recoveries = s_->recoveries;
  for (int i = 0; i < kMaxProcs; ++i) st.attached += s_->procs[i].load() != 0;
  unlock();
  return st;
}

// ---- two-process measurement ----

namespace {

constexpr int kMaxRepeats = 1024;
constexpr int kLatencyBlocks = 64;         // small blocks for the publish-to-visible latency
constexpr size_t kLatencyBlockBytes = 64;  // one cache line
constexpr uint64_t kLatencyKeyBase = uint64_t{1} << 40;

// What the reader child reports back, in an anonymous shared mapping made before the fork.
struct ReaderReport {
  std::atomic<int32_t> consumed;  // blocks taken so far, both phases
  std::atomic<int32_t> failed;
  double get_s[kMaxRepeats];
  double visible_us[kLatencyBlocks];
  char error[512];
};

void fill_block(std::vector<uint8_t>& buf, uint64_t seed, int i) {
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(i));
  for (size_t k = 0; k + 8 <= buf.size(); k += 8) {
    const uint64_t w = rng();
    std::memcpy(buf.data() + k, &w, 8);
  }
  for (size_t k = buf.size() / 8 * 8; k < buf.size(); ++k) buf[k] = static_cast<uint8_t>(k + 1);
}

// The reader: phase 1 takes `repeats` large blocks (timing each get), phase 2 kLatencyBlocks small
// ones (timing publish -> visible). Only _exit leaves: the parent's objects are not ours.
[[noreturn]] void run_reader(const std::string& name, int64_t value_bytes, int repeats,
                             uint64_t seed, ReaderReport* report, double timeout_s) {
  int status = 0;
  try {
    auto reader = ShmKvPool::attach(name);
    std::vector<uint8_t> got(static_cast<size_t>(value_bytes)),
        want(static_cast<size_t>(value_bytes));
    auto take = [&](uint64_t key) {
      const double deadline = now_s() + timeout_s;
      ShmKvPool::Read r;
      int64_t spins = 0;
      while (!(r = reader->acquire(key)).data) {
        if (now_s() > deadline) throw std::runtime_error("block never became visible");
        pause_wait(spins);
      }
      return r;
    };
    for (int i = 0; i < repeats; ++i) {
      const ShmKvPool::Read r = take(static_cast<uint64_t>(i));
      const double t0 = now_s();
      reader->invalidate(r);
      std::memcpy(got.data(), r.data, r.bytes);
      const bool ok = shm_block_checksum(got.data(), got.size()) == r.checksum;
      reader->release(r);
      report->get_s[i] = now_s() - t0;
      if (!ok) throw std::runtime_error("checksum mismatch");
      fill_block(want, seed, i);
      if (got != want) throw std::runtime_error("payload differs from what was written");
      report->consumed.store(i + 1, std::memory_order_release);
    }
    for (int i = 0; i < kLatencyBlocks; ++i) {
      const ShmKvPool::Read r = take(kLatencyKeyBase + static_cast<uint64_t>(i));
      const int64_t seen_ns = mono_ns();
      reader->invalidate(r);
      int64_t published_ns = 0;
      std::memcpy(&published_ns, r.data, 8);
      const bool ok = reader->verify(r);
      reader->release(r);
      if (!ok) throw std::runtime_error("checksum mismatch (latency block)");
      report->visible_us[i] = static_cast<double>(seen_ns - published_ns) / 1e3;
      report->consumed.store(repeats + i + 1, std::memory_order_release);
    }
  } catch (const std::exception& e) {
    std::snprintf(report->error, sizeof(report->error), "%s", e.what());
    report->failed.store(1);
    status = 1;
  }
  _exit(status);
}

}  // namespace

ShmBandwidth measure_shm_bandwidth(int64_t value_bytes, int repeats, uint64_t seed) {
  KVB_CHECK(value_bytes >= 16 && value_bytes <= (int64_t{1} << 32), "shm measurement: value_bytes ",
            value_bytes, " (16 B to 4 GiB)");
  KVB_CHECK(repeats >= 1 && repeats <= kMaxRepeats, "shm measurement: repeats ", repeats);
  static std::atomic<int> counter{0};
  const std::string name =
      "/kvb-bw-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1));
  ShmPoolGeometry g;
  g.chunk_bytes = 4096;
  g.data_bytes = 2 * ((value_bytes + g.chunk_bytes - 1) / g.chunk_bytes * g.chunk_bytes);
  g.max_blocks = 256;
  auto pool = ShmKvPool::create(name, g);
  auto* report = static_cast<ReaderReport*>(mmap(
      nullptr, sizeof(ReaderReport), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (report == MAP_FAILED) {
    ShmKvPool::unlink(name);
    KVB_FAIL("shm measurement: cannot map the report area (", std::strerror(errno), ")");
  }
  new (report) ReaderReport();
  const double timeout_s = 60;
  const pid_t child = fork();
  if (child < 0) {
    munmap(report, sizeof(ReaderReport));
    ShmKvPool::unlink(name);
    KVB_FAIL("shm measurement: fork failed (", std::strerror(errno), ")");
  }
  if (child == 0) run_reader(name, value_bytes, repeats, seed, report, timeout_s);

  std::vector<double> put_s;
  std::string failure;
  // One block in flight: block i is written once the reader has taken block i - 1.
  auto wait_consumed = [&](int n) {
    const double deadline = now_s() + timeout_s;
    int64_t spins = 0;
    while (report->consumed.load(std::memory_order_acquire) < n && !report->failed.load()) {
      if (now_s() > deadline) {
        failure = "the reader did not take block " + std::to_string(n - 1);
        return false;
      }
      pause_wait(spins);
    }
    return !report->failed.load();
  };
  std::vector<uint8_t> buf(static_cast<size_t>(value_bytes));
  for (int i = 0; i < repeats; ++i) {
    if (!wait_consumed(i)) break;
    fill_block(buf, seed, i);
    const double t0 = now_s();
    ShmKvPool::Write w = pool->begin_write(static_cast<uint64_t>(i), buf.size());
    if (!w.data) {
      failure = "no room for block " + std::to_string(i);
      break;
    }
    std::memcpy(w.data, buf.data(), buf.size());
    pool->publish(w);
    put_s.push_back(now_s() - t0);
  }
  for (int i = 0; i < kLatencyBlocks && failure.empty(); ++i) {
    if (!wait_consumed(repeats + i)) break;
    ShmKvPool::Write w =
        pool->begin_write(kLatencyKeyBase + static_cast<uint64_t>(i), kLatencyBlockBytes);
    if (!w.data) {
      failure = "no room for latency block " + std::to_string(i);
      break;
    }
    std::memset(w.data, 0x5a, kLatencyBlockBytes);
    const int64_t published_ns = mono_ns();
    std::memcpy(w.data, &published_ns, 8);
    pool->publish(w);
  }
  if (failure.empty()) wait_consumed(repeats + kLatencyBlocks);
  // The ceiling in the same run: a plain copy between two private, already-touched buffers.
  std::vector<uint8_t> dst(buf.size(), 1);
  double copy_sum = 0;
  for (int i = 0; i < repeats && failure.empty(); ++i) {
    const double t0 = now_s();
    std::memcpy(dst.data(), buf.data(), buf.size());
    copy_sum += now_s() - t0;
    buf[static_cast<size_t>(i) % buf.size()] ^= dst[0];  // keep the copies observable
  }
  if (!failure.empty()) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  if (report->failed.load()) failure = std::string("the reader failed: ") + report->error;
  if (failure.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    failure = "the reader exited abnormally (status " + std::to_string(status) + ")";
  ShmBandwidth out;
  out.value_bytes = value_bytes;
  out.repeats = repeats;
  std::vector<double> get_s(report->get_s, report->get_s + repeats);
  std::vector<double> visible(report->visible_us, report->visible_us + kLatencyBlocks);
  munmap(report, sizeof(ReaderReport));
  pool.reset();
  ShmKvPool::unlink(name);
  KVB_CHECK(failure.empty(), "shm measurement (", value_bytes, "-byte blocks): ", failure);
  double put_sum = 0, get_sum = 0;
  for (double s : put_s) put_sum += s;
  for (double s : get_s) get_sum += s;
  const double total = static_cast<double>(value_bytes) * repeats;
  out.put_gbps = put_sum > 0 ? total / put_sum / 1e9 : 0;
  out.copy_gbps = copy_sum > 0 ? total / copy_sum / 1e9 : 0;
  out.get_gbps = get_sum > 0 ? total / get_sum / 1e9 : 0;
  out.put_ms_p50 = percentile(put_s, 50) * 1e3;
  out.get_ms_p50 = percentile(get_s, 50) * 1e3;
  out.visible_us_p50 = percentile(visible, 50);
  return out;
}

}  // namespace kvb
