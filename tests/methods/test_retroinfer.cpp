// retroinfer: the wave index partitions its span into clusters whose centroids and value sums are
// the members' mean key and value sum, inside segments; on the real stories260K the tripartite
// attention is exact when every cluster is retrieved, the estimation zone recovers mass a tight
// retrieval budget drops, the ledger puts the clustered rows on the host, forks continue alike, and
// bad parameters / truncation into the index are refused by name.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "methods/retroinfer/wave_index.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const nlohmann::json& params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device,
                   test::stories260k()->dtype};
  return MethodRegistry::instance().create("retroinfer", ctx, params);
}

// KL to the full cache over 2 windows of 256, the first 160 tokens prefilled (and clustered), the
// decoded tokens indexed 32 at a time once they pass the 16-token tail.
double mean_kl(nlohmann::json params, std::map<std::string, double>* counters = nullptr) {
  params["steady_recent"] = 16;
  params["reindex_every"] = 32;
  return test::mean_story_kl("retroinfer", params, 2, 160, counters);
}

TEST(WaveIndex, ClustersPartitionTheSpanWithinSegmentsAndHoldMeansAndSums) {
  const int64_t D = 8, stride = 16, n = 300;  // two heads interleaved: head 1 at offset 8
  at::Tensor k = at::randn({n, stride}, at::detail::createCPUGenerator(3));
  at::Tensor v = at::randn({n, stride}, at::detail::createCPUGenerator(4));
  retroinfer::ClusterOptions o;
  o.cluster_size = 16;
  o.segment = 128;
  auto cl = retroinfer::build_clusters(k.data_ptr<float>() + 8, v.data_ptr<float>() + 8, stride, D,
                                       20, 280, o);
  std::set<int32_t> seen;
  size_t clusters_max = 0;
  for (int64_t s0 = 20; s0 < 280; s0 += 128)
    clusters_max += (std::min<int64_t>(280, s0 + 128) - s0 + 15) / 16;
  EXPECT_LE(cl.size(), clusters_max);
  EXPECT_GE(cl.size(), clusters_max / 2);
  for (const auto& c : cl) {
    ASSERT_FALSE(c.members.empty());
    // Inside one segment: [20, 148), [148, 276), [276, 280).
    EXPECT_EQ((c.members.front() - 20) / 128, (c.members.back() - 20) / 128);
    std::vector<double> mean(D, 0), sum(D, 0);
    for (int32_t t : c.members) {
      EXPECT_TRUE(seen.insert(t).second) << "token " << t << " in two clusters";
      for (int64_t d = 0; d < D; ++d) {
        mean[d] += k[t][8 + d].item<float>() / c.members.size();
        sum[d] += v[t][8 + d].item<float>();
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_NEAR(c.centroid[d], mean[d], 1e-4);
      EXPECT_NEAR(c.value_sum[d], sum[d], 1e-4);
    }
  }
  EXPECT_EQ(seen.size(), 260u);
  EXPECT_EQ(*seen.begin(), 20);
  EXPECT_EQ(*seen.rbegin(), 279);
}

TEST(Retroinfer, EveryClusterRetrievedIsExactAttention) {
  std::map<std::string, double> c;
  // fp32 rounding alone: 1.1e-8 on an AMD EPYC; a missing cluster costs orders of magnitude more.
  EXPECT_LT(mean_kl({{"retrieval_ratio", 1.0}, {"estimation_ratio", 0.0}}, &c), 1e-7);
  EXPECT_NEAR(c.at("attention_mass_recall"), 1.0, 1e-6);
  EXPECT_GT(c.at("clusters"), 0);
}

TEST(Retroinfer, EstimationZoneRecoversWhatATightRetrievalBudgetDrops) {
  std::map<std::string, double> c0, c1;
  const double without = mean_kl({{"retrieval_ratio", 0.1}, {"estimation_ratio", 0.0}}, &c0);
  const double with = mean_kl({{"retrieval_ratio", 0.1}, {"estimation_ratio", 0.4}}, &c1);
  std::cerr << "KL without estimation " << without << ", with " << with << ", recall "
            << c0.at("attention_mass_recall") << "\n";
  EXPECT_LT(with, 0.9 * without);  // measured: 0.0091 vs 0.0114
  EXPECT_GT(without, 1e-4);        // the tight budget does lose something
  EXPECT_LT(c0.at("attention_mass_recall"), 1.0);
  EXPECT_GT(c0.at("attention_mass_recall"), 0.3);
  EXPECT_EQ(c0.at("estimated_clusters_per_read"), 0);
  EXPECT_GT(c1.at("estimated_clusters_per_read"), 0);
  // Retrieved clusters come through the LRU device cache: some hits, some misses.
  EXPECT_GT(c1.at("cache_hit_rate"), 0.0);
  EXPECT_LT(c1.at("cache_hit_rate"), 1.0);
  EXPECT_GT(c1.at("host_to_device_bytes_per_step"), 0.0);
}

TEST(Retroinfer, LedgerPutsTheClusteredRowsOnTheHost) {
  auto m = test::stories260k();
  const auto& cfg = m->config;
  Engine e(m, make({{"sinks", 4}, {"steady_recent", 16}, {"retrieval_ratio", 0.1}}));
  const int64_t a = e.new_sequence();
  std::vector<int64_t> p = {1};
  for (int i = 1; i < 200; ++i) p.push_back(3 + (i * 37) % 500);
  e.prefill({a}, {p});
  for (int i = 0; i < 5; ++i) e.decode({a}, {300 + i});
  const Footprint f = e.kv().footprint();
  const int64_t row = cfg.head_dim * 4, indexed = 200 - 4 - 16;
  EXPECT_EQ(f.host_bytes, cfg.n_layers * cfg.n_kv_heads * indexed * (2 * row + 4));
  const int64_t steady = 205 - indexed;
  EXPECT_GE(f.device_payload_bytes, cfg.n_layers * cfg.n_kv_heads * 2 * steady * row);
  EXPECT_GT(f.device_metadata_bytes, 0);
  EXPECT_EQ(f.tokens_held, 205);
  // Per cluster on the device: centroid and value sum (fp32 rows) and the size.
  EXPECT_EQ(f.device_metadata_bytes,
            static_cast<int64_t>(e.kv().counters().at("clusters")) * (2 * row + 4));
  EXPECT_LT(f.physical_bytes() - f.host_bytes, f.logical_bytes);  // the device holds less
}

TEST(Retroinfer, ForkedBranchesContinueAlikeAndTruncationStaysInTheTail) {
  auto m = test::stories260k();
  Engine e(m, make({{"steady_recent", 16}, {"retrieval_ratio", 0.1}}));
  const int64_t a = e.new_sequence();
  std::vector<int64_t> p = {1};
  for (int i = 1; i < 120; ++i) p.push_back(3 + (i * 29) % 500);
  e.prefill({a}, {p});
  const int64_t f = e.fork(a);
  for (int i = 0; i < 4; ++i) {
    at::Tensor x = e.decode({a}, {310 + i}), y = e.decode({f}, {310 + i});
    EXPECT_TRUE(at::equal(x, y)) << i;
  }
  e.kv().truncate(f, 110);  // inside the tail [104, 124)
  EXPECT_EQ(e.kv().seq_len(f), 110);
  try {
    e.kv().truncate(a, 50);
    ADD_FAILURE() << "truncated into the index";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("clustered"), std::string::npos) << err.what();
  }
}

TEST(Retroinfer, RefusesBadParametersNamingThem) {
  auto expect_error = [&](const nlohmann::json& p, const std::string& want) {
    try {
      make(p);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error({{"retrieval_ratio", 0.9}, {"estimation_ratio", 0.2}}, "estimation_ratio");
  expect_error({{"gqa_agg", "sum"}}, "gqa_agg");
  expect_error({{"cluster_size", 0}}, "cluster_size");
}

}  // namespace
}  // namespace kvb
