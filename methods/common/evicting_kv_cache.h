#pragma once
// EvictingKvCache: the physical token-eviction store shared by the eviction / selection methods
// (StreamingLLM, H2O, TOVA, SnapKV, PyramidKV, Ada-KV, KnormPress). A method is a policy
// (EvictionPolicy below: signals -> which tokens each KV head keeps); the store does the rest. The
// methods' policies are composed of a scorer, a protection, a budget allocator and a schedule
// (composed_policy.h; one declaration per method: scored_method.h).
//
// Storage. Per sequence, per layer, per KV head one capacity-managed buffer of kept entries
// (ragged_heads.h: keys and values in the model dtype or a codec, token indices, accumulated
// attention for policies that ask for it, H2O). Heads are independent (ragged: every KV head has
// its own length and capacity, never expanded to query heads). Keys are post-RoPE (absolute
// position mode) or pre-RoPE (rerotated mode: re-rotated every step to contiguous positions that
// end right before the step's first query position, as official StreamingLLM does with cache
// indices). Eviction compacts the kept entries to the front (order-preserving) and shrinks the
// buffer, so evicted tokens really free memory.
//
// Attention. Each KV head attends its query group (GQA: the g query heads share the head's kept
// set) over its kept entries plus the step's new tokens, exact softmax in fp32; new tokens attend
// causally to each other and see every kept entry. CPU fp32 runs raw-pointer loops (no LibTorch
// dispatch per head; its own two-pass softmax rather than attend_dense's kernel because H2O / TOVA
// / SnapKV need the probabilities); other devices / dtypes run the same computation with LibTorch
// ops.
//
// Signals the store computes for a policy (EvictionPolicy::Needs): accumulated attention of every
// query row (H2O), the last query's attention row (TOVA), observation-window attention of the last
// `window` queries, kept per layer while needed (SnapKV family), key L2 norms (KnormPress), the
// kept keys and values as fp32 rows (KeyDiff, LagKV, CUR), and the pre-RoPE query mean and
// covariance per query head with the model's RoPE angles (Expected Attention).
//
// Ledger (footprint()): payload = live K/V bytes; reserved = capacity slack (K/V and the per-entry
// arrays); index = the int32 token indices; metadata = accumulated scores, observation-window
// query buffers and query statistics (fp64, host) while held. Host-side arrays count as device_* on
// a CPU run and as host_bytes on a GPU run. tokens_held = entries / (layers x KV heads) per
// sequence (token equivalents, floored); logical_bytes = entries x uncompressed bytes per entry
// (exact).
//
// seq_len() is the sequence's logical length (tokens appended), not the entries held; truncate(n)
// drops every kept entry with token index >= n (evicted entries do not come back). fork()
// deep-copies (no copy-on-write). splice() (document reuse) concatenates the sources' kept entries
// per KV head, token indices moved on by the source's offset and, in absolute mode, keys re-rotated
// by it (rerotated mode stores them unrotated); the sources' accumulated scores come along, their
// observation windows do not. Each document is compressed by its own end_prefill when it is cached:
// a spliced context holds what the policy kept of every document alone. With a codec the kept rows
// are decoded, re-rotated and encoded again (a second rounding, as the codec store splices).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/question_aware.h"
#include "harness/kv/splice.h"
#include "methods/common/head_geometry.h"
#include "methods/common/kv_codec.h"
#include "methods/common/ragged_heads.h"
#include "methods/common/seq_store.h"

