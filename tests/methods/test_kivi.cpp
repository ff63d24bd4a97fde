// kivi on the real stories260K: the ledger equals the codec's closed form and the declared bits,
// the channel group adapts to head_dim 8 and says so, fidelity falls monotonically with bits (8-bit
// close to full), only completed groups are ever quantized (encoded units never change as tokens
// arrive one by one), determinism, a residual covering everything equals the full cache, fork and
// truncate, and parameter errors.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::unique_ptr<KvCache> make(const std::string& name, nlohmann::json params) {
  CacheContext ctx{test::stories260k()->config, test::stories260k()->device,
                   test::stories260k()->dtype};
  return MethodRegistry::instance().create(name, ctx, params);
}

CodecKvCache& codec_cache(Engine& e) { return dynamic_cast<CodecKvCache&>(e.kv()); }

std::vector<int64_t> tiny_prompt(int64_t n, int64_t salt) {
  std::vector<int64_t> p = {1};
  for (int64_t i = 1; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 500);
  return p;
}

TEST(KiviLedger, FootprintEqualsTheCodecClosedFormAndDeclaredBits) {
  auto m = test::stories260k();
  const auto& c = m->config;
  ASSERT_EQ(c.head_dim, 8);  // the case this test is about: G = 32 channels cannot fit a head
  Engine e(m, make("kivi", {{"residual_length", 32}}));
  int64_t a = e.new_sequence(), b = e.new_sequence();
  e.prefill({a, b}, {tiny_prompt(100, 1), tiny_prompt(45, 2)});
  for (int i = 0; i < 5; ++i) e.decode({a, b}, {300 + i, 400 + i});
  CodecKvCache& kv = codec_cache(e);
  CodecBytes want;
  for (int64_t len : {105, 50})
    for (int l = 0; l < c.n_layers; ++l)
      for (KvKind k : {KvKind::kKey, KvKind::kValue})
        want += kv.codec().expected_bytes(k, l, c.kv_dim(), len);
  Footprint f = kv.footprint();
  EXPECT_EQ(f.device_payload_bytes, want.payload_bytes());
  EXPECT_EQ(f.device_metadata_bytes, want.metadata_bytes);
  EXPECT_EQ(f.device_index_bytes, 0);
  EXPECT_EQ(f.tokens_held, 155);
  EXPECT_EQ(f.logical_bytes, 155 * c.kv_bytes_per_token(4));
  // Keys: per channel, G = 32 tokens: 2 + 32/32 = 3 bits. Values: per token, the group shrinks to
  // head_dim = 8 channels: 2 + 32/8 = 6 bits. Measured from bytes, equal to what the codec
  // declares.
  EXPECT_DOUBLE_EQ(kv.bytes(KvKind::kKey).encoded_bits_per_element(), 3.0);
  EXPECT_DOUBLE_EQ(kv.bytes(KvKind::kValue).encoded_bits_per_element(), 6.0);
  EXPECT_DOUBLE_EQ(kv.codec().declared_bits(KvKind::kKey, 0), 3.0);
  EXPECT_DOUBLE_EQ(kv.codec().declared_bits(KvKind::kValue, 0), 6.0);
  auto ctr = kv.counters();
  EXPECT_EQ(ctr["k_group_size"], 32);
  EXPECT_EQ(ctr["v_group_size"], 8);
  EXPECT_EQ(ctr["group_size_requested"], 32);
  EXPECT_EQ(ctr["channel_group_adapted"], 1);
  EXPECT_EQ(ctr["k_bits"], 2);
  const double elems = 155.0 * 2 * c.n_layers * c.kv_dim();
  EXPECT_DOUBLE_EQ(ctr["effective_bits_per_element"],
                   8.0 * static_cast<double>(f.physical_bytes()) / elems);
  EXPECT_LT(ctr["effective_bits_per_element"],
            16.0);  // well under fp32's 32 even with the residual
  EXPECT_GT(ctr["scratch_bytes_peak"], 0);
}

