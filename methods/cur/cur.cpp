// cur: CurDKV's leverage scores (Sengupta et al., arXiv 2509.15038; kvpress CURPress). An entry's
// key leverage is its squared key norm and its value leverage its squared value norm; with
// local_window w > 0 each is normalised within consecutive windows of w entries (the local
// approximation of the paper), and the two are combined (key | value | kv_avg | kv_product),
// normalised over the head and the first `sinks` entries set to 1 so they are always kept. No
// query is read. kvpress's random-projection option (use_random_leverage) draws an unseeded
// Gaussian matrix per call and is not offered: its selections cannot be reproduced.

#include <algorithm>

#include "methods/common/scored_method.h"

namespace kvb {
namespace {

enum class Leverage { kKey, kValue, kAvg, kProduct };
const EnumName<Leverage> kLeverages[] = {{Leverage::kKey, "key"},
                                         {Leverage::kValue, "value"},
                                         {Leverage::kAvg, "kv_avg"},
                                         {Leverage::kProduct, "kv_product"}};

class CurScorer : public KvHeadScorer {
 public:
  CurScorer(int64_t sinks, Leverage lev, int64_t window)
      : sinks_(sinks), lev_(lev), window_(window) {}
  std::map<std::string, double> settings() const override {
    return {{"setting.sinks", static_cast<double>(sinks_)},
            {"setting.local_window", static_cast<double>(window_)}};
  }

 protected:
  bool score_head(const LayerView& v, const HeadView& hv, int64_t,
                  std::vector<float>* out) const override {
    const int64_t D = v.head_dim, n = hv.len;
    std::vector<float>& s = *out;
    std::vector<double> k2(static_cast<size_t>(n)), v2(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      double a = 0, b = 0;
      for (int64_t d = 0; d < D; ++d) {
        a += static_cast<double>(hv.keys[j * D + d]) * hv.keys[j * D + d];
        b += static_cast<double>(hv.values[j * D + d]) * hv.values[j * D + d];
      }
      k2[j] = a;
      v2[j] = b;
    }
    if (window_ > 0) {
      local_normalise(&k2);
      local_normalise(&v2);
    }
    double total = 0;
    std::vector<double> c(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      switch (lev_) {
        case Leverage::kKey: c[j] = k2[j]; break;
        case Leverage::kValue: c[j] = v2[j]; break;
        case Leverage::kAvg: c[j] = (k2[j] + v2[j]) / 2; break;
        case Leverage::kProduct: c[j] = k2[j] * v2[j]; break;
      }
      total += c[j];
    }
    for (int64_t j = 0; j < n; ++j)
      s[j] = j < sinks_ ? 1.f : static_cast<float>(total > 0 ? c[j] / total : 0.0);
    return true;
  }

 private:
  // x[j] / (sum of x over j's window), windows of window_ entries from the first (the last one
  // may be partial: kvpress pads it with zeros, which add nothing to the sum).
  void local_normalise(std::vector<double>* x) const {
    const int64_t n = static_cast<int64_t>(x->size());
    for (int64_t a = 0; a < n; a += window_) {
      const int64_t b = std::min(n, a + window_);
      double sum = 0;
      for (int64_t j = a; j < b; ++j) sum += (*x)[j];
      for (int64_t j = a; j < b; ++j) (*x)[j] = sum > 0 ? (*x)[j] / sum : 0.0;
    }
  }

  int64_t sinks_;
  Leverage lev_;
  int64_t window_;
};

ScoredMethod cur_method() {
  ScoredMethod m("cur",
                 "CurDKV leverage: keep the entries with the largest key x value leverage "
                 "(squared norms, locally normalised; query-agnostic)",
                 "Sengupta et al., Value-Guided KV Compression for LLMs via Approximated CUR "
                 "Decomposition (arXiv 2509.15038)");
  m.info.params = {
      int_param("sinks", 4, 0, 1 << 20, "first tokens always kept"),
      enum_param("leverage", kLeverages, Leverage::kProduct,
                 "which leverage scores: keys', values', their mean or their product"),
      int_param("local_window", 16, 0, 1 << 20,
                "normalise leverages within windows of this many entries (0: over the whole "
                "head)"),
      compress_every_param()};
  m.parts = [](const nlohmann::json& p, const std::string&, const Budget&) {
    return prompt_scored(std::make_unique<CurScorer>(p.at("sinks").get<int64_t>(),
                                                     param_enum(p, "leverage", kLeverages),
                                                     p.at("local_window").get<int64_t>()),
                         p);
  };
  return m;
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_SCORED_METHOD(cur, kvb::cur_method);
