#include "harness/formats/request_trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "harness/common/error.h"
#include "harness/metrics/portable_random.h"

namespace kvb {

namespace {

int64_t blocks_for(int64_t tokens, int64_t block) { return (tokens + block - 1) / block; }

std::vector<int64_t> int_array(const nlohmann::json& object, std::string_view field) {
  const nlohmann::json& v = json_require(object, field);
  KVB_CHECK(v.is_array(), "field '", field, "': expected an array of integers, got ",
            v.type_name());
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& e = v[i];
    bool ok = e.is_number_unsigned()
                  ? e.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                  : e.is_number_integer() && e.get<int64_t>() >= 0;
    KVB_CHECK(ok, "field '", field, "': element ", i, " is not an integer >= 0 (", e.dump(), ")");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

int64_t draw_length(std::mt19937_64& rng, const LengthDistribution& d) {
  double x = d.median * std::exp(d.sigma * standard_normal(rng));
  // Clamp in floating point first so that llround cannot overflow on an extreme draw.
  x = std::min(std::max(x, static_cast<double>(d.min)), static_cast<double>(d.max));
  return std::llround(x);
}

void check_distribution(const LengthDistribution& d, const char* name) {
  KVB_CHECK(std::isfinite(d.median) && d.median > 0, "synthetic trace: ", name, ".median ",
            d.median, " must be > 0");
  KVB_CHECK(std::isfinite(d.sigma) && d.sigma >= 0, "synthetic trace: ", name, ".sigma ", d.sigma,
            " must be >= 0");
  KVB_CHECK(d.min <= d.max, "synthetic trace: ", name, ".min ", d.min, " > ", name, ".max ", d.max);
}

}  // namespace

RequestTrace read_request_trace(const std::string& path, const TraceReadOptions& options) {
  KVB_CHECK(options.block_size_tokens >= 0, "trace block size ", options.block_size_tokens,
            " must be >= 0");
  RequestTrace trace;
  trace.block_size_tokens = options.block_size_tokens;
  int64_t last_timestamp = 0;
  JsonlOptions jsonl;
  jsonl.skip_bad_lines = options.skip_bad_lines;
  trace.stats = read_jsonl(path, jsonl, [&](const nlohmann::json& row, size_t line) {
    TraceRequest r;
    r.line = line;
    r.timestamp_ms = json_int(row, "timestamp", 0);
    r.input_length = json_int(row, "input_length", 1);
    r.output_length = json_int(row, "output_length", 0);
    r.hash_ids = int_array(row, "hash_ids");
    if (options.block_size_tokens > 0) {
      int64_t want = blocks_for(r.input_length, options.block_size_tokens);
      KVB_CHECK(static_cast<int64_t>(r.hash_ids.size()) == want,
                "field 'hash_ids': ", r.hash_ids.size(), " blocks, but input_length ",
                r.input_length, " needs ", want, " blocks of ", options.block_size_tokens,
                " tokens");
    }
    KVB_CHECK(!options.require_sorted || r.timestamp_ms >= last_timestamp,
              "field 'timestamp': ", r.timestamp_ms, " is earlier than the previous request's ",
              last_timestamp, " (traces must be sorted by arrival)");
    last_timestamp = r.timestamp_ms;
    trace.requests.push_back(std::move(r));
  });
  return trace;
}

void write_request_trace(const std::string& path, const RequestTrace& trace) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KVB_CHECK(out.good(), path, ": cannot open for writing: ", std::strerror(errno));
  for (const TraceRequest& r : trace.requests) {
    out << "{\"timestamp\": " << r.timestamp_ms << ", \"input_length\": " << r.input_length
        << ", \"output_length\": " << r.output_length << ", \"hash_ids\": [";
    for (size_t i = 0; i < r.hash_ids.size(); ++i) out << (i ? ", " : "") << r.hash_ids[i];
    out << "]}\n";
  }
  out.flush();
  KVB_CHECK(out.good(), path, ": write failed: ", std::strerror(errno));
}

RequestTrace generate_synthetic_trace(const SyntheticTraceConfig& c) {
  KVB_CHECK(std::isfinite(c.rate_per_s) && c.rate_per_s > 0, "synthetic trace: rate_per_s ",
            c.rate_per_s, " must be > 0");
  check_distribution(c.input, "input");
  check_distribution(c.output, "output");
  KVB_CHECK(c.input.min >= 1, "synthetic trace: input.min ", c.input.min, " must be >= 1");
  KVB_CHECK(c.output.min >= 0, "synthetic trace: output.min ", c.output.min, " must be >= 0");
  KVB_CHECK(c.block_size_tokens >= 1, "synthetic trace: block_size_tokens ", c.block_size_tokens,
            " must be >= 1");
  KVB_CHECK(c.num_prefix_groups == 0 || c.prefix_blocks >= 1, "synthetic trace: prefix_blocks ",
            c.prefix_blocks, " must be >= 1 when num_prefix_groups > 0");
  KVB_CHECK(c.group_fraction >= 0 && c.group_fraction <= 1, "synthetic trace: group_fraction ",
            c.group_fraction, " must be in [0, 1]");

  RequestTrace trace;
  trace.block_size_tokens = c.block_size_tokens;
  trace.requests.reserve(c.num_requests);
  std::mt19937_64 rng(c.seed);
  const int64_t num_groups = static_cast<int64_t>(c.num_prefix_groups);
  int64_t next_id = num_groups * (num_groups > 0 ? c.prefix_blocks : 0);
  double t_s = 0.0;
  for (size_t i = 0; i < c.num_requests; ++i) {
    TraceRequest r;
    if (i > 0) t_s += exponential(rng, c.rate_per_s);
    r.timestamp_ms = std::llround(1000.0 * t_s);
    r.input_length = draw_length(rng, c.input);
    r.output_length = draw_length(rng, c.output);
    int64_t group = -1;
    if (num_groups > 0) {
      double u = uniform_unit(rng);
      int64_t g = static_cast<int64_t>(uniform_index(rng, c.num_prefix_groups));
      if (u < c.group_fraction) group = g;
    }
    const int64_t blocks = blocks_for(r.input_length, c.block_size_tokens);
    const int64_t shared =
        group < 0 ? 0 : std::min(c.prefix_blocks, r.input_length / c.block_size_tokens);
    r.hash_ids.reserve(static_cast<size_t>(blocks));
    for (int64_t k = 0; k < shared; ++k) r.hash_ids.push_back(group * c.prefix_blocks + k);
    for (int64_t k = shared; k < blocks; ++k) r.hash_ids.push_back(next_id++);
    trace.requests.push_back(std::move(r));
  }
  return trace;
}

}  // namespace kvb
