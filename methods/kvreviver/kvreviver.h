#pragma once
// kvreviver: KVReviver-style reversible eviction (arXiv 2512.17917; the paper's internals are not
// public: this is kvbench's design after the public description, see README.md). Per sequence,
// layer and KV head:
//   exact region:  the most recent tokens + candidate tokens (top accumulated attention,
//                  H2O-style), stored exactly (keys post-RoPE, values), at most `budget` entries
//                  per head;
//   vague region:  every other token of the sequence, held compressed in one of two ways
//                  (`reconstruction`):
//     merge (default): `width` buckets of running K/V sums + counts (+ position sums when keys are
//                  merged pre-RoPE). An evicted token opens a new bucket while fewer than `width`
//                  are used, else it is folded into the bucket whose centroid key is nearest (L2).
//                  Attention sees each bucket as ONE entry: centroid key/value, logit + log(count).
//     sketch:      the literal reading of the paper's description: two count-sketches (keys and
//                  values), `depth` rows x `width` buckets x head_dim, fp32, nothing stored per
//                  vague token (hashes of layer, head, row, token index, truncation epoch); every
//                  vague token is reconstructed (median over rows) and attended. Breaks the model
//                  unless the sketch is larger than the cache (README, Measured).
// Keys are folded pre-RoPE by default (keys_pre_rope) and re-rotated: sketch mode at the token's
// own position, merge mode at the bucket's count-weighted mean position, rounded.
// Attention is one softmax over the exact region and the vague entries. revive=false drops the
// vague tokens instead (the same exact region, eviction only: the ablation). CPU fp32 only.
// `codec` stores the exact region (fp16/bf16 rows, KIVI, per-token quantization): a step's rows
// stay fp32 until its end_step (after the eviction), then go to the codec; evicted rows are
// folded as the codec gives them back. The buckets / sketches stay fp32 (running sums).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/common/enum_names.h"
#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/head_geometry.h"
#include "methods/common/kv_codec.h"
#include "methods/common/ragged_heads.h"
#include "methods/common/seq_store.h"

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

// Merge buckets for one head: at most `width` buckets of [dim] key sums, [dim] value sums, a token
// count and (with positions) a position sum. add(): while fewer than `width` buckets are used the
// row opens a new bucket; afterwards it joins the bucket whose centroid key (key sum / count) is
// nearest in L2 (ties: the lowest index). Deterministic (depends only on the order of the adds).
// Storage is allocated for all `width` buckets on the first add (bytes() is 0 before).
class MergeBuckets {
 public:
  MergeBuckets() = default;
  MergeBuckets(int64_t width, int64_t dim, bool positions);
  int64_t add(const float* k, const float* v, int64_t pos);  // returns the bucket
  int64_t nearest(const float* k) const;  // the bucket add() would join once full (-1: none used)
  int64_t used() const { return used_; }
  int64_t width() const { return width_; }
  int64_t count(int64_t b) const { return count_[b]; }
  int64_t tokens() const;  // sum of the counts
  int64_t position_sum(int64_t b) const { return pos_sum_[b]; }
  int64_t position(int64_t b) const;  // representative position: round(position sum / count)
  void centroid(int64_t b, float* k_out, float* v_out) const;  // sums / count
  const float* key_sum(int64_t b) const { return ksum_.data() + b * dim_; }
  const float* value_sum(int64_t b) const { return vsum_.data() + b * dim_; }
  // width x (2 x dim x 4 B sums + 4 B count [+ 8 B position sum]) once allocated.
  int64_t bytes() const;

 private:
  int64_t width_ = 1, dim_ = 1, used_ = 0;
  bool positions_ = false;
  std::vector<float> ksum_, vsum_;  // [width, dim]
  std::vector<int32_t> count_;      // [width]
  std::vector<int64_t> pos_sum_;    // [width], positions only
};

// Sketch key of token `t` appended in truncation epoch `epoch`.
inline uint64_t token_key(int64_t t, int32_t epoch) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(epoch)) << 32) |
         static_cast<uint64_t>(static_cast<uint32_t>(t));
}

// One KV head: the exact region (ragged_heads.h: keys post-RoPE and values, fp32, the token indices
// and the accumulated attention; with a codec, the current step's rows stay pending (fp32) until
// its end_step, after the eviction) and where the evicted tokens went.
struct Head : RaggedHead {
  CountSketch sk, sv;                     // sketch mode
  MergeBuckets mb;                        // merge mode
  std::vector<float> shadow_k, shadow_v;  // measure_error only: [seen, head_dim] by token index
  std::vector<int32_t> assign;            // measure_error, merge mode: bucket by token index
};
struct Seq {
  int64_t seen = 0;
  int64_t step_tokens = 0;
  std::vector<int32_t> pos;    // [seen + step] RoPE position of every token
  std::vector<int32_t> epoch;  // [seen + step] truncation epoch the token was appended in
  int32_t cur_epoch = 0;
  std::vector<std::vector<Head>> heads;  // [layer][kv head]
};

}  // namespace kvreviver

