// Mooncake trace reader (on the real traces and on broken fixtures) and the synthetic generator.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "harness/common/mapped_file.h"
#include "harness/formats/request_trace.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

using test::expect_error;
using test::make_scratch_dir;
using test::write_file;

std::string trace_path(const std::string& name) {
  return test::data_dir() + "/mooncake-traces/" + name;
}

std::vector<int64_t> iota_ids(int64_t first, int64_t count) {
  std::vector<int64_t> ids(static_cast<size_t>(count));
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

double mean_of(const std::vector<TraceRequest>& rs, int64_t TraceRequest::*field) {
  double s = 0;
  for (const auto& r : rs) s += static_cast<double>(r.*field);
  return s / static_cast<double>(rs.size());
}

// Values from the files themselves (head -1 / tail -1) and from their README's table.
TEST(RequestTraceMooncake, ConversationTrace) {
  std::string path = trace_path("conversation_trace.jsonl");
  if (!file_exists(path)) GTEST_SKIP() << "no trace at " << path;
  RequestTrace t = read_request_trace(path);
  ASSERT_EQ(t.requests.size(), 12031u);
  EXPECT_EQ(t.stats.lines, 12031u);
  const TraceRequest& first = t.requests.front();
  EXPECT_EQ(first.timestamp_ms, 0);
  EXPECT_EQ(first.input_length, 6758);
  EXPECT_EQ(first.output_length, 500);
  EXPECT_EQ(first.hash_ids, iota_ids(0, 14));
  EXPECT_EQ(first.line, 1u);
  const TraceRequest& last = t.requests.back();
  EXPECT_EQ(last.timestamp_ms, 3536999);
  EXPECT_EQ(last.input_length, 20774);
  EXPECT_EQ(last.output_length, 508);
  ASSERT_EQ(last.hash_ids.size(), 41u);
  EXPECT_EQ(last.hash_ids[0], 0);
  EXPECT_EQ(last.hash_ids[1], 182750);
  EXPECT_EQ(last.hash_ids[40], 182789);
  EXPECT_NEAR(mean_of(t.requests, &TraceRequest::input_length), 12035.06, 0.01);  // README: 12,035
  EXPECT_NEAR(mean_of(t.requests, &TraceRequest::output_length), 342.62, 0.01);   // README: 343
}

TEST(RequestTraceMooncake, SyntheticTrace) {
  std::string path = trace_path("synthetic_trace.jsonl");
  if (!file_exists(path)) GTEST_SKIP() << "no trace at " << path;
  RequestTrace t = read_request_trace(path);
  ASSERT_EQ(t.requests.size(), 3993u);
  const TraceRequest& first = t.requests.front();
  EXPECT_EQ(first.timestamp_ms, 0);
  EXPECT_EQ(first.input_length, 40160);
  EXPECT_EQ(first.output_length, 6);
  EXPECT_EQ(first.hash_ids, iota_ids(0, 79));
  const TraceRequest& last = t.requests.back();
  EXPECT_EQ(last.timestamp_ms, 1022025);
  EXPECT_EQ(last.input_length, 18440);
  EXPECT_EQ(last.output_length, 83);
  ASSERT_EQ(last.hash_ids.size(), 37u);
  EXPECT_EQ(last.hash_ids.front(), 17915);
  EXPECT_EQ(last.hash_ids.back(), 43923);
  EXPECT_NEAR(mean_of(t.requests, &TraceRequest::input_length), 15325.48, 0.01);  // README: 15,325
  EXPECT_NEAR(mean_of(t.requests, &TraceRequest::output_length), 149.12, 0.01);   // README: 149
}

TEST(RequestTraceReader, StrictErrors) {
  std::string dir = make_scratch_dir("trace");
  const std::string good =
      R"({"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]})";
  struct Case {
    std::string line;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {R"({"timestamp": 6, "input_length": 600, "output_length": 2})",
       {"missing field 'hash_ids'"}},
      {R"({"timestamp": 6, "input_length": 600, "output_length": 2, "hash_ids": [0, "1"]})",
       {"field 'hash_ids'", "element 1"}},
      {R"({"timestamp": 6, "input_length": 600, "output_length": 2, "hash_ids": [0, -1]})",
       {"field 'hash_ids'", "element 1"}},
      {R"({"timestamp": 6, "input_length": 600, "output_length": 2, "hash_ids": [0]})",
       {"field 'hash_ids'", "1 blocks", "needs 2"}},
      {R"({"timestamp": 4, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]})",
       {"field 'timestamp'", "earlier"}},
      {R"({"timestamp": 6.5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]})",
       {"field 'timestamp'", "integer"}},
      {R"({"timestamp": 6, "input_length": 0, "output_length": 2, "hash_ids": []})",
       {"field 'input_length'"}},
      {R"({"timestamp": 6, "input_length": 600, "output_length": -2, "hash_ids": [0, 1]})",
       {"field 'output_length'"}},
      {R"({"timestamp": 6, "input_length": 600, "output_length": 2, "hash_ids": [0, 1])",
       {"not valid JSON"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string path =
        write_file(dir, "bad" + std::to_string(i) + ".jsonl", good + "\n\n" + cases[i].line + "\n");
    std::vector<std::string> parts = cases[i].expect;
    parts.push_back(path + ":3: ");
    try {
      read_request_trace(path);
      ADD_FAILURE() << "case " << i << " did not throw";
    } catch (const Error& e) {
      std::string msg = e.what();
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " / " << p;
    }
  }
  // The block check and the order check can be turned off.
  std::string path = write_file(
      dir, "loose.jsonl",
      good + "\n" +
          R"({"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [7]})");
  TraceReadOptions loose;
  loose.block_size_tokens = 0;
  loose.require_sorted = false;
  EXPECT_EQ(read_request_trace(path, loose).requests.size(), 2u);
  TraceReadOptions skip;
  skip.skip_bad_lines = true;
  RequestTrace t = read_request_trace(path, skip);
  EXPECT_EQ(t.requests.size(), 1u);
  EXPECT_EQ(t.stats.bad_lines, 1u);
}

