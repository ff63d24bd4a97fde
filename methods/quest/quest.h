#pragma once
// quest: query-aware page selection (Tang et al., ICML 2024, arXiv 2406.10774). Nothing is evicted:
// every token is stored at full precision. Each sequence's keys are cut into pages of `page_size`
// tokens; per page, layer and KV head the store keeps the channel-wise min and max of the post-RoPE
// keys. At a decode step, in every layer from `skip_layers` on, each KV head scores its pages by
// the upper bound U_p = sum_c max(q_c * min_{p,c}, q_c * max_{p,c}) (GQA: the group's query heads'
// bounds aggregated by max or mean) and attends exactly over the top pages only (the page holding
// the current token always, the first page optionally). Prefill and the first `skip_layers` layers
// attend densely. Quest saves read bandwidth, not memory: the ledger holds the full KV plus the
// page min/max (metadata) -- unless a `codec` stores the KV (Quest x KIVI etc.: the rows live in
// one CodecStream per layer and K|V, decoded into a shared scratch for each step's attention; page
// bounds come from the exact keys as they arrive, and are recomputed from the decoded keys only
// when a truncation cuts a page).
//
// Storage per sequence and layer (model dtype, model device; contiguous, grown by doubling):
//   k, v:   [capacity, num_kv_heads, head_dim]  (capacity a multiple of page_size)
//   mn, mx: [capacity / page_size, num_kv_heads, head_dim]  (min / max of the page's keys)
// Logical page p holds tokens p * page_size .. (p + 1) * page_size - 1 of the sequence.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "methods/common/eviction_select.h"
#include "methods/common/head_geometry.h"
#include "methods/common/kv_codec.h"
#include "methods/common/seq_store.h"

namespace kvb {
namespace quest {

// Upper bound of q . k over the keys of one page: sum_c max(q_c * mn_c, q_c * mx_c).
// q, mn, mx: [head_dim], fp32.
float page_upper_bound(const float* q, const float* mn, const float* mx, int64_t head_dim);

// Pages one KV head reads at one decode step: of `n_pages` pages (the last one holds the current
// token) with aggregated scores score[0..n_pages), the last page always, page 0 when `keep_first`,
// and the best others by score (ties to the lower page) up to `k_pages` in all. Returned ascending.
// k_pages >= n_pages returns every page; fewer than the forced pages returns the forced pages.
std::vector<int64_t> select_pages(const float* score, int64_t n_pages, int64_t k_pages,
                                  bool keep_first);

// How many pages a step reads when `visible` tokens are visible to the query and the budget allows
// `budget_tokens` tokens: every page (returns n_pages) when budget_tokens >= visible, else
// max(1, budget_tokens / page_size) (Quest's token_budget // page_size).
int64_t pages_for_budget(int64_t budget_tokens, int64_t visible, int64_t page_size);

// One sequence's pages (see the top of this file).
struct Seq {
  std::vector<at::Tensor> k, v, mn, mx;  // per layer, see the header comment (k, v: no codec)
  std::vector<std::shared_ptr<CodecStream>> ks, vs;  // per layer, with a codec
  // With a codec: rows wait here at fp32 ([rows * Hkv * D] per layer) while their step attends,
  // and prompt rows until the end of prefill, so a step attends to itself exactly (as in KIVI)
  // and the prompt is encoded once.
  std::vector<std::vector<float>> pk, pv;
  int64_t len = 0;
  int64_t capacity = 0;
  int64_t step_tokens = 0;
  bool decoding = false;
  std::vector<std::vector<std::vector<int64_t>>> last_pages;  // [layer][kv head]
};

}  // namespace quest

class QuestKvCache : public SeqStore<quest::Seq>, public ProbedCache, private HeadGeometry {
 public:
  struct Options {
    Budget budget;  // tokens read per step per KV head (ratio of the visible tokens)
    int64_t page_size = 16;
    int64_t skip_layers = 2;  // layers 0 .. skip_layers - 1 always attend densely
    bool keep_first_page = false;
    GqaAgg gqa_agg = GqaAgg::kMax;
    bool force_generic = false;  // use the LibTorch path even on CPU fp32 (tests)
    std::shared_ptr<const KvCodec> codec;  // null: K/V tensors in the model dtype (CPU fp32 only)
  };
  QuestKvCache(const CacheContext& ctx, Options opts);

  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void end_prefill(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;  // dense: the copy owns its rows
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;

  // Inspection (tests): a page's key min / max ([head_dim], fp32) and the pages the last decode
  // query of `seq_id` read at `layer` / `head` (empty: dense read).
  at::Tensor page_min(int64_t seq_id, int layer, int64_t page) const;  // [num_kv_heads, head_dim]
  at::Tensor page_max(int64_t seq_id, int layer, int64_t page) const;  // [num_kv_heads, head_dim]
  std::vector<int64_t> last_pages(int64_t seq_id, int layer, int64_t head) const;
  int64_t capacity(int64_t seq_id) const { return seqs_.at(seq_id).capacity; }

 private:
  using Seq = quest::Seq;
  Seq new_seq(int64_t seq_id) override;
  // The step's state, room for its tokens.
  void step_begins(Seq& s, const StepBatch& batch, int64_t b) override;
  void reallocate(Seq& s, int64_t capacity);
  // Appends rows start .. start + n - 1 of k / v at s.len and updates the touched pages' min/max.
  void append(Seq& s, int layer, const at::Tensor& k, const at::Tensor& v, int64_t start,
              int64_t n);
  void recompute_page(Seq& s, int layer, int64_t page, int64_t len);
  void flush_pending(Seq& s);  // codec: pending prompt rows -> the streams
  // The layer's first `rows` K and V rows as [rows, Hkv, D] tensors: the stored tensors, or the
  // codec's decoded rows in the shared scratch (valid until the next call).
  std::pair<at::Tensor, at::Tensor> rows_of(const Seq& s, int layer, int64_t rows) const;
  // Selected-page attention of the sequence's rows (decode, layer >= skip_layers).
  void attend_selected_fast(Seq& s, int layer, const at::Tensor& K, const at::Tensor& V,
                            const at::Tensor& q, int64_t start, int64_t n, float sm_scale,
                            at::Tensor& out);
  void attend_selected_generic(Seq& s, int layer, const at::Tensor& K, const at::Tensor& V,
                               const at::Tensor& q, int64_t start, int64_t n, float sm_scale,
                               at::Tensor& out);
  void count_read(int layer, int64_t read, int64_t visible, int64_t pages);

  CacheContext ctx_;
  Options opts_;
  std::vector<float> scratch_p_, scratch_u_;
  std::vector<int64_t> scratch_tok_;
  mutable at::Tensor scratch_k_, scratch_v_;  // decoded rows (codec only)
  // Counters: decode reads per (query row, layer, KV head).
  double reads_ = 0, read_tokens_ = 0, visible_tokens_ = 0;
  double sel_reads_ = 0, sel_read_tokens_ = 0, sel_visible_tokens_ = 0, sel_pages_ = 0;
  double sparse_reads_ = 0;                  // selected-layer reads that skipped at least one page
  double bytes_read_ = 0, bytes_dense_ = 0;  // K/V (+ page bounds scored) vs a dense read
};

}  // namespace kvb
