// Block-level prefix cache: prefix semantics, each policy's eviction order on tiny caches, and the
// hit rates of replaying the Mooncake FAST'25 traces (checked against numbers measured elsewhere).

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "harness/common/mapped_file.h"
#include "harness/common/params.h"
#include "harness/formats/request_trace.h"
#include "harness/serve/prefix_cache.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

using test::expect_error;

constexpr CachePolicy kAllPolicies[] = {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kFifo,
                                        CachePolicy::kS3Fifo};
constexpr int64_t kMooncakeBlockTokens = 512;

// Capacity in blocks for a budget in tokens: floor(tokens / 512), e.g. 1M tokens = 1953 blocks.
int64_t blocks_for_tokens(int64_t tokens) { return tokens / kMooncakeBlockTokens; }

std::string trace_path(const std::string& name) {
  return test::data_dir() + "/mooncake-traces/" + name;
}

// Each trace is parsed once per test binary (a few hundred ms for both); nullptr when absent.
const RequestTrace* mooncake_trace(const std::string& name) {
  static std::map<std::string, std::unique_ptr<RequestTrace>> loaded;
  auto it = loaded.find(name);
  if (it != loaded.end()) return it->second.get();
  std::unique_ptr<RequestTrace> t;
  if (file_exists(trace_path(name)))
    t = std::make_unique<RequestTrace>(read_request_trace(trace_path(name)));
  return loaded.emplace(name, std::move(t)).first->second.get();
}

#define KVB_MOONCAKE_TRACE_OR_SKIP(var, name)     \
  const RequestTrace* var = mooncake_trace(name); \
  if (var == nullptr) GTEST_SKIP() << "no trace at " << trace_path(name);

int64_t distinct_blocks(const RequestTrace& t) {
  std::unordered_set<int64_t> ids;
  for (const auto& r : t.requests) ids.insert(r.hash_ids.begin(), r.hash_ids.end());
  return static_cast<int64_t>(ids.size());
}

TraceRequest request(int64_t input_length, std::vector<int64_t> hash_ids) {
  TraceRequest r;
  r.input_length = input_length;
  r.hash_ids = std::move(hash_ids);
  return r;
}

// ---- policy names ----

TEST(PrefixCachePolicy, NamesRoundTrip) {
  for (CachePolicy p : kAllPolicies)
    EXPECT_EQ(parse_enum(kCachePolicies, enum_name(kCachePolicies, p), "cache policy"), p);
  EXPECT_EQ(parse_enum(kCachePolicies, "s3fifo", "cache policy"), CachePolicy::kS3Fifo);
  EXPECT_STREQ(enum_name(kCachePolicies, CachePolicy::kLfu), "lfu");
}

TEST(PrefixCachePolicy, UnknownNameNamesValueHintAndAllowed) {
  // A config's value is checked against the table's names (with a hint) before anything parses it.
  const std::vector<ParamSpec> schema = {
      enum_param("prefix_policy", kCachePolicies, CachePolicy::kLru, "prefix store eviction")};
  expect_error(
      [&] {
        resolve_params(schema, {{"prefix_policy", "s3-fifo"}}, "config.protocol");
      },
      {"config.protocol.prefix_policy", "'s3-fifo'", "did you mean 's3fifo'",
       "lru, lfu, fifo, s3fifo"});
  EXPECT_EQ(resolve_params(schema, nlohmann::json::object(), "config.protocol")["prefix_policy"],
            "lru");
  expect_error([] { parse_enum(kCachePolicies, "s3-fifo", "cache policy"); },
               {"unknown cache policy 's3-fifo'", "lru, lfu, fifo, s3fifo"});
  expect_error([] { parse_enum(kCachePolicies, "", "cache policy"); },
               {"unknown cache policy ''", "allowed"});
  expect_error([] { parse_enum(kCachePolicies, "LRU", "cache policy"); },
               {"'LRU'"});  // names are case-sensitive
}

// ---- prefix semantics ----

