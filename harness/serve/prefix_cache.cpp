#include "harness/serve/prefix_cache.h"

#include <algorithm>
#include <iterator>

#include "harness/common/error.h"

namespace kvb {

namespace {
constexpr int64_t kS3MaxFreq = 3;  // the paper's two-bit counter
}  // namespace

PrefixCache::PrefixCache(int64_t capacity_blocks, CachePolicy policy)
    : capacity_(capacity_blocks < 0 ? -1 : capacity_blocks), policy_(policy) {
  if (policy_ == CachePolicy::kS3Fifo && capacity_ > 0) {
    // 10% for S, but at least one block, or a tiny cache would have no admission queue at all.
    small_capacity_ = std::max<int64_t>(1, capacity_ / 10);
    main_capacity_ = capacity_ - small_capacity_;
  }
}

PrefixCache::Key PrefixCache::key_of(int64_t id, const Block& b) const {
  // Smallest key = next victim. Within one call (equal tick) the deeper block goes first.
  if (policy_ == CachePolicy::kLfu) return Key{b.freq, b.tick, -b.depth, id};
  return Key{b.tick, -b.depth, 0, id};
}

void PrefixCache::touch(int64_t id, Block& b, int64_t depth, bool count_access) {
  switch (policy_) {
    case CachePolicy::kLru:
    case CachePolicy::kLfu:
      order_.erase(key_of(id, b));
      if (count_access && policy_ == CachePolicy::kLfu) ++b.freq;
      b.tick = tick_;
      b.depth = depth;
      order_.insert(key_of(id, b));
      break;
    case CachePolicy::kFifo:
      break;  // insertion order only
    case CachePolicy::kS3Fifo:
      if (count_access) b.freq = std::min(b.freq + 1, kS3MaxFreq);
      break;
  }
}

int64_t PrefixCache::lookup(const std::vector<int64_t>& hash_ids) {
  ++tick_;
  ++stats_.lookups;
  stats_.lookup_blocks += static_cast<int64_t>(hash_ids.size());
  int64_t matched = 0;
  for (int64_t id : hash_ids) {
    auto it = blocks_.find(id);
    if (it == blocks_.end()) break;  // a later block cannot be reused without this one
    touch(id, it->second, matched, /*count_access=*/true);
    ++matched;
  }
  stats_.hit_blocks += matched;
  return matched;
}

void PrefixCache::insert(const std::vector<int64_t>& hash_ids, int64_t n) {
  KVB_CHECK(n >= 0, "PrefixCache::insert: n must be >= 0, got ", n);
  n = std::min<int64_t>(n, static_cast<int64_t>(hash_ids.size()));
  if (capacity_ == 0 || n == 0) return;
  ++tick_;
  // Touch the present blocks first, so that admitting the missing ones cannot evict a parent that
  // this very request is about to reuse (LRU, LFU).
  for (int64_t i = 0; i < n; ++i) {
    auto it = blocks_.find(hash_ids[static_cast<size_t>(i)]);
    if (it != blocks_.end()) touch(it->first, it->second, i, /*count_access=*/false);
  }
  // Deepest first: when the request overflows the cache, its own deeper blocks are the ones pushed
  // out by its shallower ones, and the prefix stays.
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t id = hash_ids[static_cast<size_t>(i)];
    if (blocks_.count(id)) continue;
    // S3-FIFO: whether the ghost remembers the block is decided at the miss, before the evictions
    // that make room for it push more ids into the ghost (and possibly this one out).
    const bool remembered = ghost_index_.count(id) != 0;
    bool room = true;
    while (capacity_ > 0 && static_cast<int64_t>(blocks_.size()) >= capacity_) {
      if (!evict_one(i)) {
        room = false;
        break;
      }
    }
    if (room) admit(id, i, remembered);
  }
}

bool PrefixCache::evict_one(int64_t depth) {
  if (policy_ == CachePolicy::kS3Fifo) {
    if (!small_.empty() &&
        (static_cast<int64_t>(small_.size()) >= small_capacity_ || main_.empty())) {
      s3_evict_small();
    } else {
      s3_evict_main();
    }
    return true;
  }
  auto victim = order_.begin();
  const int64_t id = victim->id;
  const Block& b = blocks_.at(id);
  if (b.tick == tick_ && b.depth < depth) return false;  // a parent of the block being admitted
  order_.erase(victim);
  blocks_.erase(id);
  ++stats_.evicted_blocks;
  return true;
}

