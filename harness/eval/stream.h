#pragma once
// The `stream` protocol: teacher-forced scoring of a text window with the method active during
// decoding. The first `prefill_tokens` tokens are prefilled (the method's end_prefill runs there), the
// rest are fed one decode step at a time, exactly as generation would, and every position's next-token
// distribution is compared with the full-cache run of the same schedule (cached on disk by content hash,
// so a grid of N methods computes it once).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/eval/ledger.h"
#include "harness/kv/method.h"
#include "harness/model/model.h"

namespace kvb {

struct StreamOptions {
  int64_t prefill_tokens = 1;  // tokens prefilled before token-by-token decoding (>= 1: BOS)
  int64_t prefill_chunk = 512;
  std::string cache_dir;       // baseline cache; "" disables caching
};

struct StreamSampleResult {
  int64_t tokens = 0;            // predicted positions
  double nll_sum = 0;
  std::vector<float> kl;         // [tokens] KL(full || method), nats
  int64_t top1_agree = 0;        // positions whose argmax matches the baseline's
  double abs_dprob_sum = 0;      // sum over positions of |p_method(target) - p_full(target)|
  LedgerEntry ledger;            // the method's state after the window (its peak)
  std::map<std::string, double> counters;
  bool baseline_from_cache = false;
  nlohmann::json to_json() const;
  static StreamSampleResult from_json(const nlohmann::json& j);
};

// Log-probabilities of every position under the full-cache method (the baseline): [n - 1, vocab]
// fp32, row i predicting tokens[i + 1]. Cached under cache_dir by a hash of everything that
// determines them (the model by its content: Model::content_hash), each entry with a checksum of
// its payload; an entry that is missing or fails its check is computed and (atomically) replaced.
std::vector<float> stream_baseline_logprobs(std::shared_ptr<Model> model,
                                            const std::vector<int64_t>& tokens,
                                            const StreamOptions& opts, bool* from_cache);

// The baseline method with its defaults (`full`) is scored against its own logits (KL exactly 0)
// and checks the cache with them: an entry that differs is wrong, so it is named in one warning
// line on stderr and replaced.
StreamSampleResult run_stream_sample(std::shared_ptr<Model> model, const std::string& method,
                                     const nlohmann::json& method_params,
                                     const std::vector<int64_t>& tokens, const StreamOptions& opts);

// Run-level metrics from all samples: nll, ppl, kl_mean/p50/p90/p99/max, top1_agreement,
// mean_abs_dprob, plus the ledger.
std::vector<Metric> stream_metrics(const std::vector<StreamSampleResult>& samples,
                                   bool declared_simulated);

}  // namespace kvb