TEST(PrefixCache, MatchStopsAtFirstMiss) {
  PrefixCache c(-1, CachePolicy::kLru);
  c.insert({1, 2, 3, 4}, 4);
  EXPECT_EQ(c.lookup({1, 2, 3, 4}), 4);
  EXPECT_EQ(c.lookup({1, 2, 3, 4, 5}), 4);
  EXPECT_EQ(c.lookup({1, 9, 3, 4}), 1);  // 3 and 4 are present but follow a miss
  EXPECT_EQ(c.lookup({9, 2, 3}), 0);
  EXPECT_EQ(c.lookup({}), 0);
  const auto& s = c.stats();
  EXPECT_EQ(s.lookups, 5);
  EXPECT_EQ(s.lookup_blocks, 4 + 5 + 4 + 3 + 0);
  EXPECT_EQ(s.hit_blocks, 4 + 4 + 1);
  EXPECT_EQ(s.inserted_blocks, 4);
  EXPECT_EQ(s.evicted_blocks, 0);
}

TEST(PrefixCache, InsertClampsCountsOnlyNewBlocksAndRejectsNegative) {
  PrefixCache c(-1, CachePolicy::kLfu);
  c.insert({5, 6, 7}, 2);
  EXPECT_TRUE(c.contains(5));
  EXPECT_TRUE(c.contains(6));
  EXPECT_FALSE(c.contains(7));
  c.insert({8}, 5);  // clamped to 1
  EXPECT_TRUE(c.contains(8));
  c.insert({5, 6, 7}, 3);  // 5 and 6 already there
  EXPECT_EQ(c.stats().inserted_blocks, 2 + 1 + 1);
  EXPECT_EQ(c.size_blocks(), 4);
  c.insert({5}, 0);
  EXPECT_EQ(c.size_blocks(), 4);
  expect_error([&] { c.insert({5}, -1); }, {"n must be >= 0", "-1"});
}

// A middle block evicted while a deeper one stays: the deeper one is not reusable.
TEST(PrefixCache, EvictedMiddleBlockCutsThePrefix) {
  PrefixCache c(3, CachePolicy::kLfu);
  c.insert({10, 11, 12}, 3);             // freq 1 each
  EXPECT_EQ(c.lookup({10, 11, 12}), 3);  // freq 2 each
  EXPECT_EQ(c.lookup({12}), 1);          // 12: freq 3 (an odd access, but the API allows it)
  c.insert({30}, 1);                     // victim: 11 (freq 2, deeper than 10 at equal recency)
  EXPECT_FALSE(c.contains(11));
  EXPECT_TRUE(c.contains(10));
  EXPECT_TRUE(c.contains(12));
  EXPECT_EQ(c.lookup({10, 11, 12}), 1);
}

TEST(PrefixCache, CapacityZeroHoldsNothing) {
  for (CachePolicy p : kAllPolicies) {
    SCOPED_TRACE(enum_name(kCachePolicies, p));
    PrefixCache c(0, p);
    c.insert({1, 2, 3}, 3);
    EXPECT_EQ(c.size_blocks(), 0);
    EXPECT_FALSE(c.contains(1));
    EXPECT_EQ(c.lookup({1, 2, 3}), 0);
    EXPECT_EQ(c.stats().inserted_blocks, 0);
    EXPECT_EQ(c.stats().evicted_blocks, 0);
    EXPECT_EQ(c.capacity_blocks(), 0);
    EXPECT_EQ(c.policy(), p);
  }
}

