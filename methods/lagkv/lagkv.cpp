// lagkv: LagKV (Liang et al., arXiv 2504.04704; kvpress LagKVPress). The entries after the first
// `sinks` are cut into partitions of `lag_size`; each partition is scored against the next one
// (its "lag" reference): every channel of a key (and of a value) is min-max normalised by the
// reference partition's range of that channel, and the spread (standard deviation over channels)
// of the normalised row, softmaxed over the partition, says how much the row departs from what
// follows. Key and value scores are averaged; by default each partition keeps its own ranking
// (score = rank / lag_size, so every partition gives up the same share), else the raw scores
// compete across partitions (cross_scoring, for head-adaptive budgets). The sinks and the last
// partition with the remainder (no reference yet) always score 1. A sequence shorter than
// sinks + 2 x lag_size is scored so that the newest entries are preferred (kvpress's rule). No
// query is read.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

class LagKvScorer : public KvHeadScorer {
 public:
  LagKvScorer(int64_t sinks, int64_t lag, bool cross) : sinks_(sinks), lag_(lag), cross_(cross) {}
  std::map<std::string, double> settings() const override {
    return {{"setting.sinks", static_cast<double>(sinks_)},
            {"setting.lag_size", static_cast<double>(lag_)}};
  }

 private:
  bool score_head(const LayerView& v, const HeadView& hv, int64_t,
                  std::vector<float>* out) const override {
    const int64_t n = hv.len, D = v.head_dim;
    std::vector<float>& s = *out;
    s.assign(static_cast<size_t>(n), 1.f);
    if (n < sinks_ + 2 * lag_) {
      for (int64_t j = sinks_; j < n; ++j)
        s[j] = static_cast<float>(j - sinks_) / static_cast<float>(n - sinks_);
      return true;
    }
    const int64_t parts = (n - sinks_) / lag_;  // full partitions; the last one is the tail's
    std::vector<float> ks(static_cast<size_t>(lag_)), vs(static_cast<size_t>(lag_));
    std::vector<int64_t> order(static_cast<size_t>(lag_));
    for (int64_t p = 0; p + 1 < parts; ++p) {
      const int64_t first = sinks_ + p * lag_;
      spread_scores(hv.keys, D, first, &ks);
      spread_scores(hv.values, D, first, &vs);
      for (int64_t i = 0; i < lag_; ++i) ks[i] = (ks[i] + vs[i]) / 2.f;
      if (cross_) {
        for (int64_t i = 0; i < lag_; ++i) s[first + i] = ks[i];
        continue;
      }
      // rank / lag_size, the rank of each row in ascending order of score (ties: the earlier row
      // ranks lower, as a stable sort would place it).
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return ks[a] < ks[b]; });
      for (int64_t r = 0; r < lag_; ++r)
        s[first + order[r]] = static_cast<float>(r) / static_cast<float>(lag_);
    }
    return true;
  }

  // softmax over the lag rows first .. first + lag - 1 of std_c((x[c] - min_c) / (max_c - min_c)),
  // min/max over the reference rows first + lag .. first + 2 lag - 1.
  void spread_scores(const float* x, int64_t D, int64_t first, std::vector<float>* out) const {
    std::vector<float> lo(static_cast<size_t>(D), std::numeric_limits<float>::infinity()),
        hi(static_cast<size_t>(D), -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < lag_; ++i) {
      const float* r = x + (first + lag_ + i) * D;
      for (int64_t c = 0; c < D; ++c) {
        lo[c] = std::min(lo[c], r[c]);
        hi[c] = std::max(hi[c], r[c]);
      }
    }
    std::vector<double> spread(static_cast<size_t>(lag_));
    double top = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < lag_; ++i) {
      const float* r = x + (first + i) * D;
      double sum = 0, sq = 0;
      for (int64_t c = 0; c < D; ++c) {
        // A channel constant over the reference has no range: kvpress divides by zero there
        // (inf / NaN); it is taken as 0 here so the row's other channels still count.
        const float range = hi[c] - lo[c];
        const double z = range > 0.f ? (r[c] - lo[c]) / range : 0.0;
        sum += z;
        sq += z * z;
      }
      // torch.std: the unbiased estimate (divides by D - 1).
      const double mean = sum / static_cast<double>(D);
      const double var = std::max(0.0, (sq - sum * mean) / static_cast<double>(D - 1));
      spread[i] = std::sqrt(var);
      top = std::max(top, spread[i]);
    }
    double z = 0;
    for (int64_t i = 0; i < lag_; ++i) z += std::exp(spread[i] - top);
    for (int64_t i = 0; i < lag_; ++i) (*out)[i] = static_cast<float>(std::exp(spread[i] - top) / z);
  }

  int64_t sinks_, lag_;
  bool cross_;
};

ScoredMethod lagkv_method() {
  ScoredMethod m("lagkv",
                 "LagKV: score each partition of lag_size entries by how far its keys and values "
                 "depart from the next partition's range (query-agnostic)",
                 "Liang et al., LagKV: Lag-Relative Information of the KV Cache Tells Which "
                 "Tokens Are Important (arXiv 2504.04704)");
  m.info.params = {
      int_param("sinks", 4, 0, 1 << 20, "first tokens always kept"),
      int_param("lag_size", 128, 2, 1 << 20,
                "partition length; each partition is scored against the next"),
      bool_param("cross_scoring", false,
                 "let raw scores compete across partitions (else each partition keeps its own "
                 "ranking)"),
      compress_every_param()};
  m.parts = [](const nlohmann::json& p, const std::string&, const Budget&) {
    return prompt_scored(std::make_unique<LagKvScorer>(p.at("sinks").get<int64_t>(),
                                                       p.at("lag_size").get<int64_t>(),
                                                       p.at("cross_scoring").get<bool>()),
                         p);
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(lagkv, kvb::lagkv_method);
