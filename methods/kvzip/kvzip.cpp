// kvzip: KVzip (Kim et al., 2025, "KVzip: Query-Agnostic KV Cache Compression with Context
// Reconstruction"; official code snu-mllab/KVzip; kvpress KVzipPress). After the context is
// prefilled, the model is asked to repeat it ("Repeat the previous context exactly." then the
// context again, teacher-forced, chunk by chunk) against the uncompressed cache; each cached entry
// of a KV head is scored by the largest attention weight any reconstruction query of the head's GQA
// group gives it. The lowest-scored entries are evicted over the whole cache (layers and heads get
// non-uniform budgets; layerwise=true keeps every layer's total equal), the first n_sink tokens
// never. The reconstruction runs on forks of the sequence that are released afterwards
// (ContextPassCache), so its own KV never stays; the store is EvictingKvCache, so evicted entries
// free memory.

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/engine/engine.h"
#include "harness/kv/context_pass.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/method_registry.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "methods/common/pre_pass_kv_cache.h"

namespace kvb {
namespace {

constexpr const char* kFirstPrompt = "\n\nRepeat the previous context exactly.";
constexpr const char* kLaterPrompt =
    "\n\nRepeat the part of the previous context exactly, starting with";
constexpr int64_t kOverlapTokens = 8;  // a later chunk's prompt quotes the previous chunk's tail

struct KvzipSettings {
  Budget budget;
  int64_t n_sink = 4;
  int64_t chunk_size = 2048;
  bool layerwise = false;
  bool plus = false;  // KVzip+: weights normalized by the query's hidden norm and ||v W_O||
};

// One sequence's reconstruction scores, [layer][kv head][token index] over its context, and the
// entries each layer keeps (over all its heads) once they are ranked.
struct ContextScores {
  TokenScores score;
  std::vector<int64_t> keep_per_layer;
};

const PrePassInfo kPass{"kvzip", "context reconstruction pass",
                        "runs it (qa with mode=query_agnostic)", "reconstruction"};

// Keeps the layer's best keep_per_layer entries over all its heads (ties: the earlier head, then
// the earlier entry), so each head keeps what its own entries earn.
class KvzipPolicy : public PrePassPolicy<ContextScores> {
 public:
  using PrePassPolicy::PrePassPolicy;