TEST(PrefixCache, NegativeCapacityIsUnlimited) {
  PrefixCache c(-7, CachePolicy::kFifo);
  EXPECT_LT(c.capacity_blocks(), 0);
  std::vector<int64_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  c.insert(ids, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(c.size_blocks(), 5000);
  EXPECT_EQ(c.stats().evicted_blocks, 0);
}

// ---- eviction order on tiny caches ----

// Three one-block prompts A, B, C, accessed so that FIFO, LRU and LFU each pick another victim:
// A is the oldest insert but recent and hot; B is the least recent; C is the least frequent.
TEST(PrefixCacheEviction, LruFifoLfuPickDifferentVictims) {
  const int64_t a = 1, b = 2, c = 3, d = 4;
  std::map<CachePolicy, int64_t> expected_victim = {
      {CachePolicy::kFifo, a}, {CachePolicy::kLru, b}, {CachePolicy::kLfu, c}};
  for (const auto& [policy, victim] : expected_victim) {
    SCOPED_TRACE(enum_name(kCachePolicies, policy));
    PrefixCache cache(3, policy);
    cache.insert({a}, 1);
    cache.insert({b}, 1);
    cache.insert({c}, 1);
    cache.lookup({b});
    cache.lookup({b});  // B: 3 accesses
    cache.lookup({c});  // C: 2 accesses, more recent than B
    cache.lookup({a});
    cache.lookup({a});  // A: 3 accesses, most recent
    cache.insert({d}, 1);
    EXPECT_EQ(cache.size_blocks(), 3);
    EXPECT_EQ(cache.stats().evicted_blocks, 1);
    for (int64_t id : {a, b, c, d}) EXPECT_EQ(cache.contains(id), id != victim) << "block " << id;
  }
}

TEST(PrefixCacheEviction, LfuBreaksFrequencyTiesByRecency) {
  PrefixCache c(2, CachePolicy::kLfu);
  c.insert({1}, 1);
  c.insert({2}, 1);
  c.lookup({2});
  c.lookup({1});  // both at 2 accesses; 2 is now the less recent
  c.insert({3}, 1);
  EXPECT_FALSE(c.contains(2));
  EXPECT_TRUE(c.contains(1));
  EXPECT_TRUE(c.contains(3));
}

// vLLM's rule: blocks touched together are equally recent, and the deeper one goes first.
TEST(PrefixCacheEviction, DeeperBlockGoesFirstAmongEqualRecency) {
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kFifo}) {
    SCOPED_TRACE(enum_name(kCachePolicies, p));
    PrefixCache c(3, p);
    c.insert({1, 2, 3}, 3);
    c.insert({9}, 1);
    EXPECT_FALSE(c.contains(3));
    c.insert({8}, 1);
    EXPECT_FALSE(c.contains(2));
    EXPECT_TRUE(c.contains(1));
  }
  // LRU: a lookup makes the whole matched prefix recent again, root last to go.
  PrefixCache lru(4, CachePolicy::kLru);
  lru.insert({1, 2}, 2);
  lru.insert({5}, 1);
  lru.lookup({1, 2});
  lru.insert({6, 7}, 2);  // evicts 5 (least recent)
  EXPECT_FALSE(lru.contains(5));
  lru.insert({20}, 1);  // now 1, 2 are older than 6, 7: evicts 2 before 1
  EXPECT_FALSE(lru.contains(2));
  EXPECT_TRUE(lru.contains(1));
}

// A request longer than the cache keeps its prefix, whatever the policy.
TEST(PrefixCacheEviction, OverlongRequestKeepsItsPrefix) {
  for (CachePolicy p : kAllPolicies) {
    SCOPED_TRACE(enum_name(kCachePolicies, p));
    PrefixCache c(2, p);
    c.insert({1, 2, 3, 4}, 4);
    EXPECT_TRUE(c.contains(1));
    EXPECT_TRUE(c.contains(2));
    EXPECT_FALSE(c.contains(3));
    EXPECT_FALSE(c.contains(4));
    EXPECT_EQ(c.lookup({1, 2, 3, 4}), 2);
  }
}

// LRU: making room for block 3 would evict its own parent 2, so 3 is left out.
TEST(PrefixCacheEviction, LruNeverEvictsAParentForItsChild) {
  PrefixCache c(2, CachePolicy::kLru);
  c.insert({1, 2}, 2);
  c.insert({1, 2, 3}, 3);
  EXPECT_TRUE(c.contains(1));
  EXPECT_TRUE(c.contains(2));
  EXPECT_FALSE(c.contains(3));
  EXPECT_EQ(c.stats().evicted_blocks, 0);
  EXPECT_EQ(c.stats().inserted_blocks, 2);
}