namespace kvb {

enum class BudgetUnit { kRatio, kTokensPerLayer, kTokensPerHead };
enum class PositionMode { kAbsolute, kRerotated };

const char* budget_unit_name(BudgetUnit u);
BudgetUnit parse_budget_unit(const std::string& s);
PositionMode parse_position_mode(const std::string& s);

// A kept budget. ratio: floor(value x tokens seen) per KV head; tokens_per_head: value per KV head;
// tokens_per_layer: value entries per layer over all its KV heads (value / KV heads per head).
// Budgets include every protected token (sinks, recent window, observation window).
struct Budget {
  double value = 1.0;
  BudgetUnit unit = BudgetUnit::kRatio;
  // Kept entries per KV head (the average for head-adaptive methods); at least 1 once seen >= 1.
  int64_t per_head(int64_t seen, int64_t n_kv_heads) const;
  // Kept entries of a layer over all its KV heads; at least 1 once seen >= 1.
  int64_t per_layer(int64_t seen, int64_t n_kv_heads) const;
};

// One KV head of one layer of one sequence as a policy sees it: `len` live entries in storage order
// (ascending token index). Signal arrays are null unless the policy asked for them.
struct HeadView {
  int64_t len = 0;
  const int32_t* idx = nullptr;  // [len] token index (the token's position in its sequence)
  const float* acc = nullptr;    // [len] attention received so far, summed over query rows and
                                 //       the group's query heads (Needs::accumulate)
  const float* last = nullptr;   // [len] the step's last query's attention, summed over the
                                 //       group's query heads (Needs::last_row; after-step only)
  const float* window =
      nullptr;  // [group, len] per query head of the group: attention of the
                //       observation-window queries, summed over them (Needs::window)
  const float* key_norm = nullptr;  // [len] key L2 norms (Needs::key_norm)
  // [len, head_dim] fp32 (Needs::kv): the kept keys as the next query reads them (post-RoPE; in
  // rerotated mode rotated to the positions that end right before the next one) and values
  // (decoded when a codec stores them).
  const float* keys = nullptr;
  const float* values = nullptr;
};

// Statistics of the pre-RoPE queries a layer has seen (Needs::query_stats), per query head.
struct QueryStats {
  int64_t count = 0;            // query rows accumulated (token index >= Needs::query_stats_from)
  const float* mean = nullptr;  // [n_heads, head_dim]
  const float* cov = nullptr;   // [n_heads, head_dim, head_dim], the population covariance
};

// The model's RoPE angles, positions 0 .. rows - 1 (at least up to next_pos + Needs::rope_ahead).
struct RopeAngles {
  int64_t rows = 0;
  int64_t half = 0;            // head_dim / 2
  bool interleaved = false;    // channel pairs (2i, 2i + 1) rather than (i, i + half)
  const float* cos = nullptr;  // [rows, half]
  const float* sin = nullptr;  // [rows, half]
};

enum class Trigger { kBeforeStep, kAfterStep, kEndPrefill, kPeriodic };

struct LayerView {
  Trigger trigger = Trigger::kAfterStep;
  int layer = 0;
  int n_layers = 1;
  int64_t n_kv_heads = 1;
  int64_t group = 1;  // query heads per KV head
  int64_t head_dim = 0;
  int64_t seen = 0;      // tokens the sequence has appended (before the incoming ones)
  int64_t incoming = 0;  // kBeforeStep: tokens about to be appended; else 0
  int64_t window = 0;    // observation-window queries behind HeadView::window (the last
                         // `window` tokens, token indices seen - window .. seen - 1)
  int64_t next_pos = 0;  // the RoPE position of the sequence's next token
  int64_t question = 0;  // tokens of the question ending the prompt (QuestionAwareCache;
                         // 0: not told)
  // Needs::window_queries: the observation-window queries themselves, [window, n_heads,
  // head_dim] fp32 post-RoPE, oldest first (token indices seen - window .. seen - 1).
  const float* window_queries = nullptr;
  float sm_scale = 1.0f;        // the model's attention scale
  std::vector<HeadView> heads;  // [n_kv_heads]
  QueryStats queries;           // Needs::query_stats
  RopeAngles rope;              // Needs::query_stats
  int64_t total() const { return seen + incoming; }
};

class EvictionPolicy {
 public:
  struct Needs {
    bool accumulate = false;      // H2O: running attention sums per entry (kept as metadata)
    bool last_row = false;        // TOVA: the last query row of each step
    int64_t window = 0;           // SnapKV family: keep the last `window` queries per layer
    bool key_norm = false;        // KnormPress
    bool kv = false;              // the kept keys and values themselves (KeyDiff, LagKV, CUR)
    bool window_queries = false;  // the `window` queries themselves, not only their attention
    // Pre-RoPE query mean and covariance per query head, from the rows whose token index is at
    // least query_stats_from (Expected Attention skips the sinks), kept as metadata while a
    // compression may still read them; -1: not collected. rope_ahead: RoPE angles this many
    // positions past the next one are handed over with them.
    int64_t query_stats_from = -1;
    int64_t rope_ahead = 0;

