// ShmKvPool (harness/serve/shm_kv_pool.h), the shared-memory KV tier, with real processes: blocks
// written by one process are read byte for byte by another; an unpublished block is invisible; LRU
// eviction skips held blocks; a corrupted payload fails its checksum naming the key; and crash
// safety under SIGKILL - a writer killed mid-block never leaves a block a reader takes as valid (a
// deterministic kill inside the fill, and random kills of a writing loop), a process killed holding
// the mutex is recovered from (EOWNERDEAD), a reader killed holding blocks does not pin them. The
// two-process measurement reports finite, positive rates. Every pool has a name of its own
// (pid + counter), unlinked at the end, so the file runs in parallel with anything.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/common/error.h"
#include "harness/serve/shm_kv_pool.h"

namespace kvb {

struct ShmKvPoolTestAccess {
  static void lock(ShmKvPool& p) { p.lock(); }
};

namespace {

std::string fresh_name() {
  static int n = 0;
  return "/kvb-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// Unlinks the pool's name at scope exit, also when an assertion returns early.
struct Unlinker {
  std::string name;
  ~Unlinker() { shm_unlink(name.c_str()); }
};

std::vector<uint8_t> pattern(uint64_t key, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  std::mt19937_64 rng(key * 7919 + 1);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

ShmPoolGeometry small(int64_t blocks, int64_t block_bytes) {
  ShmPoolGeometry g;
  g.chunk_bytes = 4096;
  g.data_bytes = blocks * block_bytes;
  g.max_blocks = 64;
  return g;
}

int wait_child(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

TEST(ShmKvPool, PutGetEvictAndHold) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(4, 8192));
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(pool->put(k, pattern(k, 8000).data(), 8000));
  EXPECT_FALSE(pool->put(2, pattern(2, 8000).data(), 8000));  // present already
  std::vector<uint8_t> out;
  ASSERT_TRUE(pool->get(1, &out));  // 1 is now the most recently used
  EXPECT_EQ(out, pattern(1, 8000));
  const ShmKvPool::Read held = pool->acquire(2);
  ASSERT_NE(held.data, nullptr);
  ASSERT_TRUE(pool->put(5, pattern(5, 8000).data(), 8000));  // evicts 3 (LRU, unheld)
  EXPECT_FALSE(pool->contains(3));
  EXPECT_TRUE(pool->contains(2));
  ASSERT_TRUE(pool->put(6, pattern(6, 8000).data(), 8000));  // 4 next; 2 is held
  EXPECT_FALSE(pool->contains(4));
  EXPECT_TRUE(pool->contains(2));
  EXPECT_TRUE(pool->verify(held));
  pool->release(held);
  const ShmKvPool::Stats st = pool->stats();
  EXPECT_EQ(st.published, 4);
  EXPECT_EQ(st.evictions, 2);
  EXPECT_EQ(st.used_bytes, 4 * 8192);
  EXPECT_FALSE(pool->get(3, &out));
  EXPECT_TRUE(out.empty());
  // A block larger than the pool never fits.
  EXPECT_FALSE(pool->put(9, pattern(9, 40000).data(), 40000));
}

TEST(ShmKvPool, NothingIsVisibleBeforeThePublish) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(4, 4096));
  auto reader = ShmKvPool::attach(name);
  ShmKvPool::Write w = pool->begin_write(7, 3000);
  ASSERT_NE(w.data, nullptr);
  std::memcpy(w.data, pattern(7, 3000).data(), 3000);
  EXPECT_EQ(reader->acquire(7).data, nullptr);
  EXPECT_FALSE(reader->contains(7));
  EXPECT_EQ(pool->stats().writing, 1);
  pool->publish(w);
  std::vector<uint8_t> out;
  ASSERT_TRUE(reader->get(7, &out));
  EXPECT_EQ(out, pattern(7, 3000));
  // An aborted write frees its room and never appears.
  ShmKvPool::Write a = pool->begin_write(8, 4096);
  ASSERT_NE(a.data, nullptr);
  pool->abort(a);
  EXPECT_FALSE(reader->contains(8));
  EXPECT_EQ(pool->stats().used_bytes, 4096);
}

TEST(ShmKvPool, ACorruptedPayloadFailsItsChecksumNamingTheKey) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(2, 4096));
  ASSERT_TRUE(pool->put(42, pattern(42, 4096).data(), 4096));
  ShmKvPool::Read r = pool->acquire(42);
  ASSERT_NE(r.data, nullptr);
  const_cast<uint8_t*>(r.data)[100] ^= 0x10;  // another process scribbling over the block
  EXPECT_FALSE(pool->verify(r));
  pool->release(r);
  std::vector<uint8_t> out;
  try {
    pool->get(42, &out);
    ADD_FAILURE() << "a corrupted block was returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block 42 failed its checksum"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(ShmKvPool, AnotherProcessReadsWhatThisOneWrote) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(16, 65536));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    try {
      auto w = ShmKvPool::attach(name);
      for (uint64_t k = 0; k < 12; ++k)
        if (!w->put(k, pattern(k, 50000 + k).data(), 50000 + k)) rc = 2;
    } catch (...) {
      rc = 3;
    }
    _exit(rc);
  }
  const int status = wait_child(child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::vector<uint8_t> out;
  for (uint64_t k = 0; k < 12; ++k) {
    ASSERT_TRUE(pool->get(k, &out)) << k;
    EXPECT_EQ(out, pattern(k, 50000 + k)) << k;
  }
  EXPECT_EQ(pool->stats().attached, 1);  // the child's slot went with it
}

