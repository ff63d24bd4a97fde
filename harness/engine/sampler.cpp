#include "harness/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "harness/common/error.h"
#include "kvb/kernels/cpu_ops.h"

namespace kvb {

Sampler::Sampler(SamplingOptions opts, int64_t stream)
    : opts_(opts), rng_(opts.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(stream) + 1) {
  KVB_CHECK(opts_.temperature >= 0, "--temperature must be >= 0 (got ", opts_.temperature, ")");
  KVB_CHECK(opts_.top_p > 0 && opts_.top_p <= 1, "--top-p must be in (0, 1] (got ", opts_.top_p,
            ")");
}

int64_t Sampler::next(const float* logits, int64_t vocab) {
  if (opts_.temperature == 0.0) {
    return kernels::argmax_f32(logits, vocab);  // std::max_element's: the first maximum on ties
  }
  const float mx = *std::max_element(logits, logits + vocab);
  buf_.resize(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double p = std::exp((logits[i] - mx) / opts_.temperature);
    buf_[i] = {static_cast<float>(p), i};
    sum += p;
  }
  // Sort by probability (ties by id, so the order is total and portable) and keep the nucleus.
  std::sort(buf_.begin(), buf_.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  double kept = 0;
  size_t n = 0;
  while (n < buf_.size()) {
    kept += buf_[n].first;
    ++n;
    if (kept >= opts_.top_p * sum) break;
  }
  // 53 random bits -> uniform double in [0, 1): the same on every platform.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
  double r = u * kept, acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += buf_[i].first;
    if (r < acc) return buf_[i].second;
  }
  return buf_[n - 1].second;
}

}  // namespace kvb