// Capacity 3: S holds 1 block, M 2, the ghost 2 ids. A one-hit wonder leaves before a block that
// was hit again, though it came in later; plain FIFO would evict the re-accessed one.
TEST(PrefixCacheEviction, S3FifoEvictsOneHitWonderFirst) {
  const int64_t a = 1, b = 2, c = 3, d = 4;
  PrefixCache s3(3, CachePolicy::kS3Fifo);
  PrefixCache fifo(3, CachePolicy::kFifo);
  for (PrefixCache* cache : {&s3, &fifo}) {
    cache->insert({a}, 1);
    cache->insert({b}, 1);
    cache->insert({c}, 1);
    cache->lookup({a});
    cache->insert({d}, 1);
  }
  EXPECT_TRUE(s3.contains(a));   // moved from S to M
  EXPECT_FALSE(s3.contains(b));  // one-hit wonder, to the ghost queue
  EXPECT_TRUE(s3.contains(c));
  EXPECT_TRUE(s3.contains(d));
  EXPECT_FALSE(fifo.contains(a));
  EXPECT_TRUE(fifo.contains(b));

  // b returns while the ghost remembers it: it goes straight to M, so a stream of new one-hit
  // blocks (which churn through S) does not push it out; without the ghost it would be gone.
  s3.insert({b}, 1);  // evicts c from S
  EXPECT_FALSE(s3.contains(c));
  for (int64_t id = 100; id < 110; ++id) s3.insert({id}, 1);
  EXPECT_TRUE(s3.contains(a));
  EXPECT_TRUE(s3.contains(b));
  EXPECT_TRUE(s3.contains(109));
  EXPECT_FALSE(s3.contains(108));
  EXPECT_EQ(s3.size_blocks(), 3);
}

// M is a FIFO with reinsertion: a block hit while in M survives one pass of the eviction hand.
TEST(PrefixCacheEviction, S3FifoMainQueueReinsertsAccessedBlocks) {
  const int64_t a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7;
  PrefixCache s3(3, CachePolicy::kS3Fifo);
  s3.insert({a}, 1);
  s3.insert({b}, 1);
  s3.insert({c}, 1);
  s3.lookup({a});
  s3.lookup({b});
  s3.lookup({c});
  // Full: S's tail a, b, c all were hit, so they move to M; M (2 blocks) overflows at c and gives
  // up its tail a, freq cleared by the move. Not remembered: M evictions skip the ghost.
  s3.insert({d}, 1);
  EXPECT_FALSE(s3.contains(a));
  EXPECT_TRUE(s3.contains(b));
  EXPECT_TRUE(s3.contains(c));
  s3.insert({e}, 1);  // S: d leaves to the ghost
  s3.insert({f}, 1);  // S: e leaves to the ghost
  s3.insert({d}, 1);  // ghost hit: d into M, f leaves S; S is empty now
  EXPECT_TRUE(s3.contains(d));
  EXPECT_FALSE(s3.contains(f));
  s3.lookup({b});  // b, the tail of M, gets a second chance
  s3.insert({g}, 1);
  EXPECT_TRUE(s3.contains(b));
  EXPECT_FALSE(s3.contains(c));
  EXPECT_TRUE(s3.contains(d));
  EXPECT_TRUE(s3.contains(g));
  EXPECT_FALSE(s3.contains(a));  // not in the ghost: it came back through S
}

// ---- replay on hand-made traces ----