// A writer dies (SIGKILL, raised by itself half-way through filling the block): the block was
// never published, so no reader sees it, and its room comes back.
TEST(ShmKvPool, AWriterKilledMidBlockLeavesNothingVisible) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(2, 65536));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto w = ShmKvPool::attach(name);
    ShmKvPool::Write b = w->begin_write(5, 65536);
    if (b.data) std::memcpy(b.data, pattern(5, 65536).data(), 30000);
    raise(SIGKILL);
    _exit(0);
  }
  const int status = wait_child(child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(pool->acquire(5).data, nullptr);
  EXPECT_FALSE(pool->contains(5));
  EXPECT_EQ(pool->stats().writing, 1);
  // The dead writer's room is reclaimed when it is needed: two full blocks fit again.
  ASSERT_TRUE(pool->put(6, pattern(6, 65536).data(), 65536));
  ASSERT_TRUE(pool->put(7, pattern(7, 65536).data(), 65536));
  const ShmKvPool::Stats st = pool->stats();
  EXPECT_EQ(st.writing, 0);
  EXPECT_EQ(st.reclaimed_writes, 1);
  // And the key itself can be written afresh.
  ASSERT_TRUE(pool->put(5, pattern(5, 4096).data(), 4096));
}

// Random kills of a process writing blocks as fast as it can (the fill is deliberately slow, so
// most kills land inside it). After each kill every block a reader can acquire must be complete.
TEST(ShmKvPool, RandomlyKilledWritersNeverLeaveATornBlock) {
  const std::string name = fresh_name();
  Unlinker u{name};
  const size_t bytes = 131072;
  auto pool = ShmKvPool::create(name, small(8, static_cast<int64_t>(bytes)));
  std::mt19937 rng(3);
  int64_t visible = 0, torn_candidates = 0;
  for (int round = 0; round < 12; ++round) {
    const uint64_t base = static_cast<uint64_t>(round) * 1000;
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto w = ShmKvPool::attach(name);
      for (uint64_t k = base;; ++k) {
        ShmKvPool::Write b = w->begin_write(k, bytes);
        if (!b.data) continue;
        const std::vector<uint8_t> p = pattern(k, bytes);
        for (size_t i = 0; i < bytes; ++i) {  // byte by byte: a long window to die in
          volatile uint8_t* d = b.data + i;
          *d = p[i];
        }
        w->publish(b);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 20000));
    kill(child, SIGKILL);
    wait_child(child);
    torn_candidates += pool->stats().writing;
    auto reader = ShmKvPool::attach(name);
    std::vector<uint8_t> out;
    for (uint64_t k = base; k < base + 1000; ++k) {
      if (!reader->get(k, &out)) continue;  // throws on a checksum mismatch
      ASSERT_EQ(out, pattern(k, bytes)) << "round " << round << " key " << k;
      visible++;
    }
  }
  EXPECT_GT(visible, 0);
  EXPECT_GT(torn_candidates, 0) << "no kill landed inside a write: the test proved nothing";
  RecordProperty("blocks_checked", std::to_string(visible));
  RecordProperty("kills_inside_a_write", std::to_string(torn_candidates));
}