TEST(RequestTraceGenerator, DeterministicUnderSeed) {
  SyntheticTraceConfig c;
  c.seed = 11;
  c.num_requests = 300;
  c.num_prefix_groups = 3;
  RequestTrace a = generate_synthetic_trace(c);
  RequestTrace b = generate_synthetic_trace(c);
  ASSERT_EQ(a.requests.size(), 300u);
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].timestamp_ms, b.requests[i].timestamp_ms);
    EXPECT_EQ(a.requests[i].input_length, b.requests[i].input_length);
    EXPECT_EQ(a.requests[i].output_length, b.requests[i].output_length);
    EXPECT_EQ(a.requests[i].hash_ids, b.requests[i].hash_ids);
  }
  c.seed = 12;
  RequestTrace other = generate_synthetic_trace(c);
  size_t same_lengths = 0;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    same_lengths += a.requests[i].input_length == other.requests[i].input_length;
  }
  EXPECT_LT(same_lengths, 30u);
}

TEST(RequestTraceGenerator, StatisticsFollowParameters) {
  SyntheticTraceConfig c;
  c.seed = 5;
  c.num_requests = 20000;
  c.rate_per_s = 5.0;
  c.input = {2048, 1.0, 1, int64_t{1} << 40};  // clamps out of the way to check the lognormal
  c.output = {256, 0.5, 1, 4096};
  c.num_prefix_groups = 4;
  c.prefix_blocks = 3;
  c.group_fraction = 0.3;
  RequestTrace t = generate_synthetic_trace(c);
  const auto& rs = t.requests;
  ASSERT_EQ(rs.size(), 20000u);
  EXPECT_EQ(rs.front().timestamp_ms, 0);
  // Mean gap of a Poisson process with rate 5/s: 200 ms (standard error ~1.4 ms).
  EXPECT_NEAR(static_cast<double>(rs.back().timestamp_ms) / (rs.size() - 1), 200.0, 6.0);
  std::vector<double> in, out, log_in;
  for (const auto& r : rs) {
    in.push_back(static_cast<double>(r.input_length));
    out.push_back(static_cast<double>(r.output_length));
    log_in.push_back(std::log(static_cast<double>(r.input_length)));
    EXPECT_GE(r.output_length, 1);
    EXPECT_LE(r.output_length, 4096);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  EXPECT_NEAR(median(in), 2048, 2048 * 0.04);
  EXPECT_NEAR(median(out), 256, 256 * 0.04);
  double m = std::accumulate(log_in.begin(), log_in.end(), 0.0) / log_in.size();
  double ss = 0;
  for (double x : log_in) ss += (x - m) * (x - m);
  EXPECT_NEAR(std::sqrt(ss / (log_in.size() - 1)), 1.0, 0.03);

  // Prefix groups: ids 0..11 are the 4 groups' prefixes; a request's blocks match its input length;
  // every id outside the prefixes is used exactly once.
  size_t grouped = 0;
  size_t shareable = 0;  // requests with at least one full block: only those can show their group
  std::set<int64_t> unique_ids;
  for (const auto& r : rs) {
    ASSERT_EQ(static_cast<int64_t>(r.hash_ids.size()), (r.input_length + 511) / 512);
    int64_t full_blocks = r.input_length / 512;
    shareable += full_blocks > 0;
    bool in_group = !r.hash_ids.empty() && r.hash_ids[0] < 12;
    if (in_group) {
      ++grouped;
      int64_t g = r.hash_ids[0] / 3;
      EXPECT_EQ(r.hash_ids[0], 3 * g);
      int64_t shared = std::min<int64_t>(3, full_blocks);
      for (int64_t k = 0; k < shared; ++k) EXPECT_EQ(r.hash_ids[k], 3 * g + k);
      for (size_t k = shared; k < r.hash_ids.size(); ++k) {
        EXPECT_TRUE(unique_ids.insert(r.hash_ids[k]).second);
      }
    } else {
      for (int64_t id : r.hash_ids) EXPECT_TRUE(unique_ids.insert(id).second) << id;
    }
  }
  for (int64_t id : unique_ids) ASSERT_GE(id, 12);
  EXPECT_NEAR(static_cast<double>(grouped) / shareable, 0.3, 0.015);  // standard error ~0.003
}

TEST(RequestTraceGenerator, ClampsAndRoundTripsThroughFile) {
  SyntheticTraceConfig c;
  c.seed = 3;
  c.num_requests = 500;
  c.input = {1000, 2.0, 100, 3000};
  c.num_prefix_groups = 2;
  RequestTrace t = generate_synthetic_trace(c);
  for (const auto& r : t.requests) {
    EXPECT_GE(r.input_length, 100);
    EXPECT_LE(r.input_length, 3000);
  }
  std::string dir = make_scratch_dir("trace");
  std::string path = dir + "/gen.jsonl";
  write_request_trace(path, t);
  RequestTrace back = read_request_trace(path);
  ASSERT_EQ(back.requests.size(), t.requests.size());
  for (size_t i = 0; i < t.requests.size(); ++i) {
    EXPECT_EQ(back.requests[i].timestamp_ms, t.requests[i].timestamp_ms);
    EXPECT_EQ(back.requests[i].input_length, t.requests[i].input_length);
    EXPECT_EQ(back.requests[i].output_length, t.requests[i].output_length);
    EXPECT_EQ(back.requests[i].hash_ids, t.requests[i].hash_ids);
  }
}

TEST(RequestTraceGenerator, RejectsBadParameters) {
  SyntheticTraceConfig c;
  c.rate_per_s = 0;
  expect_error([&] { generate_synthetic_trace(c); }, {"rate_per_s"});
  c = {};
  c.input.median = -1;
  expect_error([&] { generate_synthetic_trace(c); }, {"input.median"});
  c = {};
  c.output.min = 10;
  c.output.max = 5;
  expect_error([&] { generate_synthetic_trace(c); }, {"output.min"});
  c = {};
  c.group_fraction = 1.5;
  expect_error([&] { generate_synthetic_trace(c); }, {"group_fraction"});
  c = {};
  c.block_size_tokens = 0;
  expect_error([&] { generate_synthetic_trace(c); }, {"block_size_tokens"});
}

}  // namespace
}  // namespace kvb