 protected:
  bool select_from(const ContextScores& scores, const LayerView& v,
                   std::vector<std::vector<int64_t>>* keep) const override {
    const auto& score = scores.score[v.layer];
    struct Entry {
      float s;
      int64_t h, j;
    };
    std::vector<Entry> all;
    for (int64_t h = 0; h < v.n_kv_heads; ++h)
      for (int64_t j = 0; j < v.heads[h].len; ++j) {
        const int64_t t = v.heads[h].idx[j];
        KVB_CHECK(t < static_cast<int64_t>(score[h].size()), "method kvzip: token ", t,
                  " was not part of the reconstructed context");
        all.push_back({score[h][t], h, j});
      }
    const int64_t n_keep = scores.keep_per_layer[v.layer];
    if (n_keep >= static_cast<int64_t>(all.size())) return false;
    std::stable_sort(all.begin(), all.end(),
                     [](const Entry& a, const Entry& b) { return a.s > b.s; });
    keep->assign(static_cast<size_t>(v.n_kv_heads), {});
    for (int64_t i = 0; i < n_keep; ++i) (*keep)[all[i].h].push_back(all[i].j);
    for (auto& k : *keep) std::sort(k.begin(), k.end());
    return true;
  }
};

struct KvzipPass {
  int64_t fork;
  int64_t start, end;  // the context tokens this chunk reconstructs
  int64_t context;     // the context's length (fork rows at or past it are the pass's own)
  ContextScores* scores;
  // KVzip+: ||v W_O^(j)|| of the chunk's entries, [group, chunk entries] per [layer][KV head],
  // computed at the layer's first step (the chunk's rows do not change during its pass).
  std::vector<std::vector<at::Tensor>> value_norms = {};
};

class KvzipKvCache : public PrePassKvCache<ContextScores, KvzipPass>,
                     public ContextPassCache,
                     public HiddenStateCache {
 public:
  KvzipKvCache(const CacheContext& ctx, Options opts, KvzipSettings s,
               std::shared_ptr<PrePassScores<ContextScores>> scores)
      : PrePassKvCache(ctx, std::move(opts), std::make_unique<KvzipPolicy>(scores, kPass), scores,
                       kPass),
        s_(s) {}

  int64_t run_context_pass(const ContextPass& p) override {
    KVB_CHECK(p.engine != nullptr && p.encode,
              "method kvzip: the context pass needs the engine "
              "and the tokenizer");
    const int64_t n = static_cast<int64_t>(p.context.size());
    KVB_CHECK(seq_len(p.seq) == n, "method kvzip: sequence ", p.seq, " holds ", seq_len(p.seq),
              " tokens, not its ", n, "-token context");
    KVB_CHECK(p.prefix_tokens >= 0 && p.prefix_tokens <= n, "method kvzip: prefix of ",
              p.prefix_tokens, " tokens in a ", n, "-token context");
    model_ = &p.engine->model();
    ContextScores cs;
    cs.score = zero_token_scores(n);
    const std::vector<int64_t> first = p.encode(kFirstPrompt), later = p.encode(kLaterPrompt);
    int64_t prefilled = 0;
    for (int64_t start = p.prefix_tokens; start < n; start += s_.chunk_size) {
      const int64_t end = std::min(n, start + s_.chunk_size);
      std::vector<int64_t> ids = start == p.prefix_tokens ? first : later;
      if (start > p.prefix_tokens) {
        const int64_t from = std::max(start - kOverlapTokens, start - s_.chunk_size);
        ids.insert(ids.end(), p.context.begin() + from, p.context.begin() + start);
      }
      ids.insert(ids.end(), p.turn_close.begin(), p.turn_close.end());
      ids.insert(ids.end(), p.context.begin() + start, p.context.begin() + end);
      run_pass(*p.engine, p.seq, ids, [&](int64_t fork) {
        return KvzipPass{fork, start, end, n, &cs};
      });
      prefilled += static_cast<int64_t>(ids.size());
    }
    scored(p.seq, std::move(cs), prefilled);
    return prefilled;
  }

  // KVzip+ reads the residual stream of the reconstruction's rows (the rest is ignored).
  void layer_hidden(int layer, const at::Tensor& hidden) override {
    if (s_.plus && pass_) hidden_ = {layer, hidden};
  }

  at::Tensor attend(const LayerInput& in) override {
    at::Tensor out = PrePassKvCache::attend(in);
    hidden_.reset();  // the forward's buffer is only valid during this call
    return out;
  }

  std::map<std::string, double> counters() const override {
    auto c = PrePassKvCache::counters();
    c["setting.n_sink"] = static_cast<double>(s_.n_sink);
    c["setting.chunk_size"] = static_cast<double>(s_.chunk_size);
    c["setting.layerwise"] = s_.layerwise ? 1.0 : 0.0;
    c["setting.plus"] = s_.plus ? 1.0 : 0.0;
    return c;
  }

 private:
  // The attention of this step's reconstruction queries over the keys kvpress scores them against
  // (the first min(n_sink, start) tokens, the chunk being reconstructed, the pass's own tokens so
  // far and, causally, the step's), maxed over the queries and the GQA group into the chunk's
  // scores.
  void score_rows(const LayerInput& in, int64_t row0, int64_t rows) override {
    KvzipPass& p = *pass_;
    const at::Tensor q = in.q->narrow(0, row0, rows).to(at::kCPU).to(at::kFloat);
    const at::Tensor k_new = in.k->narrow(0, row0, rows).to(at::kCPU).to(at::kFloat);
    const std::vector<HeadSnapshot> held = probe_view(in.layer, p.fork);
    const int64_t sink = std::min(s_.n_sink, p.start);
    at::Tensor hidden_norm;  // [rows]: KVzip+'s ||attention input|| of each reconstruction query
    if (s_.plus) hidden_norm = attention_input_norm(in.layer, row0, rows);
    for (int64_t h = 0; h < n_kv_heads_; ++h) {
      const at::Tensor& idx = held[h].index;
      const at::Tensor scored =
          idx.lt(sink) | (idx.ge(p.start) & idx.lt(p.end)) | idx.ge(p.context);
      const at::Tensor sel = scored.nonzero().squeeze(1);
      const at::Tensor sel_idx = idx.index_select(0, sel);
      const at::Tensor probs = fork_rows_attention(q, k_new, held[h].k.index_select(0, sel), h,
                                                   group_, in.sm_scale);  // [group, rows, m + rows]
      const at::Tensor chunk_cols = (sel_idx.ge(p.start) & sel_idx.lt(p.end)).nonzero().squeeze(1);
      at::Tensor weights = probs.index_select(2, chunk_cols);  // [group, rows, chunk entries]
      if (s_.plus) {
        if (p.value_norms.empty())
          p.value_norms.assign(static_cast<size_t>(n_layers_),
                               std::vector<at::Tensor>(static_cast<size_t>(n_kv_heads_)));
        at::Tensor& norms = p.value_norms[in.layer][h];
        if (!norms.defined())
          norms = value_output_norms(in.layer, h,
                                     held[h].v.index_select(0, sel).index_select(0, chunk_cols));
        weights = weights / hidden_norm.view({1, rows, 1}) * norms.unsqueeze(1);
      }
      const at::Tensor best = std::get<0>(weights.flatten(0, 1).max(0)).contiguous();
      const at::Tensor tok = sel_idx.index_select(0, chunk_cols).contiguous();
      const float* b = best.data_ptr<float>();
      const int64_t* t = tok.data_ptr<int64_t>();
      std::vector<float>& out = p.scores->score[in.layer][h];
      for (int64_t c = 0; c < tok.size(0); ++c) out[t[c]] = std::max(out[t[c]], b[c]);
    }
  }

  // ||RMSNorm(x) * w|| of the layer's input rows, the attention's input kvpress divides by:
  // ||x * w|| / sqrt(mean(x^2) + eps), from the residual stream the forward handed over.
  at::Tensor attention_input_norm(int layer, int64_t row0, int64_t rows) const {
    KVB_ASSERT(hidden_ && hidden_->first == layer, "kvzip",
               "no hidden states handed over for layer ", layer);
    const at::Tensor x = hidden_->second.narrow(0, row0, rows).to(at::kCPU).to(at::kFloat);
    const at::Tensor w = model_->weights.layers[layer].attn_norm.to(at::kCPU).to(at::kFloat);
    return (x * w).norm(2, {1}) / (x.pow(2).mean({1}) + model_->config.norm_eps).sqrt();
  }

  // ||v W_O^(j)|| for each query head j of KV head `head`'s group: how much each entry's value
  // writes into the residual stream through that head's slice of the output projection.
  //   v [entries, head_dim] -> [group, entries]
  at::Tensor value_output_norms(int layer, int64_t head, const at::Tensor& v) const {
    const at::Tensor& wo = model_->weights.layers[layer].wo;  // [dim, n_heads * head_dim]
    const int64_t d = v.size(1);
    const at::Tensor w = wo.narrow(1, head * group_ * d, group_ * d).to(at::kCPU).to(at::kFloat);
    std::vector<at::Tensor> per_head;
    for (int64_t g = 0; g < group_; ++g)
      per_head.push_back(at::matmul(v, w.narrow(1, g * d, d).t()).norm(2, {1}));  // [entries]
    return at::stack(per_head);
  }

  // Gives the sinks the top score and decides how many entries each layer keeps: the budget's
  // total over the whole cache, split by the global ranking (or equally, layerwise).
  void prepare(int64_t seq_id, ContextScores* cs) override {
    const int64_t seen = seq_len(seq_id);
    float top = 0.f;
    for (const auto& layer : cs->score)
      for (const auto& head : layer)
        for (float x : head) top = std::max(top, x);
    for (auto& layer : cs->score)
      for (auto& head : layer)
        for (int64_t j = 0; j < std::min<int64_t>(s_.n_sink, static_cast<int64_t>(head.size()));
             ++j)
          head[j] = top + 1.f;
    const int64_t per_layer = s_.budget.per_layer(seen, n_kv_heads_);
    cs->keep_per_layer.assign(static_cast<size_t>(n_layers_), per_layer);
    if (s_.layerwise) return;
    struct Entry {
      float s;
      int64_t layer;
    };
    std::vector<Entry> all;
    for (int64_t l = 0; l < n_layers_; ++l)
      for (const auto& head : cs->score[l])
        for (float x : head) all.push_back({x, l});
    const int64_t total =
        std::min<int64_t>(per_layer * n_layers_, static_cast<int64_t>(all.size()));
    std::stable_sort(all.begin(), all.end(),
                     [](const Entry& a, const Entry& b) { return a.s > b.s; });
    std::fill(cs->keep_per_layer.begin(), cs->keep_per_layer.end(), 0);
    for (int64_t i = 0; i < total; ++i) ++cs->keep_per_layer[all[i].layer];
  }

  KvzipSettings s_;
  const Model* model_ = nullptr;                      // the engine's, during the context pass
  std::optional<std::pair<int, at::Tensor>> hidden_;  // (layer, [T, dim] residual) for KVzip+
};

MethodInfo kvzip_info() {
  MethodInfo info;
  info.name = "kvzip";
  info.summary =
      "KVzip: the model repeats the context against its cache; each entry keeps what the "
      "reconstruction attends to it most, ranked over every layer and head";
  info.paper =
      "Kim et al., KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction, 2025 "
      "(arXiv:2505.23416)";
  info.caps.evicts = true;
  info.caps.needs_context_pass = true;
  info.params = budget_params(0.5, "ratio");
  info.params.push_back(
      int_param("n_sink", 4, 0, 1 << 20, "first tokens never evicted (attention sinks)"));
  info.params.push_back(
      int_param("chunk_size", 2048, 1, 1 << 24, "context tokens reconstructed per pass"));
  info.params.push_back(bool_param("plus", false,
                                   "KVzip+: each reconstruction weight divided by its query's "
                                   "attention-input norm and multiplied by ||v W_O|| of the entry "
                                   "(kvpress kvzip_plus_normalization)"));
  info.params.push_back(bool_param("layerwise", false,
                                   "keep the same total per layer (heads still share it by score); "
                                   "false ranks the whole cache at once"));
  return info;
}

std::unique_ptr<KvCache> make_kvzip(const CacheContext& ctx, const nlohmann::json& p) {
  KvzipSettings s;
  s.budget = parse_budget(p, "kvzip");
  s.n_sink = p.at("n_sink").get<int64_t>();
  s.chunk_size = p.at("chunk_size").get<int64_t>();
  s.layerwise = p.at("layerwise").get<bool>();
  s.plus = p.at("plus").get<bool>();
  EvictingKvCache::Options o;
  o.name = "kvzip";
  o.position_mode = PositionMode::kAbsolute;
  return std::make_unique<KvzipKvCache>(ctx, o, s,
                                        std::make_shared<PrePassScores<ContextScores>>());
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kvzip, kvb::kvzip_info, kvb::make_kvzip);