TEST(PrefixReplay, CountsPartialLastBlockTokens) {
  RequestTrace t;
  t.block_size_tokens = 4;
  t.requests = {request(10, {1, 2, 3}),  // 3 blocks, the last of 2 tokens
                request(10, {1, 2, 3}),  // all hit: 10 tokens
                request(6, {1, 7}),      // 1 block hits: 4 tokens
                request(9, {1, 2, 8})};  // 2 blocks hit: 8 tokens
  PrefixReplayResult r = replay_prefix_cache(t, -1, CachePolicy::kLru);
  EXPECT_EQ(r.requests, 4);
  EXPECT_EQ(r.blocks, 11);
  EXPECT_EQ(r.hit_blocks, 3 + 1 + 2);
  EXPECT_EQ(r.input_tokens, 35);
  EXPECT_EQ(r.hit_tokens, 10 + 4 + 8);
  EXPECT_DOUBLE_EQ(r.block_hit_rate(), 6.0 / 11.0);
  EXPECT_DOUBLE_EQ(r.token_hit_rate(), 22.0 / 35.0);
  EXPECT_EQ(r.evicted_blocks, 0);

  PrefixReplayResult none = replay_prefix_cache(t, 0, CachePolicy::kLru);
  EXPECT_EQ(none.hit_blocks, 0);
  EXPECT_EQ(none.hit_tokens, 0);
  EXPECT_EQ(none.blocks, 11);

  PrefixReplayResult empty = replay_prefix_cache(RequestTrace{}, 10, CachePolicy::kLfu);
  EXPECT_EQ(empty.block_hit_rate(), 0.0);
  EXPECT_EQ(empty.token_hit_rate(), 0.0);

  t.block_size_tokens = 0;
  expect_error([&] { replay_prefix_cache(t, 10, CachePolicy::kLru); }, {"block_size_tokens", "0"});
}

TEST(PrefixReplay, UnlimitedHoldsEveryDistinctBlock) {
  SyntheticTraceConfig cfg;
  cfg.seed = 7;
  cfg.num_requests = 300;
  cfg.num_prefix_groups = 5;
  cfg.prefix_blocks = 6;
  cfg.group_fraction = 0.8;
  RequestTrace t = generate_synthetic_trace(cfg);
  const int64_t distinct = distinct_blocks(t);
  for (CachePolicy p : kAllPolicies) {
    SCOPED_TRACE(enum_name(kCachePolicies, p));
    PrefixCache c(-1, p);
    for (const auto& r : t.requests) c.insert(r.hash_ids, static_cast<int64_t>(r.hash_ids.size()));
    EXPECT_EQ(c.size_blocks(), distinct);
    EXPECT_EQ(c.stats().inserted_blocks, distinct);
  }
  PrefixReplayResult r = replay_prefix_cache(t, -1, CachePolicy::kLru);
  EXPECT_EQ(r.blocks - r.hit_blocks, distinct);  // every block misses exactly once
  EXPECT_GT(r.hit_blocks, 0);
}