    // What a scorer that reads one thing needs: only(&Needs::key_norm, true).
    template <typename T>
    static Needs only(T Needs::*field, T value) {
      Needs n;
      n.*field = value;
      return n;
    }
  };
  struct Schedule {
    bool before_step = false;        // make room before a step's tokens are appended
    bool after_step = false;         // after every step (prefill chunks and decode steps)
    bool end_prefill = false;        // once the prompt is in
    int64_t every_decode_steps = 0;  // also every k decode steps (0: never)
  };
  virtual ~EvictionPolicy() = default;
  virtual Needs needs() const = 0;
  virtual Schedule schedule() const = 0;
  // Fills keep[h] (h < n_kv_heads) with the storage slots head h keeps, ascending. Returns false
  // when nothing is evicted (keep is then ignored). Must be deterministic.
  virtual bool select(const LayerView& layer, std::vector<std::vector<int64_t>>* keep) const = 0;
  // Effective settings (e.g. a resolved preset) reported with the counters.
  virtual std::map<std::string, double> settings() const { return {}; }
};

namespace evicting {
// With a codec, prefill rows wait as pending rows and reach the codec at end_prefill, after the
// prefill-time eviction, so a prompt's evicted tokens are never encoded (evict, then quantize what
// is kept); decode rows go to the codec as they come.
struct Head : RaggedHead {
  std::vector<float> last;  // [len] during a step's end (and, for a policy compressing at
                            // end_prefill, from the last prompt step to it), else empty
};
struct Seq {
  int64_t seen = 0;
  int64_t step_tokens = 0;  // tokens of the running step
  int64_t step_pos0 = 0;    // RoPE position of the running step's first token
  int64_t next_pos = 0;     // position after the last appended token
  bool decoding = false;
  int64_t since_compress = 0;
  std::vector<std::vector<Head>> heads;  // [layer][kv head]
  std::vector<at::Tensor> window_q;      // [layer]: [window, n_heads, head_dim] or undefined
  std::vector<int64_t> window_len;       // [layer]: valid rows (the most recent queries)
  // Needs::query_stats: [layer] sums of pre-RoPE query rows [n_heads, head_dim] and of their
  // outer products [n_heads, head_dim, head_dim], fp64 CPU (undefined once freed), and counts.
  std::vector<at::Tensor> q_sum, q_outer;
  std::vector<int64_t> q_count;
  int64_t question = 0;  // set_question_tokens
};

}  // namespace evicting

class EvictingKvCache : public SeqStore<evicting::Seq, &evicting::Seq::seen>,
                        public QuestionAwareCache,
                        public ProbedCache,
                        public SplicingCache,
                        private HeadGeometry {
 public:
  struct Options {
    std::string name = "evicting";
    PositionMode position_mode = PositionMode::kAbsolute;
    int64_t granule = 16;        // capacity rounding, tokens
    bool force_generic = false;  // use the LibTorch path even on CPU fp32 (tests)
    // How kept entries are stored (eviction x quantization, physically): null = the model dtype in
    // one [2, cap, head_dim] buffer per head; else one CodecStream per head for K and one for V
    // (width head_dim; evictions call keep_rows, never re-encode). CPU fp32 only.
    std::shared_ptr<const KvCodec> codec;
  };
  EvictingKvCache(const CacheContext& ctx, Options opts, std::unique_ptr<EvictionPolicy> policy);
  ~EvictingKvCache() override;

  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void end_prefill(int64_t seq_id) override;
  void release(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  // Keys as the next query reads them (rerotated mode: rotated to positions ending right before the
  // sequence's next position), values, token indices; ragged per KV head.
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;
  void set_question_tokens(int64_t seq_id, int64_t question_tokens) override;
  void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) override;

  // Inspection (tests, probes): the token indices a head keeps, its capacity, its kept keys as
  // stored ([len, head_dim]; pre-RoPE in rerotated mode) and values.
  std::vector<int32_t> kept_indices(int64_t seq_id, int layer, int64_t h) const {
    return head(seq_id, layer, h).kept_indices();
  }
  int64_t capacity(int64_t seq_id, int layer, int64_t h) const {
    return head(seq_id, layer, h).cap;
  }
  at::Tensor kept_keys(int64_t seq_id, int layer, int64_t h) const {
    return kept_rows(seq_id, layer, h, 0);
  }
  at::Tensor kept_values(int64_t seq_id, int layer, int64_t h) const {
    return kept_rows(seq_id, layer, h, 1);
  }
  const EvictionPolicy& policy() const { return *policy_; }

 private:
  using Head = evicting::Head;
  using Seq = evicting::Seq;
  // A sequence's state at its first step (with the question it was told of).
  Seq new_seq(int64_t seq_id) override;
  // The step's state; a policy that makes room before a step compresses; room in every head.
  void step_begins(Seq& s, const StepBatch& batch, int64_t b) override;
  const RaggedHead& head(int64_t seq_id, int layer, int64_t head) const;
  at::Tensor kept_rows(int64_t seq_id, int layer, int64_t head, int which) const;
  bool collecting_window(const Seq& s) const;
  // Hands a head's pending rows to its codec streams (with the observation window's query energy
  // first, for a query-aware codec).
  void flush_pending(Seq& s, int layer, int64_t head);
  void compress(Seq& s, Trigger trigger, int64_t incoming);
  void compress_layer(Seq& s, int layer, Trigger trigger, int64_t incoming);
  void push_window(Seq& s, int layer, const at::Tensor& q, int64_t start, int64_t n);
  void free_windows(Seq& s);
  // Adds the pre-RoPE queries of the sequence's rows start .. start + n - 1 of q to its statistics.
  void push_query_stats(Seq& s, int layer, const at::Tensor& q, const StepBatch& batch,
                        int64_t start, int64_t n);
  void free_query_stats(Seq& s);
  void clear_last_rows(Seq& s);
  bool collecting_query_stats(const Seq& s) const;
  void ensure_rope(int64_t n_pos);
  // Keys of head `h` ready for attention at positions base .. base + rows - 1 (rerotated mode), or
  // the stored post-RoPE keys (absolute mode). CPU fp32 fills `scratch`; generic returns a tensor.
  const float* keys_f32(const float* K, int64_t rows, int64_t base, std::vector<float>* scratch);
  at::Tensor keys_generic(const Head& h, int64_t rows, int64_t base);
  // q: [T, n_heads, head_dim]; k (post-RoPE, or pre-RoPE in rerotated mode), v: [T, kv_heads,
  // head_dim]; the sequence's rows are start .. start + n - 1; writes those rows of out.
  void attend_seq_fast(Seq& s, int layer, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, int64_t start, int64_t n, at::Tensor& out);
  void attend_seq_generic(Seq& s, int layer, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, int64_t start, int64_t n, at::Tensor& out);
  // window[g * len + j] for head `h` of `layer`.
  std::vector<float> window_scores(Seq& s, int layer, int64_t head);
  std::vector<float> key_norms(const Head& h);
  // The head's kept keys (as the next query reads them) and values, fp32 [len, head_dim].
  void kept_rows_f32(const Seq& s, const Head& h, std::vector<float>* keys,
                     std::vector<float>* values);

  CacheContext ctx_;
  Options opts_;
  std::unique_ptr<EvictionPolicy> policy_;
  EvictionPolicy::Needs needs_;
  EvictionPolicy::Schedule sched_;
  RaggedHeads heads_;
  bool host_is_device_ = true;
  float sm_scale_ = 1.0f;
  std::unordered_map<int64_t, int64_t> question_for_;  // told before the sequence's first step
  at::Tensor rope_cos_, rope_sin_;                     // [n, head_dim / 2] fp32 CPU
  at::Tensor rope_cos_dev_, rope_sin_dev_;
  int64_t rope_len_ = 0;
  std::vector<float> scratch_k_, scratch_p_, dec_k_, dec_v_;
  std::vector<int64_t> scratch_pos_, scratch_vis_;
  // Counters.
  int64_t evicted_entries_ = 0;
  int64_t compressions_ = 0;
};

}  // namespace kvb