TEST(ShmKvPool, AProcessKilledHoldingTheMutexIsRecoveredFrom) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(4, 4096));
  ASSERT_TRUE(pool->put(1, pattern(1, 4096).data(), 4096));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto w = ShmKvPool::attach(name);
    ShmKvPoolTestAccess::lock(*w);
    raise(SIGKILL);
    _exit(0);
  }
  wait_child(child);
  // The next locker gets EOWNERDEAD, rebuilds the index's derived state and carries on.
  ASSERT_TRUE(pool->put(2, pattern(2, 4096).data(), 4096));
  std::vector<uint8_t> out;
  ASSERT_TRUE(pool->get(1, &out));
  EXPECT_EQ(out, pattern(1, 4096));
  const ShmKvPool::Stats st = pool->stats();
  EXPECT_EQ(st.recoveries, 1);
  EXPECT_EQ(st.published, 2);
  EXPECT_EQ(st.used_bytes, 2 * 4096);
}

TEST(ShmKvPool, AReaderKilledHoldingBlocksDoesNotPinThem) {
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(2, 4096));
  ASSERT_TRUE(pool->put(1, pattern(1, 4096).data(), 4096));
  ASSERT_TRUE(pool->put(2, pattern(2, 4096).data(), 4096));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = ShmKvPool::attach(name);
    const bool ok = r->acquire(1).data && r->acquire(2).data;
    if (ok) raise(SIGKILL);
    _exit(1);
  }
  const int status = wait_child(child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child could not hold both blocks";
  // Both blocks are held by a dead process: room is made by dropping its holds.
  ASSERT_TRUE(pool->put(3, pattern(3, 4096).data(), 4096));
  EXPECT_EQ(pool->stats().reclaimed_holds, 2);
}

TEST(ShmKvPool, RefusesBadNamesAndForeignObjects) {
  EXPECT_THROW(ShmKvPool::create("no-slash", small(1, 4096)), Error);
  EXPECT_THROW(ShmKvPool::create("/a/b", small(1, 4096)), Error);
  EXPECT_THROW(ShmKvPool::attach(fresh_name()), Error);  // does not exist
  const std::string name = fresh_name();
  Unlinker u{name};
  auto pool = ShmKvPool::create(name, small(1, 4096));
  EXPECT_THROW(ShmKvPool::create(name, small(1, 4096)), Error);  // exists
  const std::string junk = fresh_name();
  Unlinker uj{junk};
  const int fd = shm_open(junk.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> garbage(16384, 0xab);
  ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  close(fd);
  try {
    ShmKvPool::attach(junk, 50);
    ADD_FAILURE() << "attached to garbage";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(junk), std::string::npos) << e.what();
  }
}

TEST(ShmKvPool, TwoProcessMeasurementReportsRealRates) {
  const ShmBandwidth bw = measure_shm_bandwidth(1 << 20, 4, 9);
  EXPECT_EQ(bw.value_bytes, 1 << 20);
  EXPECT_EQ(bw.repeats, 4);
  for (double x : {bw.put_gbps, bw.get_gbps, bw.put_ms_p50, bw.get_ms_p50, bw.copy_gbps}) {
    EXPECT_TRUE(std::isfinite(x));
    EXPECT_GT(x, 0);
  }
  EXPECT_GE(bw.visible_us_p50, 0);
  EXPECT_TRUE(std::isfinite(bw.visible_us_p50));
  RecordProperty("get_gbps", std::to_string(bw.get_gbps));
  RecordProperty("visible_us_p50", std::to_string(bw.visible_us_p50));
}

}  // namespace
}  // namespace kvb
