// expected_attention: Expected Attention (Devoto et al., arXiv 2510.00636; kvpress
// ExpectedAttentionPress). Scores each kept entry by the attention that future queries are expected
// to pay it, from the statistics of the queries seen so far: the pre-RoPE queries (from token
// `sinks` on) give a mean mu and a covariance S per query head; RoPE averaged over the next
// `future_positions` positions (R = mean_t R(t), one linear map) moves them to mu' = R mu and
// S' = R S R^T; a Gaussian query q ~ N(mu', S') gives E[exp(s q.k)] = exp(s k.mu' + s^2/2 k^T S' k)
// (s: the attention scale), softmaxed over the head's entries, averaged over the query heads of the
// GQA group and scaled by (score + epsilon) x ||v||. The first `sinks` entries are kept whatever
// their score. Query statistics are collected while a compression may still read them
// (prefill, and decode when compress_every > 0) and held as metadata in the ledger.

#include <algorithm>
#include <cmath>
#include <limits>

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

struct Settings {
  int64_t future = 512;
  int64_t sinks = 4;
  bool covariance = true;
  bool vnorm = true;
  double epsilon = 0.0;
};

// The average rotation over positions from .. from + n - 1 as per-pair cosines and sines: R maps
// (x_a, x_b) of each channel pair to (c x_a - s x_b, c x_b + s x_a).
void average_rope(const RopeAngles& r, int64_t from, int64_t n, std::vector<double>* c,
                  std::vector<double>* s) {
  c->assign(static_cast<size_t>(r.half), 0.0);
  s->assign(static_cast<size_t>(r.half), 0.0);
  for (int64_t t = from; t < from + n; ++t)
    for (int64_t i = 0; i < r.half; ++i) {
      (*c)[i] += r.cos[t * r.half + i];
      (*s)[i] += r.sin[t * r.half + i];
    }
  for (int64_t i = 0; i < r.half; ++i) {
    (*c)[i] /= static_cast<double>(n);
    (*s)[i] /= static_cast<double>(n);
  }
}

class ExpectedAttentionScorer : public KvHeadScorer {
 public:
  explicit ExpectedAttentionScorer(Settings s) : s_(s) {}
  std::map<std::string, double> settings() const override {
    return {{"setting.future_positions", static_cast<double>(s_.future)},
            {"setting.sinks", static_cast<double>(s_.sinks)}};
  }

