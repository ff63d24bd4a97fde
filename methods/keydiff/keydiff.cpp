// keydiff: KeyDiff (Park et al., arXiv 2504.15364; kvpress KeyDiffPress). Each KV head keeps the
// keys least similar to the head's average key direction: the anchor is the mean of the kept keys
// normalised to unit length, and an entry's score is minus its key's cosine similarity to the
// anchor. No query is read, so the selection is query-agnostic and costs no attention pass.

#include <algorithm>
#include <cmath>

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class KeyDiffScorer : public KvHeadScorer {
 protected:
  bool score_head(const LayerView& v, const HeadView& hv, int64_t,
                  std::vector<float>* out) const override {
    // F.normalize and F.cosine_similarity clamp norms at 1e-12 and 1e-8 (PyTorch's defaults).
    constexpr double kNormEps = 1e-12, kCosEps = 1e-8;
    const int64_t D = v.head_dim;
    std::vector<float>& s = *out;
    std::vector<double> norm(static_cast<size_t>(hv.len)), anchor(static_cast<size_t>(D), 0.0);
    for (int64_t j = 0; j < hv.len; ++j) {
      const float* k = hv.keys + j * D;
      double n2 = 0;
      for (int64_t d = 0; d < D; ++d) n2 += static_cast<double>(k[d]) * k[d];
      norm[j] = std::sqrt(n2);
      const double inv = 1.0 / std::max(norm[j], kNormEps);
      for (int64_t d = 0; d < D; ++d) anchor[d] += k[d] * inv;
    }
    double a2 = 0;
    for (int64_t d = 0; d < D; ++d) {
      anchor[d] /= static_cast<double>(hv.len);
      a2 += anchor[d] * anchor[d];
    }
    const double an = std::max(std::sqrt(a2), kCosEps);
    for (int64_t j = 0; j < hv.len; ++j) {
      const float* k = hv.keys + j * D;
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += k[d] * anchor[d];
      s[j] = static_cast<float>(-dot / (std::max(norm[j], kCosEps) * an));
    }
    return true;
  }
};

ScoredMethod keydiff_method() {
  return prompt_scored_method<KeyDiffScorer>(
      "keydiff",
      "KeyDiff: keep the keys least similar to the head's mean key direction "
      "(query-agnostic), at the end of prefill",
      "Park et al., KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context "
      "LLM Inference in Resource-Constrained Environments (arXiv 2504.15364)");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(keydiff, kvb::keydiff_method);