TEST(KiviFidelity, EightBitsCloseToFullAndErrorFallsWithBits) {
  // R = 32 so that most of each 256-token window is quantized.
  auto params = [](int kb, int vb) {
    return nlohmann::json{{"k_bits", kb}, {"v_bits", vb}, {"residual_length", 32}};
  };
  const double kl8 = test::mean_story_kl("kivi", params(8, 8));
  const double kl4 = test::mean_story_kl("kivi", params(4, 4));
  const double kl2 = test::mean_story_kl("kivi", params(2, 2));
  RecordProperty("kl_k8v8", std::to_string(kl8));
  RecordProperty("kl_k4v4", std::to_string(kl4));
  RecordProperty("kl_k2v2", std::to_string(kl2));
  EXPECT_LT(kl8, 1e-3);
  EXPECT_GT(kl8, 0.0);  // it does quantize
  EXPECT_LT(kl8, kl4);
  EXPECT_LT(kl4, kl2);
  // Keys are the sensitive half (equal total bits: K4V2 = 5 + 6, K2V4 = 3 + 8 bits per element).
  const double k4v2 = test::mean_story_kl("kivi", params(4, 2)),
               k2v4 = test::mean_story_kl("kivi", params(2, 4));
  RecordProperty("kl_k4v2", std::to_string(k4v2));
  RecordProperty("kl_k2v4", std::to_string(k2v4));
  EXPECT_LT(4 * k4v2, k2v4);
  // Per-channel keys beat per-token keys at 2 bits, at equal full-precision exposure (a chunked
  // residual of R = 32 holds 15.5 tokens on average, a sliding one of 16 holds 16).
  nlohmann::json tok = params(2, 8);
  tok["key_mode"] = "per_token";
  tok["residual_length"] = 16;
  const double chan2 = test::mean_story_kl("kivi", params(2, 8)),
               tok2 = test::mean_story_kl("kivi", tok);
  RecordProperty("kl_k2v8_per_channel", std::to_string(chan2));
  RecordProperty("kl_k2v8_per_token", std::to_string(tok2));
  EXPECT_LT(4 * chan2, tok2);
}

TEST(KiviGroups, OnlyCompletedGroupsAreQuantizedAndNeverAgain) {
  auto m = test::stories260k();
  const int64_t G = 8, R = 16;
  Engine e(m, make("kivi", {{"group_size", G}, {"residual_length", R}, {"k_bits", 3}}));
  int64_t s = e.new_sequence();
  e.prefill({s}, {tiny_prompt(1, 0)});
  std::vector<std::vector<uint8_t>> keys_before, vals_before;
  for (int64_t step = 0; step < 70; ++step) {
    e.decode({s}, {5 + step % 400});
    const int64_t len = e.kv().seq_len(s);
    for (int layer : {0, 4}) {
      const auto& ks = codec_cache(e).stream(s, layer, KvKind::kKey);
      const auto& vs = codec_cache(e).stream(s, layer, KvKind::kValue);
      auto ku = ks.encoded_units(), vu = vs.encoded_units();
      // Keys: blocks of G tokens, written R tokens at a time; values: one unit per token beyond R.
      ASSERT_EQ(static_cast<int64_t>(ku.size()), len / R * R / G) << len;
      ASSERT_EQ(static_cast<int64_t>(vu.size()), std::max<int64_t>(0, len - R)) << len;
      if (layer != 0) continue;
      for (size_t i = 0; i < keys_before.size(); ++i) ASSERT_EQ(ku[i], keys_before[i]) << len;
      for (size_t i = 0; i < vals_before.size(); ++i) ASSERT_EQ(vu[i], vals_before[i]) << len;
      keys_before = ku;
      vals_before = vu;
    }
  }
  EXPECT_EQ(keys_before.size(), 71u / R * R / G);
}