 protected:
  EvictionPolicy::Needs more_needs() const override {
    EvictionPolicy::Needs n;
    n.query_stats_from = s_.sinks;
    n.rope_ahead = s_.future;
    return n;
  }
  bool score_head(const LayerView& v, const HeadView& hv, int64_t h,
                  std::vector<float>* scores) const override {
    if (v.queries.count == 0 || v.rope.cos == nullptr) return false;  // no query seen yet
    const int64_t D = v.head_dim, half = v.rope.half, G = v.group;
    std::vector<double> rc, rs;
    average_rope(v.rope, v.next_pos, s_.future, &rc, &rs);
    // Channel pairs: (i, i + half), or (2i, 2i + 1) for interleaved RoPE.
    auto pair = [&](int64_t i, int64_t* a, int64_t* b) {
      *a = v.rope.interleaved ? 2 * i : i;
      *b = v.rope.interleaved ? 2 * i + 1 : i + half;
    };
    auto rotate = [&](const double* x, double* y, int64_t stride) {  // y = R x (strided vectors)
      for (int64_t i = 0; i < half; ++i) {
        int64_t a, b;
        pair(i, &a, &b);
        y[a * stride] = rc[i] * x[a * stride] - rs[i] * x[b * stride];
        y[b * stride] = rc[i] * x[b * stride] + rs[i] * x[a * stride];
      }
    };
    const double sc = v.sm_scale;
    std::vector<double> mu(static_cast<size_t>(D)), x(static_cast<size_t>(D)),
        cov(static_cast<size_t>(D * D)), tmp(static_cast<size_t>(D * D));
    std::vector<float> cov_f(static_cast<size_t>(D * D));
    const int64_t n = hv.len;
    std::vector<float>& out = *scores;
    std::vector<double> acc(static_cast<size_t>(n), 0.0), logit(static_cast<size_t>(n));
    for (int64_t g = 0; g < G; ++g) {
      const int64_t qh = h * G + g;
      for (int64_t d = 0; d < D; ++d) x[d] = v.queries.mean[qh * D + d];
      rotate(x.data(), mu.data(), 1);
      if (s_.covariance) {
        // S' = R S R^T: R applied to every column of S gives M = R S; R applied to every row of
        // M gives M R^T (row r of M R^T is R m_r).
        const float* S = v.queries.cov + qh * D * D;
        for (int64_t e = 0; e < D * D; ++e) tmp[e] = S[e];
        for (int64_t col = 0; col < D; ++col) rotate(tmp.data() + col, cov.data() + col, D);
        for (int64_t row = 0; row < D; ++row) rotate(cov.data() + row * D, tmp.data() + row * D, 1);
        for (int64_t e = 0; e < D * D; ++e) cov_f[e] = static_cast<float>(tmp[e]);
      }
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        const float* k = hv.keys + j * D;
        double l = 0;
        for (int64_t d = 0; d < D; ++d) l += k[d] * mu[d];
        l *= sc;
        if (s_.covariance) {
          double quad = 0;
          for (int64_t a = 0; a < D; ++a) {
            const float* row = cov_f.data() + a * D;
            float dot = 0.f;
            for (int64_t b = 0; b < D; ++b) dot += row[b] * k[b];
            quad += static_cast<double>(k[a]) * dot;
          }
          l += sc * sc * quad / 2;
        }
        logit[j] = l;
        if (hv.idx[j] >= s_.sinks) top = std::max(top, l);
      }
      // Softmax over the entries that compete (the sinks are kept anyway: kvpress scores the
      // rest alone).
      double z = 0;
      for (int64_t j = 0; j < n; ++j)
        if (hv.idx[j] >= s_.sinks) z += std::exp(logit[j] - top);
      for (int64_t j = 0; j < n; ++j)
        if (hv.idx[j] >= s_.sinks) acc[j] += std::exp(logit[j] - top) / z;
    }
    for (int64_t j = 0; j < n; ++j) {
      double sj = acc[j] / static_cast<double>(G);
      if (s_.vnorm) {
        double v2 = 0;
        for (int64_t d = 0; d < D; ++d)
          v2 += static_cast<double>(hv.values[j * D + d]) * hv.values[j * D + d];
        sj = (sj + s_.epsilon) * std::sqrt(v2);
      }
      out[j] = static_cast<float>(sj);
    }
    return true;
  }

 private:
  Settings s_;
};

ScoredMethod expected_attention_method() {
  ScoredMethod m("expected_attention",
                 "Expected Attention: keep the entries future queries are expected to attend "
                 "most (query mean + covariance, RoPE averaged ahead, x value norm)",
                 "Devoto et al., Expected Attention: KV Cache Compression by Estimating "
                 "Attention from Future Queries Distribution (arXiv 2510.00636)");
  m.info.params = {
      int_param("future_positions", 512, 1, 1 << 20,
                "RoPE is averaged over this many positions after the current one"),
      int_param("sinks", 4, 0, 1 << 20,
                "first tokens: always kept, and their queries left out of the statistics"),
      bool_param("use_covariance", true, "include the query covariance term"),
      bool_param("use_vnorm", true, "scale the scores by the value norms"),
      float_param("epsilon", 0.0, 0.0, 1e6, "added to the scores before the value-norm scaling"),
      compress_every_param()};
  m.info.caps.query_aware = false;
  m.parts = [](const nlohmann::json& p, const std::string&, const Budget&) {
    Settings s;
    s.future = p.at("future_positions").get<int64_t>();
    s.sinks = p.at("sinks").get<int64_t>();
    s.covariance = p.at("use_covariance").get<bool>();
    s.vnorm = p.at("use_vnorm").get<bool>();
    s.epsilon = p.at("epsilon").get<double>();
    PolicyParts parts = prompt_scored(std::make_unique<ExpectedAttentionScorer>(s), p);
    parts.protect.sinks = s.sinks;
    return parts;
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(expected_attention, kvb::expected_attention_method);