void PrefixCache::admit(int64_t id, int64_t depth, bool remembered) {
  Block& b = blocks_[id];
  b.tick = tick_;
  b.depth = depth;
  if (policy_ == CachePolicy::kS3Fifo) {
    b.freq = 0;
    auto ghost = ghost_index_.find(id);
    if (ghost != ghost_index_.end()) {
      ghost_.erase(ghost->second);
      ghost_index_.erase(ghost);
    }
    if (remembered) {
      // Evicted from S recently and back again: it has proven itself, skip the probation queue.
      main_.push_front(id);
    } else {
      small_.push_front(id);
    }
  } else {
    b.freq = 1;  // LFU: the insert is the first access
    order_.insert(key_of(id, b));
  }
  ++stats_.inserted_blocks;
}

void PrefixCache::s3_evict_small() {
  while (!small_.empty()) {
    const int64_t id = small_.back();
    Block& b = blocks_.at(id);
    if (b.freq >= 1) {
      // Hit at least once since it came in: promote, clearing the access bits.
      small_.pop_back();
      b.freq = 0;
      main_.push_front(id);
      if (static_cast<int64_t>(main_.size()) > main_capacity_) {
        s3_evict_main();
        return;
      }
    } else {
      small_.pop_back();
      blocks_.erase(id);
      ++stats_.evicted_blocks;
      s3_remember_ghost(id);
      return;
    }
  }
  s3_evict_main();  // every block of S went to M without M overflowing: M still has to give one
}

void PrefixCache::s3_evict_main() {
  // Terminates: every pass over a block lowers its freq, which is at most kS3MaxFreq.
  while (!main_.empty()) {
    const int64_t id = main_.back();
    Block& b = blocks_.at(id);
    if (b.freq > 0) {
      --b.freq;
      main_.splice(main_.begin(), main_, std::prev(main_.end()));
    } else {
      main_.pop_back();
      blocks_.erase(id);
      ++stats_.evicted_blocks;
      return;
    }
  }
}

void PrefixCache::s3_remember_ghost(int64_t id) {
  if (main_capacity_ <= 0) return;
  ghost_.push_front(id);
  ghost_index_[id] = ghost_.begin();
  while (static_cast<int64_t>(ghost_.size()) > main_capacity_) {
    ghost_index_.erase(ghost_.back());
    ghost_.pop_back();
  }
}

bool PrefixCache::contains(int64_t block_id) const { return blocks_.count(block_id) != 0; }
int64_t PrefixCache::size_blocks() const { return static_cast<int64_t>(blocks_.size()); }
int64_t PrefixCache::capacity_blocks() const { return capacity_; }
CachePolicy PrefixCache::policy() const { return policy_; }
const PrefixCache::Stats& PrefixCache::stats() const { return stats_; }

double PrefixReplayResult::block_hit_rate() const {
  return blocks > 0 ? static_cast<double>(hit_blocks) / static_cast<double>(blocks) : 0.0;
}

double PrefixReplayResult::token_hit_rate() const {
  return input_tokens > 0 ? static_cast<double>(hit_tokens) / static_cast<double>(input_tokens)
                          : 0.0;
}

PrefixReplayResult replay_prefix_cache(const RequestTrace& trace, int64_t capacity_blocks,
                                       CachePolicy policy) {
  const int64_t block_size = trace.block_size_tokens;
  KVB_CHECK(block_size >= 1, "replay_prefix_cache: trace block_size_tokens must be >= 1, got ",
            block_size);
  PrefixCache cache(capacity_blocks, policy);
  PrefixReplayResult r;
  for (const TraceRequest& req : trace.requests) {
    const int64_t n = static_cast<int64_t>(req.hash_ids.size());
    const int64_t hit = cache.lookup(req.hash_ids);
    ++r.requests;
    r.blocks += n;
    r.hit_blocks += hit;
    r.input_tokens += req.input_length;
    // Full blocks are block_size tokens; only the last one can be shorter.
    r.hit_tokens += std::min(req.input_length, hit * block_size);
    cache.insert(req.hash_ids, n);
  }
  r.evicted_blocks = cache.stats().evicted_blocks;
  return r;
}

}  // namespace kvb