at::Tensor trace(std::unique_ptr<KvCache> kv) {
  EngineOptions o;
  o.prefill_chunk = 7;
  Engine e(test::stories260k(), std::move(kv), o);
  int64_t s = e.new_sequence();
  std::vector<at::Tensor> rows;
  e.prefill({s}, {tiny_prompt(60, 3)},
            [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
  int64_t tok = rows.back()[rows.back().size(0) - 1].argmax().item<int64_t>();
  for (int i = 0; i < 40; ++i) {
    at::Tensor l = e.decode({s}, {tok});
    rows.push_back(l.clone());
    tok = l[0].argmax().item<int64_t>();
  }
  return at::cat(rows);
}

TEST(KiviDeterminism, SameConfigSameLogitsAndBytes) {
  nlohmann::json p = {{"k_bits", 2}, {"v_bits", 4}, {"group_size", 16}, {"residual_length", 16}};
  at::Tensor a = trace(make("kivi", p)), b = trace(make("kivi", p));
  EXPECT_TRUE(at::equal(a, b));
  at::Tensor full = trace(make("full", nlohmann::json::object()));
  EXPECT_GT((a - full).abs().max().item<double>(), 1e-3);  // and it is not the full cache
}

TEST(KiviResidual, CoveringEverythingEqualsTheFullCache) {
  at::Tensor full = trace(make("full", nlohmann::json::object()));
  at::Tensor k = trace(make("kivi", {{"residual_length", 128}, {"residual_dtype", "fp32"}}));
  EXPECT_LT((k - full).abs().max().item<double>(), 1e-4);
  // The same with an fp16 residual: only fp16 rounding of K and V.
  at::Tensor h = trace(make("kivi", {{"residual_length", 128}}));
  const double dh = (h - full).abs().max().item<double>();
  EXPECT_GT(dh, 0.0);   // fp16 rounding is real ...
  EXPECT_LT(dh, 5e-2);  // ... and small next to logits of magnitude ~10
}

TEST(KiviResidual, PerTokenKeysAblationAndPresets) {
  Engine e(test::stories260k(),
           make("kivi", {{"key_mode", "per_token"}, {"residual_length", 16}, {"group_size", 16}}));
  int64_t s = e.new_sequence();
  e.prefill({s}, {tiny_prompt(50, 4)});
  auto ctr = codec_cache(e).counters();
  EXPECT_EQ(ctr["k_per_channel"], 0);
  EXPECT_EQ(ctr["k_group_size"], 8);  // channels, adapted to head_dim
  // Sliding residual for per-token keys: 50 - 16 tokens encoded, one unit each.
  EXPECT_EQ(codec_cache(e).stream(s, 0, KvKind::kKey).encoded_units().size(), 34u);
  Engine e4(test::stories260k(), make("kivi", {{"preset", "kivi-4"}}));
  auto c4 = codec_cache(e4).counters();
  EXPECT_EQ(c4["k_bits"], 4);
  EXPECT_EQ(c4["v_bits"], 4);
  EXPECT_EQ(c4["k_residual_length"], 128);
}

TEST(KiviStore, ForkAndTruncateKeepEncodedBytes) {
  auto m = test::stories260k();
  const auto& c = m->config;
  Engine e(m, make("kivi", {{"residual_length", 32}}));
  int64_t a = e.new_sequence();
  e.prefill({a}, {tiny_prompt(100, 5)});
  int64_t b = e.fork(a);
  at::Tensor la = e.decode({a}, {77}), lb = e.decode({b}, {77});
  EXPECT_TRUE(at::equal(la, lb));
  // Truncate into the third key block (rows 64..95): its 6 survivors keep their codes + a live
  // mask.
  CodecKvCache& kv = codec_cache(e);
  std::vector<float> before(101 * c.kv_dim());
  kv.stream(b, 2, KvKind::kKey).decode(before.data());
  kv.truncate(b, 70);
  const auto& ks = kv.stream(b, 2, KvKind::kKey);
  ASSERT_EQ(ks.rows(), 70);
  std::vector<float> after(70 * c.kv_dim());
  ks.decode(after.data());
  EXPECT_EQ(after, std::vector<float>(before.begin(), before.begin() + 70 * c.kv_dim()));
  EXPECT_GT(kv.footprint().device_index_bytes, 0);
  EXPECT_EQ(kv.stream(b, 2, KvKind::kValue).rows(), 70);
  e.decode({b}, {78});  // carries on from the truncated state
  EXPECT_EQ(kv.seq_len(b), 71);
  e.release(b);
  EXPECT_EQ(kv.footprint().tokens_held, 101);
}

TEST(KiviParams, ErrorsNameTheParameter) {
  auto expect_error = [](nlohmann::json p, const std::string& what) {
    try {
      make("kivi", p);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error({{"residual_length", 100}},
               "kivi.residual_length: 100 is not a multiple of group_size 32");
  expect_error({{"k_bits", 5}}, "kivi.k_bits: 5 is not a supported width");
  expect_error({{"preset", "kivi-4"}, {"k_bits", 8}}, "preset 'kivi-4' sets k_bits");
  expect_error({{"preset", "kivi-3"}}, "kivi-3");
  // Per-token keys need no R % G.
  EXPECT_NO_THROW(make("kivi", {{"residual_length", 100}, {"key_mode", "per_token"}}));
}

}  // namespace
}  // namespace kvb
