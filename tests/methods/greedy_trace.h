#pragma once
// The method tests' standard run: a 40-token prompt (BOS, then a fixed spread of token ids)
// prefilled in chunks of `chunk`, then 10 greedy decode steps; every logit row, in order.

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/engine/engine.h"

namespace kvb::test {

// counters: when given, the store's counters after the last step.
inline at::Tensor greedy_trace(std::shared_ptr<Model> m, std::unique_ptr<KvCache> kv,
                               int64_t chunk = 7,
                               std::map<std::string, double>* counters = nullptr) {
  EngineOptions o;
  o.prefill_chunk = chunk;
  Engine e(std::move(m), std::move(kv), o);
  std::vector<int64_t> prompt = {1};
  for (int i = 0; i < 39; ++i) prompt.push_back(260 + (i * 13) % 250);
  const int64_t s = e.new_sequence();
  std::vector<at::Tensor> rows;
  e.prefill({s}, {prompt}, [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
  int64_t tok = rows.back()[rows.back().size(0) - 1].argmax().item<int64_t>();
  for (int i = 0; i < 10; ++i) {
    at::Tensor l = e.decode({s}, {tok});
    rows.push_back(l.clone());
    tok = l[0].argmax().item<int64_t>();
  }
  if (counters) *counters = e.kv().counters();
  return at::cat(rows);
}

}  // namespace kvb::test
