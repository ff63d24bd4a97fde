#pragma once
// Serving request traces in the Mooncake FAST'25 format (kvcache-ai/Mooncake
// FAST25-release/traces): JSONL, one request a line, {"timestamp": ms, "input_length": tokens,
// "output_length": tokens, "hash_ids": [ids of the prompt's blocks]}. Block ids chain with their
// prefix: two requests with the same id at position k share the whole prompt prefix up to and
// including block k. Also a seeded synthetic generator in the same shape, for serve-protocol tests
// and for sweeping the arrival rate.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/formats/jsonl.h"

namespace kvb {

struct TraceRequest {
  int64_t timestamp_ms = 0;   // arrival, ms since the start of the trace
  int64_t input_length = 0;   // prompt tokens
  int64_t output_length = 0;  // generated tokens
  std::vector<int64_t>
      hash_ids;     // [ceil(input_length / block_size_tokens)] prefix-chained block ids
  size_t line = 0;  // 1-based line in the file (0 for generated requests)
};

struct RequestTrace {
  std::vector<TraceRequest> requests;
  int64_t block_size_tokens = 512;  // tokens per hash_ids block (Mooncake: 512)
  JsonlStats stats;                 // only for traces read from a file
};

struct TraceReadOptions {
  bool skip_bad_lines = false;
  // hash_ids must have ceil(input_length / block_size_tokens) entries; 0 turns the check off.
  int64_t block_size_tokens = 512;
  // Arrival timestamps must not decrease (a replay would otherwise reorder requests silently).
  bool require_sorted = true;
};

// Reads a Mooncake-format trace. Required fields: timestamp (integer >= 0), input_length (integer
// >= 1), output_length (integer >= 0), hash_ids (array of integers >= 0). Other fields are ignored.
// Errors throw kvb::Error "FILE:LINE: field 'x': ..." unless options.skip_bad_lines.
RequestTrace read_request_trace(const std::string& path, const TraceReadOptions& options = {});

// Writes one request a line in the same format (integers only, fields in the order above).
void write_request_trace(const std::string& path, const RequestTrace& trace);

// A lognormal length: round(median * exp(sigma * z)), z standard normal, clamped to [min, max].
struct LengthDistribution {
  double median = 1024;  // > 0; the median before clamping
  double sigma = 1.0;    // >= 0; log-space standard deviation (0 gives the median every time)
  int64_t min = 1;
  int64_t max = 32768;
};

struct SyntheticTraceConfig {
  uint64_t seed = 0;
  size_t num_requests = 1000;
  double rate_per_s = 1.0;  // Poisson arrivals: exponential gaps with this rate
  LengthDistribution input{2048, 1.0, 16, 32768};
  LengthDistribution output{256, 0.8, 1, 4096};
  int64_t block_size_tokens = 512;
  // Shared prefixes: num_prefix_groups groups (0 = none), each with its own prefix of prefix_blocks
  // blocks (a system prompt or a shared document). A request joins a group with probability
  // group_fraction, picked uniformly among the groups.
  size_t num_prefix_groups = 0;
  int64_t prefix_blocks = 4;
  double group_fraction = 0.5;
};

// Deterministic under config.seed (identical output for identical configs on any standard library;
// see portable_random.h for the caveat on libm). Per request, in this order, from one
// std::mt19937_64(seed):
//   1. arrival: request 0 at t = 0; request i > 0 at t_{i-1} + exponential(rate_per_s) seconds;
//      timestamp_ms = llround(1000 t);
//   2. input_length, 3. output_length: LengthDistribution draws (one standard_normal each);
//   4. when num_prefix_groups > 0: u = uniform_unit, g = uniform_index(num_prefix_groups), both
//   always
//      drawn; the request is in group g when u < group_fraction.
// hash_ids: group g's prefix blocks have ids g * prefix_blocks + k; a group request starts with
// min(prefix_blocks, input_length / block_size_tokens) of them (only full blocks can be shared);
// every other block gets a fresh id, counting up from num_prefix_groups * prefix_blocks.
// Invalid parameters throw kvb::Error naming the field.
RequestTrace generate_synthetic_trace(const SyntheticTraceConfig& config);

}  // namespace kvb
