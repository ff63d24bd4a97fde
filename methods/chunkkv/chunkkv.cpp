// chunkkv: ChunkKV (Liu et al., arXiv 2502.00299; kvpress ChunkKVPress over SnapKVPress). Tokens are
// kept in whole chunks of `chunk_length` consecutive entries, so what survives stays readable as
// text: the SnapKV scores (observation-window attention, pooled, GQA-aggregated; the window's own
// entries scored above every prefix entry) are summed over the layer's KV heads, a chunk's score is
// the mean over its entries (the last chunk may be partial), and every KV head of the layer keeps
// the same top chunks: max(1, floor(budget x chunks)) of them for a ratio budget on a layer that
// has lost nothing yet (kvpress), else max(1, floor(per-head tokens / chunk_length)) (a token
// budget, or a decode-time compression, compress_every, of what earlier ones kept). The kept count
// is a whole number of chunks, so it may differ from the budget by less than one chunk.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "harness/common/internal_error.h"
#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

// The SnapKV scores with the observation window's entries set to the head's best prefix score + 1
// (kvpress pads the window with that value so the chunks holding it are kept first).
class WindowFirstSnapScorer : public TokenScorer {
 public:
  explicit WindowFirstSnapScorer(SnapSettings s) : s_(s), inner_(make_snap_scorer(s)) {}
  EvictionPolicy::Needs needs() const override { return inner_->needs(); }
  bool score(const LayerView& v, std::vector<std::vector<float>>* scores) const override {
    if (!inner_->score(v, scores)) return false;
    const int64_t first_window_token = v.seen - v.window;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& s = (*scores)[h];
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < hv.len; ++j)
        if (hv.idx[j] < first_window_token) top = std::max(top, s[j]);
      if (top == -std::numeric_limits<float>::infinity()) top = 0.f;
      for (int64_t j = 0; j < hv.len; ++j)
        if (hv.idx[j] >= first_window_token) s[j] = top + 1.f;
    }
    return true;
  }
  std::map<std::string, double> settings() const override { return inner_->settings(); }

 private:
  SnapSettings s_;
  std::unique_ptr<TokenScorer> inner_;
};

// Keeps whole chunks, the same for every KV head of a layer.
class ChunkAllocator : public BudgetAllocator {
 public:
  ChunkAllocator(Budget b, int64_t chunk) : b_(b), chunk_(chunk) {}
  bool over_budget(const LayerView& v) const override {
    for (const HeadView& hv : v.heads)
      if (hv.len > b_.per_head(v.total(), v.n_kv_heads)) return true;
    return false;
  }
  bool keep(const LayerView& v, const Protect&, const std::vector<std::vector<float>>& scores,
            std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t n = v.heads[0].len;
    for (const HeadView& hv : v.heads)
      KVB_ASSERT(hv.len == n && std::equal(hv.idx, hv.idx + n, v.heads[0].idx), "chunkkv",
                 "the KV heads of a layer hold different tokens");
    const int64_t chunks = (n + chunk_ - 1) / chunk_;
    // A ratio of a layer that has lost nothing yet counts chunks (kvpress's rule); otherwise (a
    // token budget, or a decode-time compression of what earlier ones kept) the per-head budget.
    const bool whole = b_.unit == BudgetUnit::kRatio && n == v.total();
    int64_t kept = whole ? static_cast<int64_t>(std::floor(b_.value * static_cast<double>(chunks) + 1e-9))
                         : b_.per_head(v.total(), v.n_kv_heads) / chunk_;
    kept = std::clamp<int64_t>(kept, 1, chunks);
    if (kept == chunks) return false;
    std::vector<double> chunk_score(static_cast<size_t>(chunks), 0.0);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t a = c * chunk_, e = std::min(n, a + chunk_);
      double sum = 0;
      for (int64_t j = a; j < e; ++j)
        for (const auto& s : scores) sum += s[j];
      chunk_score[c] = sum / static_cast<double>(e - a);
    }
    std::vector<int64_t> order(static_cast<size_t>(chunks));
    std::iota(order.begin(), order.end(), 0);
    // Best chunks first; ties: the earlier chunk.
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return chunk_score[a] > chunk_score[b]; });
    order.resize(static_cast<size_t>(kept));
    std::sort(order.begin(), order.end());
    std::vector<int64_t> slots;
    for (int64_t c : order)
      for (int64_t j = c * chunk_; j < std::min(n, (c + 1) * chunk_); ++j) slots.push_back(j);
    keep->assign(static_cast<size_t>(v.n_kv_heads), slots);
    return true;
  }
  std::map<std::string, double> settings() const override {
    return {{"setting.chunk_length", static_cast<double>(chunk_)}};
  }

 private:
  Budget b_;
  int64_t chunk_;
};

ScoredMethod chunkkv_method() {
  ScoredMethod m("chunkkv",
                 "ChunkKV: SnapKV scores pooled into chunks of consecutive tokens; every head of "
                 "a layer keeps the same top chunks, at the end of prefill",
                 "Liu et al., ChunkKV: Semantic-Preserving KV Cache Compression for Efficient "
                 "Long-Context LLM Inference (arXiv 2502.00299)");
  m.info.params = snap_params(snapkv_presets(), "kvpress");
  m.info.params.push_back(int_param("chunk_length", 20, 1, 1 << 20,
                                    "tokens per chunk (kvpress's default; the paper uses 10)"));
  m.info.caps.query_aware = true;
  m.any_allocator = false;
  m.parts = [](const nlohmann::json& p, const std::string& method, const Budget& b) {
    const SnapSettings snap = parse_snap(p, method, snapkv_presets());
    PolicyParts parts = prompt_scored(std::make_unique<WindowFirstSnapScorer>(snap), p);
    parts.allocator = std::make_unique<ChunkAllocator>(b, p.at("chunk_length").get<int64_t>());
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(chunkkv, kvb::chunkkv_method);
