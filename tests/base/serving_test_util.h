#pragma once
// A toy serving target and machine with round numbers, so that the simulation's expected times can
// be worked out on paper, and small traces built request by request (test_serving_sim.cpp,
// test_serving_codesign.cpp).

#include <cstdint>
#include <utility>
#include <vector>

#include "harness/serve/serving_sim.h"

namespace kvb::servetest {

inline ServeTarget toy_target() {
  ServeTarget t;
  t.name = "toy";
  t.weight_bytes = 1e9;
  t.flops_per_token = 2e9;
  t.attn_flops_per_pair = 1e6;
  t.kv_bytes_per_token = 1000;
  t.max_context = 100000;
  return t;
}

inline ServeHardware toy_hardware() {
  ServeHardware h;
  h.hbm_gbps = 1000;  // 1e12 B/s
  h.tflops = 100;     // 1e14 FLOP/s
  h.prefix_load_gbps = 1;
  h.iteration_overhead_ms = 0.5;
  return h;
}

inline TraceRequest request(int64_t ts, int64_t input, int64_t output, std::vector<int64_t> ids) {
  TraceRequest r;
  r.timestamp_ms = ts;
  r.input_length = input;
  r.output_length = output;
  r.hash_ids = std::move(ids);
  return r;
}

inline RequestTrace trace_of(std::vector<TraceRequest> rs, int64_t block = 512) {
  RequestTrace t;
  t.requests = std::move(rs);
  t.block_size_tokens = block;
  return t;
}

// Distinct ids for request i's blocks (no sharing).
inline std::vector<int64_t> own_ids(int64_t i, int64_t input, int64_t block = 512) {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < (input + block - 1) / block; ++b) ids.push_back(1000 * (i + 1) + b);
  return ids;
}

}  // namespace kvb::servetest
