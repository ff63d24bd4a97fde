// finch: FINCH (Corallo & Papotti, TACL 2024, "FINCH: Prompt-guided Key-Value Cache
// Compression"; kvpress FinchPress). SnapKV-style selection whose observation window is the
// question itself: with the context and its question prefilled together (qa mode=query_aware; the
// protocol tells the store where the question starts, QuestionAwareCache), each question query's
// causal attention over the prompt is weighted by the query's position (normalize_scores: a later
// query spreads its mass over more keys), averaged over the question and over the GQA group, and
// each KV head keeps the question's own entries first (scored above every context entry) and the
// best-scored context entries in the rest of its budget. Keys are re-rotated to contiguous
// positions by default (kvpress's rerotate_keys).

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/common/error.h"
#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class FinchScorer : public KvHeadScorer {
 public:
  FinchScorer(int64_t max_question, bool normalize) : max_q_(max_question), normalize_(normalize) {}
  std::map<std::string, double> settings() const override {
    return {{"setting.max_question", static_cast<double>(max_q_)},
            {"setting.normalize_scores", normalize_ ? 1.0 : 0.0}};
  }

 protected:
  EvictionPolicy::Needs more_needs() const override {
    EvictionPolicy::Needs n;
    n.window = max_q_;
    n.window_queries = true;
    return n;
  }
  bool score_head(const LayerView& v, const HeadView& hv, int64_t h,
                  std::vector<float>* scores) const override {
    KVB_CHECK(v.question > 0, "method finch: scores the context by its question, so it needs the "
                              "question in the prompt (qa with mode=query_aware)");
    KVB_CHECK(v.question <= max_q_, "method finch: the question has ", v.question,
              " tokens, more than max_question=", max_q_);
    if (v.window < v.question || v.window_queries == nullptr) return false;
    const int64_t D = v.head_dim, G = v.group, Hq = v.n_kv_heads * G, q = v.question;
    const int64_t first_question = v.seen - q;  // token index of the question's first token
    const int64_t n = hv.len;
    std::vector<float>& out = *scores;
    std::vector<double> acc(static_cast<size_t>(n), 0.0), logit(static_cast<size_t>(n));
    for (int64_t i = v.window - q; i < v.window; ++i) {
      const int64_t t = v.seen - v.window + i;  // the query's token index
      for (int64_t g = 0; g < G; ++g) {
        const float* qr = v.window_queries + (i * Hq + h * G + g) * D;
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n && hv.idx[j] <= t; ++j) {
          double l = 0;
          for (int64_t d = 0; d < D; ++d) l += static_cast<double>(qr[d]) * hv.keys[j * D + d];
          logit[j] = l * v.sm_scale;
          top = std::max(top, logit[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < n && hv.idx[j] <= t; ++j) z += std::exp(logit[j] - top);
        const double w = normalize_ ? static_cast<double>(t) : 1.0;
        for (int64_t j = 0; j < n && hv.idx[j] <= t; ++j)
          acc[j] += w * std::exp(logit[j] - top) / z;
      }
    }
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      out[j] = static_cast<float>(acc[j] / static_cast<double>(q * G));
      if (hv.idx[j] < first_question) best = std::max(best, out[j]);
    }
    if (best == -std::numeric_limits<float>::infinity()) best = 0.f;
    for (int64_t j = 0; j < n; ++j)
      if (hv.idx[j] >= first_question) out[j] = best + 1.f;  // the question is kept first
    return true;
  }

 private:
  int64_t max_q_;
  bool normalize_;
};

ScoredMethod finch_method() {
  ScoredMethod m("finch",
                 "FINCH: the question's own attention over the prompt (position-normalised) picks "
                 "the context entries each head keeps; the question is kept first",
                 "Corallo and Papotti, FINCH: Prompt-guided Key-Value Cache Compression for Large "
                 "Language Models, TACL 2024");
  m.default_position_mode = "rerotated";
  m.info.caps.query_aware = true;
  m.info.caps.needs_question = true;
  m.info.params = {
      int_param("max_question", 256, 1, 1 << 16,
                "longest question it scores by (queries held while the prompt is prefilled)"),
      bool_param("normalize_scores", true,
                 "weight each question query's attention by its position (kvpress "
                 "normalize_scores)")};
  m.parts = [](const nlohmann::json& p, const std::string&, const Budget&) {
    PolicyParts parts;
    parts.scorer = std::make_unique<FinchScorer>(p.at("max_question").get<int64_t>(),
                                                 p.at("normalize_scores").get<bool>());
    parts.schedule.end_prefill = true;  // once: the question is the prompt's
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(finch, kvb::finch_method);