// ---- the Mooncake traces ----
//
// Reference table (someone else's replay): hit rate with capacity floor(tokens / 512) blocks.
// The table's numbers are TOKEN hit rates: as block hit rates the infinite cells would be 0.366
// and 0.640, not 0.374 and 0.651.
struct ReferenceCell {
  int64_t tokens;  // capacity in tokens; -1 = infinite
  double conversation;
  double synthetic;
};
constexpr ReferenceCell kReferenceLru[] = {{-1, 0.374, 0.651},         {100'000, 0.042, 0.012},
                                           {1'000'000, 0.054, 0.142},  {3'000'000, 0.138, 0.315},
                                           {10'000'000, 0.291, 0.577}, {50'000'000, 0.371, 0.651}};
constexpr double kTol = 0.003;

// Our LRU differs from the table in two synthetic cells: 0.1M tokens gives 0.017 (table 0.012),
// 1M gives 0.145 (table 0.142). The table was made with a plain LRU that touches a request's blocks
// in prompt order, so that a prefix's root is the least recent and is evicted before its children
// (PlainLruReproducesTheReferenceTable below replays exactly that and matches every cell). Ours
// follows vLLM (deeper blocks evicted first among equal recency), which keeps more usable prefixes
// when the cache is smaller than a few requests. Other cells agree with the table within kTol.
double our_lru_expected(const ReferenceCell& cell, bool synthetic) {
  if (synthetic && cell.tokens == 100'000) return 0.0171;
  if (synthetic && cell.tokens == 1'000'000) return 0.1451;
  return synthetic ? cell.synthetic : cell.conversation;
}

void expect_lru_table(const RequestTrace& t, bool synthetic) {
  for (const ReferenceCell& cell : kReferenceLru) {
    const int64_t cap = cell.tokens < 0 ? -1 : blocks_for_tokens(cell.tokens);
    PrefixReplayResult r = replay_prefix_cache(t, cap, CachePolicy::kLru);
    EXPECT_NEAR(r.token_hit_rate(), our_lru_expected(cell, synthetic), kTol)
        << "tokens " << cell.tokens << " (capacity " << cap << " blocks)";
  }
}

TEST(PrefixReplayMooncake, ConversationLruMatchesReference) {
  KVB_MOONCAKE_TRACE_OR_SKIP(t, "conversation_trace.jsonl");
  expect_lru_table(*t, false);
  PrefixReplayResult inf = replay_prefix_cache(*t, -1, CachePolicy::kLru);
  EXPECT_NEAR(inf.block_hit_rate(), 0.3664, 0.0005);  // as blocks, for the record
  EXPECT_EQ(inf.requests, 12031);
  EXPECT_EQ(inf.evicted_blocks, 0);
}

TEST(PrefixReplayMooncake, SyntheticLruMatchesReference) {
  KVB_MOONCAKE_TRACE_OR_SKIP(t, "synthetic_trace.jsonl");
  expect_lru_table(*t, true);
  PrefixReplayResult inf = replay_prefix_cache(*t, -1, CachePolicy::kLru);
  EXPECT_NEAR(inf.block_hit_rate(), 0.6396, 0.0005);
  EXPECT_EQ(inf.requests, 3993);
}

// The reading behind the table: LRU as an ordered map, each block of a request touched (or
// inserted) in prompt order, the least recent evicted whenever the map outgrows the capacity.
double plain_lru_token_hit_rate(const RequestTrace& t, int64_t capacity) {
  std::list<int64_t> order;  // front = least recent
  std::unordered_map<int64_t, std::list<int64_t>::iterator> where;
  int64_t hit_tokens = 0, input_tokens = 0;
  for (const auto& r : t.requests) {
    int64_t k = 0;
    while (k < static_cast<int64_t>(r.hash_ids.size()) && where.count(r.hash_ids[k])) ++k;
    hit_tokens += std::min(r.input_length, k * t.block_size_tokens);
    input_tokens += r.input_length;
    for (int64_t id : r.hash_ids) {
      auto it = where.find(id);
      if (it != where.end()) {
        order.splice(order.end(), order, it->second);
        continue;
      }
      where[id] = order.insert(order.end(), id);
      if (static_cast<int64_t>(order.size()) > capacity) {
        where.erase(order.front());
        order.pop_front();
      }
    }
  }
  return static_cast<double>(hit_tokens) / static_cast<double>(input_tokens);
}

TEST(PrefixReplayMooncake, PlainLruReproducesTheReferenceTable) {
  KVB_MOONCAKE_TRACE_OR_SKIP(t, "synthetic_trace.jsonl");
  for (int64_t tokens : {100'000, 1'000'000}) {
    const int64_t cap = blocks_for_tokens(tokens);
    const double plain = plain_lru_token_hit_rate(*t, cap);
    const double ours = replay_prefix_cache(*t, cap, CachePolicy::kLru).token_hit_rate();
    const double table = tokens == 100'000 ? 0.012 : 0.142;
    EXPECT_NEAR(plain, table, kTol) << "tokens " << tokens;
    EXPECT_GT(ours, plain + 0.002) << "tokens " << tokens;  // vLLM's order keeps more prefixes
  }
}

TEST(PrefixReplayMooncake, LruHitRateGrowsWithCapacity) {
  KVB_MOONCAKE_TRACE_OR_SKIP(t, "synthetic_trace.jsonl");
  double last_block = -1, last_token = -1;
  for (int64_t cap : {0, 50, 195, 600, 1953, 5859, 19531, 97656}) {
    PrefixReplayResult r = replay_prefix_cache(*t, cap, CachePolicy::kLru);
    EXPECT_GE(r.block_hit_rate(), last_block) << "capacity " << cap;
    EXPECT_GE(r.token_hit_rate(), last_token) << "capacity " << cap;
    last_block = r.block_hit_rate();
    last_token = r.token_hit_rate();
  }
  EXPECT_GT(last_token, 0.6);
}

// With room for every distinct block nothing is ever evicted, so every policy is the infinite one.
TEST(PrefixReplayMooncake, EveryPolicyIsInfiniteOnceEverythingFits) {
  for (const char* name : {"conversation_trace.jsonl", "synthetic_trace.jsonl"}) {
    KVB_MOONCAKE_TRACE_OR_SKIP(t, name);
    const int64_t distinct = distinct_blocks(*t);
    const PrefixReplayResult inf = replay_prefix_cache(*t, -1, CachePolicy::kLru);
    for (CachePolicy p : kAllPolicies) {
      SCOPED_TRACE(std::string(name) + " " + enum_name(kCachePolicies, p));
      PrefixReplayResult r = replay_prefix_cache(*t, distinct, p);
      EXPECT_EQ(r.hit_blocks, inf.hit_blocks);
      EXPECT_EQ(r.hit_tokens, inf.hit_tokens);
      EXPECT_EQ(r.evicted_blocks, 0);
      // One block less and something must go (each id is inserted once at least).
      EXPECT_GT(replay_prefix_cache(*t, distinct - 1, p).evicted_blocks, 0);
    }
  }
}

// The other policies at 1M and 10M tokens, pinned to what this implementation measures (no
// external reference; they guard against silent changes of policy semantics).
TEST(PrefixReplayMooncake, OtherPoliciesPinned) {
  struct Pin {
    const char* trace;
    CachePolicy policy;
    int64_t tokens;
    double token_hit_rate;
  };
  const Pin pins[] = {
      {"conversation_trace.jsonl", CachePolicy::kLfu, 1'000'000, 0.0602},
      {"conversation_trace.jsonl", CachePolicy::kLfu, 10'000'000, 0.2107},
      {"conversation_trace.jsonl", CachePolicy::kFifo, 1'000'000, 0.0535},
      {"conversation_trace.jsonl", CachePolicy::kFifo, 10'000'000, 0.2613},
      {"conversation_trace.jsonl", CachePolicy::kS3Fifo, 1'000'000, 0.0789},
      {"conversation_trace.jsonl", CachePolicy::kS3Fifo, 10'000'000, 0.2529},
      {"synthetic_trace.jsonl", CachePolicy::kLfu, 1'000'000, 0.0953},
      {"synthetic_trace.jsonl", CachePolicy::kLfu, 10'000'000, 0.5989},
      {"synthetic_trace.jsonl", CachePolicy::kFifo, 1'000'000, 0.1441},
      {"synthetic_trace.jsonl", CachePolicy::kFifo, 10'000'000, 0.5387},
      {"synthetic_trace.jsonl", CachePolicy::kS3Fifo, 1'000'000, 0.1487},
      {"synthetic_trace.jsonl", CachePolicy::kS3Fifo, 10'000'000, 0.6018},
  };
  for (const Pin& pin : pins) {
    KVB_MOONCAKE_TRACE_OR_SKIP(t, pin.trace);
    PrefixReplayResult r = replay_prefix_cache(*t, blocks_for_tokens(pin.tokens), pin.policy);
    EXPECT_NEAR(r.token_hit_rate(), pin.token_hit_rate, 0.0005)
        << pin.trace << " " << enum_name(kCachePolicies, pin.policy) << " " << pin.tokens
        << " tokens";
  }
}

}  // namespace
}  // namespace kvb