class KvReviverKvCache : public SeqStore<kvreviver::Seq, &kvreviver::Seq::seen>,
                         public ProbedCache,
                         private HeadGeometry {
 public:
  enum class Reconstruction { kMerge, kSketch };
  struct Options {
    Budget budget;                 // exact entries per KV head
    double recent_fraction = 0.5;  // share of the exact budget given to the recent window
    Reconstruction reconstruction = Reconstruction::kMerge;
    int64_t depth = 3;   // sketch only
    int64_t width = 32;  // merge: buckets per head; sketch: buckets per row
    bool revive = true;         // attend reconstructed vague tokens (false: evict only)
    bool keys_pre_rope = true;  // fold keys with RoPE removed (re-rotated on reconstruction)
    uint64_t seed = 0;
    std::shared_ptr<const KvCodec> codec;  // null: exact region fp32
    bool measure_error = false;  // keep shadow copies of vague rows (and, merge mode, each
                                 // token's bucket; not in the ledger) to measure the
                                 // reconstruction error at attention time (merge mode: also
                                 // what probe_view needs)
  };
  KvReviverKvCache(const CacheContext& ctx, Options opts);

  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  // Exact entries plus the reconstructed vague tokens (post-RoPE keys), by token index. Merge
  // mode: a vague token shows its bucket's centroid (n copies of a centroid = the log(n) bias, so
  // the view's softmax is attention's); needs measure_error (the token -> bucket map), else empty.
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;

  // Inspection (tests): the token indices a head keeps exactly, its capacity, and its sketches.
  std::vector<int32_t> kept_indices(int64_t seq_id, int layer, int64_t head) const {
    return seqs_.at(seq_id).heads.at(layer).at(head).kept_indices();
  }
  int64_t capacity(int64_t seq_id, int layer, int64_t head) const {
    return seqs_.at(seq_id).heads.at(layer).at(head).cap;
  }
  const kvreviver::CountSketch& key_sketch(int64_t seq_id, int layer, int64_t head) const;
  const kvreviver::CountSketch& value_sketch(int64_t seq_id, int layer, int64_t head) const;
  const kvreviver::MergeBuckets& buckets(int64_t seq_id, int layer, int64_t head) const;

 private:
  using Head = kvreviver::Head;
  using Seq = kvreviver::Seq;
  Seq new_seq(int64_t seq_id) override;
  // The step's positions and epochs, room in every head.
  void step_begins(Seq& s, const StepBatch& batch, int64_t b) override;
  void ensure_rope(int64_t n_pos);
  bool merge() const { return opts_.reconstruction == Reconstruction::kMerge; }
  // Merge mode: the centroids of a head's buckets, keys post-RoPE: [used, head_dim] each.
  void bucket_entries(const Head& h, float* k_out, float* v_out) const;
  // The vague tokens of a head (token indices < seen not held exactly) and, when revive is on,
  // their reconstructed keys (post-RoPE) and values: [n, head_dim] each.
  std::vector<int32_t> vague_tokens(const Seq& s, const Head& h, int64_t seen) const;
  void reconstruct(const Seq& s, const Head& h, const std::vector<int32_t>& tokens, float* k_out,
                   float* v_out) const;
  void evict_head(Seq& s, int layer, int64_t head);

  CacheContext ctx_;
  Options opts_;
  RaggedHeads heads_;
  at::Tensor rope_cos_, rope_sin_, rope_nsin_;  // [n, head_dim / 2] fp32
  int64_t rope_len_ = 0;
  std::vector<float> scratch_p_, scratch_k_, scratch_v_, scratch_bias_, scratch_ek_, scratch_ev_;
  // Counters.
  int64_t evicted_entries_ = 0, stale_sketch_tokens_ = 0;
  double evict_err_k_ = 0, evict_norm_k_ = 0, evict_err_v_ = 0, evict_norm_v_ = 0;
  double attn_err_k_ = 0, attn_norm_k_ = 0, attn_err_v_ = 0, attn_norm_v_ = 0;
  double vague_mass_ = 0, vague_rows_ = 0;
};

// The `reconstruction` parameter's names.
inline constexpr EnumName<KvReviverKvCache::Reconstruction> kReconstructions[] = {
    {KvReviverKvCache::Reconstruction::kMerge, "merge"},
    {KvReviverKvCache::Reconstruction::kSketch, "sketch"}};

}  // namespace kvb
