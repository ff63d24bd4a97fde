// SparK and ThinK (key-channel pruning on SnapKV-kept tokens): the per-token channel rule on
// hand-made numbers, the codec's round trip (kept channels exact, pruned ones recovered as
// sign x sqrt(m_t / n_c)), its byte count, ThinK's shared mask, rho = 0 = full logits, and the
// physical saving on stories260K; pruning stacked on a quantizing codec (spark + kivi-2).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "harness/common/error.h"
#include "methods/common/channel_prune_codec.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

TEST(Spark, KeepsTheTopChannelsByKeySquaredTimesQueryEnergy) {
  const float k[4] = {1.f, -3.f, 0.5f, 2.f};
  const float n[4] = {1.f, 1.f, 4.f, 0.25f};  // saliency 1, 9, 1, 1
  EXPECT_EQ(spark_kept_channels(k, n, 4, 0.5), (std::vector<int64_t>{0, 1}));  // ties: lower channel
  EXPECT_EQ(spark_kept_channels(k, n, 4, 0.75), (std::vector<int64_t>{1}));
  EXPECT_EQ(spark_kept_channels(k, n, 4, 0.0), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Spark, CodecKeepsChannelsExactlyAndRecoversTheAveragePrunedEnergy) {
  ChannelPruneSpec s;
  s.ratio = 0.5;
  auto codec = make_channel_prune_codec(s);
  auto ks = codec->make_stream(KvKind::kKey, 0, 4, 4);
  const float n[4] = {1.f, 1.f, 4.f, 0.25f};
  const float rows[8] = {1.f, -3.f, 0.5f, 2.f,  /* row 1: */ -0.5f, 0.25f, -2.f, 8.f};
  ks->set_query_energy(n, 32);
  ks->append(rows, 2);
  const float later[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  ks->append(later, 1);  // after the prompt: stored in full
  std::vector<float> out(12);
  ks->decode(out.data());
  // Row 0 keeps channels 0, 1; pruned 2 (s = 1), 3 (s = 1): m = 1; recovered sqrt(1/4), sqrt(1/0.25).
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -3.f);
  EXPECT_FLOAT_EQ(out[2], 0.5f);
  EXPECT_FLOAT_EQ(out[3], 2.f);
  // Row 1: saliency 0.25, 0.0625, 16, 16 -> keeps 2, 3; pruned m = (0.25 + 0.0625) / 2 = 0.15625.
  EXPECT_EQ(out[6], -2.f);
  EXPECT_EQ(out[7], 8.f);
  EXPECT_NEAR(out[4], -std::sqrt(0.15625 / 1.0), 1e-3);  // sign kept (fp16-rounded m)
  EXPECT_NEAR(out[5], std::sqrt(0.15625 / 1.0), 1e-3);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(out[8 + c], later[c]);
  // Bytes: 2 pruned rows x (2 fp32 values + 1 mask byte + 2 (m_t) + 1 sign byte), the head's
  // energy (4 fp32), 1 full row.
  CodecBytes b = ks->bytes();
  EXPECT_EQ(b.code_bytes, 2 * 2 * 4);
  EXPECT_EQ(b.index_bytes, 2);
  EXPECT_EQ(b.metadata_bytes, 2 * 3 + 16);
  EXPECT_EQ(b.full_bytes, 16);
  EXPECT_EQ(b.live_elems(), 12);
  // keep_rows drops whole rows.
  ks->keep_rows({1, 2});
  std::vector<float> kept(8);
  ks->decode(kept.data());
  EXPECT_EQ(kept[2], -2.f);
  EXPECT_EQ(kept[7], 0.4f);
}

TEST(Think, DropsTheSameLowestScoringChannelsForEveryToken) {
  ChannelPruneSpec s;
  s.mode = ChannelPruneMode::kThink;
  s.ratio = 0.5;
  auto ks = make_channel_prune_codec(s)->make_stream(KvKind::kKey, 0, 4, 4);
  const float n[4] = {1.f, 1.f, 4.f, 0.25f};
  // mean k^2 per channel: 1, 4, 1, 4 -> scores (x q^2 = n^2 / w): 1, 4, 16, 0.25 -> keep 1, 2.
  const float rows[8] = {1.f, 2.f, 1.f, 2.f, -1.f, -2.f, -1.f, -2.f};
  ks->set_query_energy(n, 1);
  ks->append(rows, 2);
  std::vector<float> out(8);
  ks->decode(out.data());
  EXPECT_EQ(out, (std::vector<float>{0.f, 2.f, 1.f, 0.f, 0.f, -2.f, -1.f, 0.f}));
  EXPECT_EQ(ks->bytes().index_bytes, 1);  // one mask for the head
  EXPECT_EQ(ks->bytes().code_bytes, 2 * 2 * 4);
}

// Logits of a 160-token prompt (chunks of 64) and 24 teacher-forced decode steps.
at::Tensor trace(const std::string& method, nlohmann::json params, Footprint* fp = nullptr) {
  auto m = test::stories260k();
  Engine e(m, MethodRegistry::instance().create(method, CacheContext{m->config, m->device, m->dtype}, params));
  std::vector<int64_t> t = {1};
  for (int64_t i = 1; i < 184; ++i) t.push_back(3 + (i * 37 + i * i) % 500);
  int64_t s = e.new_sequence();
  std::vector<at::Tensor> rows;
  e.prefill({s}, {std::vector<int64_t>(t.begin(), t.begin() + 160)},
            [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
  for (int64_t i = 160; i < 184; ++i) rows.push_back(e.decode({s}, {t[i]}).clone());
  if (fp) *fp = e.kv().footprint();
  return at::cat(rows);
}

TEST(Spark, ZeroRatioReproducesFullLogitsAndPruningSavesKeyBytes) {
  at::Tensor full = trace("full", nlohmann::json::object());
  for (const char* m : {"spark", "think"}) {
    at::Tensor same = trace(m, {{"pruning_ratio", 0.0}});
    EXPECT_LT((same - full).abs().max().item<double>(), 1e-4) << m;
    Footprint plain, pruned;
    trace("snapkv", {{"budget", 1.0}}, &plain);  // the same tokens, stored plainly
    at::Tensor l = trace(m, {{"pruning_ratio", 0.5}}, &pruned);
    // Prefill logits are exact (pruning happens at the end of prefill); decode ones move.
    EXPECT_LT((l.narrow(0, 0, 160) - full.narrow(0, 0, 160)).abs().max().item<double>(), 1e-4) << m;
    EXPECT_GT((l.narrow(0, 160, 24) - full.narrow(0, 160, 24)).abs().max().item<double>(), 1e-4) << m;
    // Keys of the 160 prompt tokens lose half their 8 channels: payload drops by 160 x 5 layers x
    // 4 heads x 4 channels x 4 bytes; spark adds a mask, m_t and sign bits per token.
    EXPECT_EQ(plain.device_payload_bytes - pruned.device_payload_bytes, 160 * 5 * 4 * 4 * 4) << m;
    EXPECT_GT(pruned.device_metadata_bytes + pruned.device_index_bytes,
              plain.device_metadata_bytes + plain.device_index_bytes) << m;
  }
}

TEST(Spark, StackedOnAQuantizerStoresTheKeptChannelsThroughIt) {
  // Codec level: the pruned rows' kept channels go through the inner codec (fp16 here: exact
  // rounding to check), the pruned channels are recovered as without it.
  ChannelPruneSpec s;
  s.ratio = 0.5;
  s.inner = make_plain_codec(RowDtype::kF16);
  auto ks = make_channel_prune_codec(s)->make_stream(KvKind::kKey, 0, 4, 4);
  const float n[4] = {1.f, 1.f, 4.f, 0.25f};
  const float rows[8] = {1.f, -3.f, 0.5f, 2.f, -0.5f, 0.25f, -2.f, 8.f};
  ks->set_query_energy(n, 32);
  ks->append(rows, 2);
  const float later[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  ks->append(later, 1);
  std::vector<float> out(12);
  ks->decode(out.data());
  EXPECT_EQ(out[1], -3.f);
  EXPECT_FLOAT_EQ(out[3], 2.f);  // recovered: sqrt(m / n_c)
  EXPECT_EQ(out[7], 8.f);
  EXPECT_NEAR(out[8], 0.1f, 1e-4);
  EXPECT_NE(out[8], 0.1f);  // the decode-time row went through fp16
  CodecBytes b = ks->bytes();
  EXPECT_EQ(b.full_bytes, 2 * 2 * 2 + 4 * 2);  // kept channels and the later row at fp16
  EXPECT_EQ(b.live_elems(), 12);
  ks->keep_rows({1, 2});
  std::vector<float> kept(8);
  ks->decode(kept.data());
  EXPECT_EQ(kept[2], -2.f);
  EXPECT_NEAR(kept[7], 0.4f, 1e-4);

  // Method level: spark codec=kivi-2 keeps the tokens spark keeps, in fewer bytes, close logits.
  at::Tensor full = trace("full", nlohmann::json::object());
  Footprint alone, stacked;
  const nlohmann::json p = {{"budget", 0.5}, {"pruning_ratio", 0.5}};
  at::Tensor a = trace("spark", p, &alone);
  nlohmann::json q = p;
  q.update({{"codec", "kivi-2"}, {"codec_residual", 32}});
  at::Tensor k = trace("spark", q, &stacked);
  EXPECT_EQ(alone.tokens_held, stacked.tokens_held);
  EXPECT_LT(stacked.physical_bytes(), alone.physical_bytes() * 3 / 4);
  EXPECT_GT((k - a).abs().max().item<double>(), 1e-4);  // quantization moved something
  EXPECT_LT((k - full).abs().max().item<double>(), 50.0);
  // A per-token quantizer cannot take a pruned key's fewer channels: refused by name.
  try {
    nlohmann::json bad = p;
    bad["codec"] = "pertoken-4";
    trace("think", bad);
    FAIL() << "pertoken under think was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("think.codec"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
