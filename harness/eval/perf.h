#pragma once
// The `perf` protocol: prefill and decode throughput of a method at given batch sizes and context
// length, with warm-up, repeats, medians and spread (time to first token, time per output token).

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/eval/ledger.h"
#include "harness/model/model.h"

namespace kvb {

struct PerfCell {
  int64_t batch = 1, context = 0, decode_tokens = 0, repeats = 0;
  double prefill_tok_s = 0, decode_tok_s = 0, ttft_ms = 0;
  double tpot_ms_p50 = 0, tpot_ms_p10 = 0, tpot_ms_p90 = 0;
  double decode_tok_s_min = 0, decode_tok_s_max = 0;
  LedgerEntry ledger;  // after the last decode step of the last repeat
  nlohmann::json to_json() const;
  static PerfCell from_json(const nlohmann::json& j);
};

PerfCell run_perf_cell(std::shared_ptr<Model> model, const std::string& method,
                       const nlohmann::json& method_params, int64_t batch, int64_t context,
                       int64_t decode_tokens, int64_t repeats, int64_t prefill_chunk, uint64_t seed);

// Metrics: the first cell's figures unsuffixed (decode_tok_s, ...), every cell's with "_b<batch>".
std::vector<Metric> perf_metrics(const std::vector<PerfCell>& cells, bool declared_simulated);

}  // namespace kvb
