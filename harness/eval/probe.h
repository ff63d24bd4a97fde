#pragma once
// The `probe` protocol: per-layer fidelity of a method's cache against exact attention. The method's
// cache and an exact (paged, uncompressed) cache receive the SAME q/k/v at every layer, so each layer's
// error is the cache's own, not error propagated from earlier layers. At sampled decode positions:
//   attn_output_rel_err  ||o_method - o_exact|| / ||o_exact||            (every method)
//   key_rel_err, value_rel_err   relative error of the kept keys/values (stores with probe_view)
//   attn_prob_tv         total variation between the exact attention distribution and the method's
//                        (evicted tokens have probability 0)                (stores with probe_view)

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/model/model.h"
#include "harness/store/results_db.h"

namespace kvb {

struct ProbeOptions {
  int64_t prefill_tokens = 1;
  int64_t every = 16;  // probe every `every`-th decode position
};

struct ProbeSampleResult {
  // Per layer: sums and counts over probed positions (so samples aggregate exactly).
  std::vector<double> out_err, key_err, value_err, prob_tv;
  std::vector<int64_t> out_n, kv_n;
  nlohmann::json to_json() const;
  static ProbeSampleResult from_json(const nlohmann::json& j);
};

ProbeSampleResult run_probe_sample(std::shared_ptr<Model> model, const std::string& method,
                                   const nlohmann::json& method_params,
                                   const std::vector<int64_t>& tokens, const ProbeOptions& opts);

// Per-layer metrics (Metric::layer set) and their means over layers.
std::vector<Metric> probe_metrics(const std::vector<ProbeSampleResult>& samples);

}  // namespace kvb
