// kvtuner on stories260K: uniform pairs reproduce kivi / pertoken bit for bit, each layer
// physically stores its own pair (bytes per layer = the codec's closed form for that layer's bits),
// a JSON precision file equals the inline pairs, and malformed configs are errors that name the
// problem.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const std::string& name, nlohmann::json params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device, test::stories260k()->dtype};
  return MethodRegistry::instance().create(name, ctx, params);
}

std::vector<int64_t> prompt(int64_t n) {
  std::vector<int64_t> p = {1};
  for (int64_t i = 1; i < n; ++i) p.push_back(3 + (i * 41) % 500);
  return p;
}

at::Tensor trace(std::unique_ptr<KvCache> kv) {
  Engine e(test::stories260k(), std::move(kv));
  int64_t s = e.new_sequence();
  std::vector<at::Tensor> rows;
  rows.push_back(e.prefill({s}, {prompt(50)}).clone());
  for (int i = 0; i < 60; ++i) rows.push_back(e.decode({s}, {3 + (i * 31) % 500}).clone());
  return at::cat(rows);
}

TEST(KvTuner, UniformPairsAreKiviAndPerTokenExactly) {
  EXPECT_TRUE(at::equal(trace(make("kvtuner", {{"pairs", "KV2"}})),
                        trace(make("kivi", {{"residual_length", 32}}))));
  EXPECT_TRUE(at::equal(trace(make("kvtuner", {{"pairs", "K4V8"}, {"mode", "per_token"}})),
                        trace(make("pertoken", {{"k_bits", 4}, {"v_bits", 8}}))));
}

TEST(KvTuner, EachLayerStoresItsOwnPair) {
  const auto& c = test::stories260k()->config;
  ASSERT_EQ(c.n_layers, 5);
  Engine e(test::stories260k(), make("kvtuner", {{"pairs", "KV8, K8V4, KV4, K4V2, KV2"}}));
  int64_t s = e.new_sequence();
  e.prefill({s}, {prompt(100)});
  auto& kv = dynamic_cast<CodecKvCache&>(e.kv());
  const int kb[] = {8, 8, 4, 4, 2}, vb[] = {8, 4, 4, 2, 2};
  const auto& codec = dynamic_cast<const QuantCodec&>(kv.codec());
  for (int l = 0; l < 5; ++l) {
    EXPECT_EQ(codec.spec(KvKind::kKey, l).bits, kb[l]);
    EXPECT_EQ(codec.spec(KvKind::kValue, l).bits, vb[l]);
    for (KvKind k : {KvKind::kKey, KvKind::kValue}) {
      const CodecBytes got = kv.stream(s, l, k).bytes();
      const CodecBytes want = kv.codec().expected_bytes(k, l, c.kv_dim(), 100);
      EXPECT_EQ(got.code_bytes, want.code_bytes) << l;
      EXPECT_EQ(got.metadata_bytes, want.metadata_bytes) << l;
      EXPECT_EQ(got.full_bytes, want.full_bytes) << l;
      EXPECT_DOUBLE_EQ(got.encoded_bits_per_element(), kv.codec().declared_bits(k, l)) << l;
    }
  }
  // 96 keys quantized per layer: 8-bit keys take four times the code bytes of 2-bit keys.
  EXPECT_EQ(kv.stream(s, 0, KvKind::kKey).bytes().code_bytes,
            4 * kv.stream(s, 4, KvKind::kKey).bytes().code_bytes);
  auto ctr = kv.counters();
  EXPECT_DOUBLE_EQ(ctr["equivalent_bits"], (8 + 6 + 4 + 3 + 2) / 5.0);
  EXPECT_EQ(ctr["layer3_k_bits"], 4);
  EXPECT_EQ(ctr["layer3_v_bits"], 2);
}

TEST(KvTuner, JsonPrecisionFileEqualsInlinePairs) {
  const std::string dir = test::make_temp_dir("kvtuner");
  const std::string obj = dir + "/obj.json", arr = dir + "/arr.json";
  std::ofstream(obj)
      << R"({"0": {"nbits_key": 8, "nbits_value": 4}, "1": {"nbits_key": 4, "nbits_value": 4},
    "2": {"nbits_key": 4, "nbits_value": 2}, "3": {"nbits_key": 2, "nbits_value": 2},
    "4": {"nbits_key": 8, "nbits_value": 8}})";
  std::ofstream(arr) << "[[8, 4], [4, 4], [4, 2], [2, 2], [8, 8]]";
  at::Tensor inline_pairs = trace(make("kvtuner", {{"pairs", "K8V4,KV4,K4V2,KV2,KV8"}}));
  EXPECT_TRUE(at::equal(trace(make("kvtuner", {{"config", obj}})), inline_pairs));
  EXPECT_TRUE(at::equal(trace(make("kvtuner", {{"config", arr}})), inline_pairs));
  Engine e(test::stories260k(), make("kvtuner", {{"config", obj}}));
  EXPECT_GT(dynamic_cast<CodecKvCache&>(e.kv()).counters()["config_sha256_48"], 0);
}

TEST(KvTuner, MalformedConfigsNameTheProblem) {
  const std::string dir = test::make_temp_dir("kvtuner_bad");
  auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  auto expect_error = [](nlohmann::json p, const std::string& what) {
    try {
      make("kvtuner", p);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error({{"pairs", "KV4,KV4"}}, "2 pairs for a model of 5 layers");
  expect_error({{"pairs", "KV5"}}, "5 bits not supported");
  expect_error({{"pairs", "K8"}}, "'K8' is not a pair");
  expect_error({{"pairs", "KV4"}, {"residual_length", 40}}, "not a multiple of group_size 32");
  expect_error({{"config", dir + "/missing.json"}}, "file not found");
  expect_error({{"config", file("a.json", "{\"0\": {\"nbits_key\": 8, \"nbits_value\": 4}}")}},
               "layer 1 is missing");
  expect_error({{"config", file("b.json", "{\"7\": {\"nbits_key\": 8, \"nbits_value\": 4}}")}},
               "key '7' is not a layer index");
  expect_error({{"config", file("c.json", "[[8, 4], [4, 6], [4, 4], [4, 4], [4, 4]]")}},
               "layer 1 value = 6 is not a supported width");
  expect_error({{"config", file("d.json", "{not json")}}, "not valid JSON");
}

}  // namespace
}  // namespace kvb
