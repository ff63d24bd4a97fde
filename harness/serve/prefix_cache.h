#pragma once
// A block-level prefix cache for trace-driven simulation of KV-cache reuse (Mooncake FAST'25 /
// vLLM automatic prefix caching / LMCache semantics): a block id identifies its whole prompt
// prefix, so a request reuses the leading blocks the cache holds and stops at the first one it
// lacks. Capacity is counted in blocks. Four eviction policies: LRU, LFU, FIFO and S3-FIFO.
// Torch-free.
//
// Rules shared by every policy (why: a deeper block is worthless without its parent, so when a
// choice is free the cache keeps prefixes whole):
//   - One lookup or insert call is one moment in time. Among the blocks one call touched, the
//   deeper
//     block of the prefix counts as the older one (vLLM frees a finished request's blocks tail
//     first, so its tail is evicted first).
//   - insert() admits a request's missing blocks deepest first, so that when the request alone
//     overflows the cache it is the deep end that falls out, not the prefix.
//   - insert() never evicts a block that the same call has touched and that is shallower than the
//     block being admitted (it skips the deeper block instead). Only LRU and LFU can run into this:
//     they treat insert() as a touch of the blocks already present.

#include <cstdint>
#include <list>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/common/enum_names.h"
#include "harness/formats/request_trace.h"

namespace kvb {

enum class CachePolicy { kLru, kLfu, kFifo, kS3Fifo };

inline constexpr EnumName<CachePolicy> kCachePolicies[] = {{CachePolicy::kLru, "lru"},
                                                           {CachePolicy::kLfu, "lfu"},
                                                           {CachePolicy::kFifo, "fifo"},
                                                           {CachePolicy::kS3Fifo, "s3fifo"}};

// Prefix-chained blocks: the id of block k stands for the whole prompt up to and including block k.
//
// Policies (recency and the call-ordering rule above apply to all of them):
//   kLru:    evicts the least recently touched block. lookup() touches the blocks it matched,
//            insert() touches every one of its first n blocks (present or new).
//   kLfu:    evicts the block with the fewest accesses, ties broken by least recent (then deeper
//            first). A new block starts at 1 access; each lookup() hit adds 1; insert() of a block
//            already present refreshes its recency but adds no access. No aging.
//   kFifo:   evicts in insertion order; neither lookup() nor insert() of a present block matters.
//   kS3Fifo: Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23. A small FIFO
//   S
//            (10% of capacity, at least 1 block), a main FIFO M (the rest) and a ghost FIFO G of
//            ids only, as long as M's capacity. A new block enters S with freq 0, or M when G
//            remembers it (checked at the miss, before the evictions that make room for it). A
//            lookup() hit sets freq = min(freq + 1, 3). Eviction takes from S when S holds at
//            least its 10% share (or M is empty), else from M. From S: the tail block moves to M's
//            head with its freq cleared (the authors' description) when it was hit at least once
//            since insertion (freq >= 1), else it is evicted and its id goes to G. From M: the tail
//            block is reinserted at M's head with freq - 1 while freq > 0, else evicted (M's
//            evictions do not enter G). Deviation from the paper's pseudocode: one eviction frees
//            exactly one block (when a move from S overfills M, the M eviction it triggers is the
//            one), so the cache never drops more than the insert needs.
class PrefixCache {
 public:
  // capacity_blocks < 0: unlimited; 0: holds nothing (every lookup misses, insert is a no-op).
  PrefixCache(int64_t capacity_blocks, CachePolicy policy);

  // How many leading blocks of hash_ids the cache holds (stops at the first miss: prefix
  // semantics). Counts as an access of the matched blocks (recency / frequency updated) and in
  // stats().
  int64_t lookup(const std::vector<int64_t>& hash_ids);

  // Makes the first n blocks of hash_ids resident: missing ones are inserted (evicting others as
  // the policy says); ones already present are not re-counted as accesses. n is clamped to
  // hash_ids.size(); n < 0 throws kvb::Error. When the blocks do not all fit, the deepest ones are
  // left out.
  void insert(const std::vector<int64_t>& hash_ids, int64_t n);

  bool contains(int64_t block_id) const;
  int64_t size_blocks() const;
  int64_t capacity_blocks() const;
  CachePolicy policy() const;

  struct Stats {
    int64_t lookups = 0;          // lookup() calls
    int64_t lookup_blocks = 0;    // blocks asked for by lookup()
    int64_t hit_blocks = 0;       // leading blocks lookup() found
    int64_t inserted_blocks = 0;  // blocks insert() made resident (present ones not counted)
    int64_t evicted_blocks = 0;   // blocks that left the cache (an S3-FIFO move from S to M is not)
  };
  const Stats& stats() const;

 private:
  // LRU / LFU / FIFO keep one ordered set: its first element is the next victim.
  struct Key {
    int64_t a = 0, b = 0, c = 0, id = 0;
    bool operator<(const Key& o) const {
      if (a != o.a) return a < o.a;
      if (b != o.b) return b < o.b;
      if (c != o.c) return c < o.c;
      return id < o.id;
    }
  };
  struct Block {
    int64_t tick = 0;   // the call that last touched (LRU, LFU) or inserted (FIFO, S3-FIFO) it
    int64_t depth = 0;  // its position in the hash_ids of that call
    int64_t freq = 0;   // LFU: accesses; S3-FIFO: hits since insertion or the last move, capped
  };

  Key key_of(int64_t id, const Block& b) const;
  void touch(int64_t id, Block& b, int64_t depth, bool count_access);
  // Frees one block; returns false (evicting nothing) when the victim is a block the current call
  // touched at a depth shallower than `depth` (the block the caller wants to admit).
  bool evict_one(int64_t depth);
  // remembered: S3-FIFO's ghost held the id when the miss happened.
  void admit(int64_t id, int64_t depth, bool remembered);
  // S3-FIFO steps.
  void s3_evict_small();
  void s3_evict_main();
  void s3_remember_ghost(int64_t id);

  int64_t capacity_;
  CachePolicy policy_;
  Stats stats_;
  int64_t tick_ = 0;  // one per lookup() / insert() call
  std::unordered_map<int64_t, Block> blocks_;
  std::set<Key> order_;  // LRU, LFU, FIFO
  // S3-FIFO: front = head (newest), back = tail (next to leave). Blocks only ever leave S and M
  // at the tail, so no per-block position is kept.
  int64_t small_capacity_ = 0, main_capacity_ = 0;
  std::list<int64_t> small_, main_, ghost_;
  std::unordered_map<int64_t, std::list<int64_t>::iterator> ghost_index_;
};

struct PrefixReplayResult {
  int64_t requests = 0;
  int64_t blocks = 0;        // sum of hash_ids sizes
  int64_t hit_blocks = 0;    // leading blocks found in the cache
  int64_t input_tokens = 0;  // sum of input_length
  int64_t hit_tokens = 0;    // tokens of the hit blocks (a request's last block may be partial)
  int64_t evicted_blocks = 0;
  double block_hit_rate() const;  // hit_blocks / blocks (0 when no blocks)
  double token_hit_rate() const;  // hit_tokens / input_tokens (0 when no tokens)
};

// Replays the trace in order: per request, lookup (hit = the leading blocks present), then insert
// all of the request's blocks. Hit tokens of k hit blocks: min(input_length, k * block_size) (the
// last block of a request may be partial: input_length - (n-1) * block_size tokens). Throws
// kvb::Error when trace.block_size_tokens < 1.
PrefixReplayResult replay_prefix_cache(const RequestTrace& trace, int64_t capacity_blocks,
                                       CachePolicy policy);

}  // namespace kvb
