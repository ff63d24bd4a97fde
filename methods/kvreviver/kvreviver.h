#pragma once
// kvreviver: KVReviver-style reversible eviction (arXiv 2512.17917; the paper's internals are not
// public: this is kvbench's design after the public description, see README.md). Per sequence,
// layer and KV head:
//   exact region:  the most recent tokens + candidate tokens (top accumulated attention,
//   H2O-style),
//                  stored exactly (keys post-RoPE, values), at most `budget` entries per head;
//   vague region:  every other token of the sequence, folded into two count-sketches (keys and
//                  values), `depth` rows x `width` buckets x head_dim, fp32. Nothing is stored per
//                  vague token: its buckets and signs come from a hash of (layer, head, row, token
//                  index, truncation epoch).
// Attention: exact over the exact region plus every vague token reconstructed from the sketches
// (median over rows of sign x bucket; keys sketched pre-RoPE by default and re-rotated to the
// token's own position), all in one softmax. revive=false drops the vague tokens instead (the same
// exact region, eviction only: the ablation). CPU fp32 only.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "methods/common/evicting_kv_cache.h"

namespace kvb {
namespace kvreviver {

// A count-sketch of `dim`-dimensional rows keyed by 64-bit ids: `depth` rows of `width` buckets.
// add(key, x): for each row r, S[r][h_r(key)] += s_r(key) * x. reconstruct(key): per channel, the
// median over rows of s_r(key) * S[r][h_r(key)] (the mean of the two middle values for even
// depth). The table is allocated on the first add (bytes() is 0 before).
class CountSketch {
 public:
  static constexpr int64_t kMaxDepth = 64;
  CountSketch() = default;
  CountSketch(int64_t depth, int64_t width, int64_t dim, uint64_t seed);
  int64_t bucket(int64_t row, uint64_t key) const;
  float sign(int64_t row, uint64_t key) const;
  void add(uint64_t key, const float* x);            // x: [dim]
  void reconstruct(uint64_t key, float* out) const;  // out: [dim]; zeros when empty
  int64_t bytes() const { return static_cast<int64_t>(table_.size() * sizeof(float)); }
  const std::vector<float>& table() const { return table_; }  // [depth, width, dim]

 private:
  uint64_t hash(int64_t row, uint64_t key) const;
  int64_t depth_ = 1, width_ = 1, dim_ = 1;
  uint64_t seed_ = 0;
  std::vector<float> table_;
};

// Sketch key of token `t` appended in truncation epoch `epoch`.
inline uint64_t token_key(int64_t t, int32_t epoch) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(epoch)) << 32) |
         static_cast<uint64_t>(static_cast<uint32_t>(t));
}

}  // namespace kvreviver

class KvReviverKvCache : public KvCache {
 public:
  struct Options {
    Budget budget;                 // exact entries per KV head
    double recent_fraction = 0.5;  // share of the exact budget given to the recent window
    int64_t depth = 3;
    int64_t width = 32;
    bool revive = true;         // attend reconstructed vague tokens (false: evict only)
    bool keys_pre_rope = true;  // sketch keys with RoPE removed (re-rotated on reconstruction)
    uint64_t seed = 0;
    bool measure_error = false;  // keep shadow copies of sketched rows (not in the ledger) to
                                 // measure the reconstruction error at attention time
  };
  KvReviverKvCache(const CacheContext& ctx, Options opts);

  std::string name() const override { return "kvreviver"; }
  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void release(int64_t seq_id) override { seqs_.erase(seq_id); }
  void fork(int64_t src_id, int64_t dst_id) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  int64_t seq_len(int64_t seq_id) const override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  // Exact entries plus the reconstructed vague tokens (post-RoPE keys), by token index.
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;

  // Inspection (tests): the token indices a head keeps exactly, its capacity, and its sketches.
  std::vector<int32_t> kept_indices(int64_t seq_id, int layer, int64_t head) const;
  int64_t capacity(int64_t seq_id, int layer, int64_t head) const;
  const kvreviver::CountSketch& key_sketch(int64_t seq_id, int layer, int64_t head) const;
  const kvreviver::CountSketch& value_sketch(int64_t seq_id, int layer, int64_t head) const;

 private:
  struct Head {
    std::vector<float> k, v;   // [cap, head_dim]: exact keys (post-RoPE) and values
    std::vector<int32_t> idx;  // [cap] token index, ascending over 0..len-1
    std::vector<float> acc;    // [cap] accumulated attention
    int64_t len = 0, cap = 0;
    bool evicted = false;
    kvreviver::CountSketch sk, sv;
    std::vector<float> shadow_k, shadow_v;  // measure_error only: [seen, head_dim] by token index
  };
  struct Seq {
    int64_t seen = 0;
    int64_t step_tokens = 0;
    std::vector<int32_t> pos;    // [seen + step] RoPE position of every token
    std::vector<int32_t> epoch;  // [seen + step] truncation epoch the token was appended in
    int32_t cur_epoch = 0;
    std::vector<std::vector<Head>> heads;  // [layer][kv head]
  };
  Seq& seq(int64_t id);
  const Seq& seq(int64_t id) const;
  void reallocate(Head& h, int64_t cap);
  void reserve(Head& h, int64_t need);
  void compact(Head& h, const std::vector<int64_t>& keep);
  void ensure_rope(int64_t n_pos);
  // The vague tokens of a head (token indices < seen not held exactly) and, when revive is on,
  // their reconstructed keys (post-RoPE) and values: [n, head_dim] each.
  std::vector<int32_t> vague_tokens(const Seq& s, const Head& h, int64_t seen) const;
  void reconstruct(const Seq& s, const Head& h, const std::vector<int32_t>& tokens, float* k_out,
                   float* v_out) const;
  void evict_head(Seq& s, int layer, int64_t head);

  CacheContext ctx_;
  Options opts_;
  int64_t L_, Hkv_, Hq_, G_, D_;
  std::unordered_map<int64_t, Seq> seqs_;
  at::Tensor rope_cos_, rope_sin_, rope_nsin_;  // [n, head_dim / 2] fp32
  int64_t rope_len_ = 0;
  std::vector<float> scratch_p_, scratch_k_, scratch_v_;
  // Counters.
  int64_t evicted_entries_ = 0, stale_sketch_tokens_ = 0;
  double evict_err_k_ = 0, evict_norm_k_ = 0, evict_err_v_ = 0, evict_norm_v_ = 0;
  double attn_err_k_ = 0, attn_norm_k_ = 0, attn_err_v_ = 0, attn_norm_v_ = 0;
  double vague_mass_ = 0, vague_rows_ = 0;
};

}  // namespace kvb
