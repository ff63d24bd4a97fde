// duo_attention on kvb-testbed: the head scores are kvpress's on-the-fly scores (finite areas in
// (0, 1]), the lowest head_compression_ratio of the heads stream; a streaming head holds exactly its
// sinks and recent window after prefill and after every decode step while a retrieval head holds
// everything, and the ledger's payload is exactly those rows; the artifact is computed once, then
// read back from its file by a second model object; a corrupt file is refused naming its path.

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/tensor_artifact.h"
#include "methods/duo_attention/duo_attention.h"
#include "tests/methods/calibrated_test_util.h"

namespace kvb {
namespace {

nlohmann::json params(const std::string& cache_dir, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json p = {{"cache_dir", cache_dir},   {"data_dir", test::data_dir()},
                      {"calib_samples", 6},       {"calib_tokens", 256},
                      {"sink_size", 16},          {"recent_size", 32}};
  for (auto it = extra.begin(); it != extra.end(); ++it) p[it.key()] = it.value();
  return p;
}

TEST(DuoAttention, HeadScoresAndTheStreamingSplit) {
  CalibrationText t;
  t.data_dir = test::data_dir();
  t.samples = 4;
  t.tokens = 256;
  const at::Tensor s = duo::head_scores(test::testbed(), t, 500);
  const ModelConfig& c = test::testbed()->config;
  ASSERT_EQ(s.sizes(), (std::vector<int64_t>{c.n_layers, c.n_kv_heads}));
  EXPECT_GT(s.min().item<float>(), 0.f);
  EXPECT_LE(s.max().item<float>(), 1.f + 1e-5f);
  EXPECT_GT((s.max() - s.min()).item<float>(), 1e-4f) << "every head scored alike";
  const auto split = duo::streaming_heads(s, 0.5);
  int64_t n = 0;
  float max_streaming = -1, min_retrieval = 2;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const float v = s[l][h].item<float>();
      if (split[l][h]) {
        ++n;
        max_streaming = std::max(max_streaming, v);
      } else {
        min_retrieval = std::min(min_retrieval, v);
      }
    }
  EXPECT_EQ(n, c.n_layers * c.n_kv_heads / 2);
  EXPECT_LE(max_streaming, min_retrieval);
  int64_t all = 0;
  for (const auto& l : duo::streaming_heads(s, 1.0))
    for (uint8_t x : l) all += x;
  EXPECT_EQ(all, c.n_layers * c.n_kv_heads);
}

TEST(DuoAttention, StreamingHeadsKeepSinksAndRecentPhysically) {
  const std::string dir = test::make_temp_dir("duo");
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  const nlohmann::json p = params(dir);
  auto art = MethodRegistry::instance().calibrate("duo_attention", m, p);
  const auto* ta = dynamic_cast<const TensorArtifact*>(art.get());
  ASSERT_NE(ta, nullptr);
  const auto split = duo::streaming_heads(ta->get("head_scores"), 0.5);
  Engine e(m, test::make_with_model(m, "duo_attention", p));
  const int64_t T = 300;
  const int64_t seq = e.new_sequence();
  at::Tensor logits = e.prefill({seq}, {test::walk_prompt(T, c.vocab_size)});
  auto* ev = dynamic_cast<EvictingKvCache*>(&e.kv());
  ASSERT_NE(ev, nullptr);
  auto check = [&](int64_t len) {
    int64_t entries = 0;
    for (int l = 0; l < c.n_layers; ++l)
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        const std::vector<int32_t> kept = ev->kept_indices(seq, l, h);
        entries += static_cast<int64_t>(kept.size());
        if (!split[l][h]) {
          ASSERT_EQ(static_cast<int64_t>(kept.size()), len) << l << "/" << h;
          continue;
        }
        ASSERT_EQ(kept.size(), 48u) << l << "/" << h;
        for (int i = 0; i < 16; ++i) EXPECT_EQ(kept[i], i);
        for (int i = 0; i < 32; ++i) EXPECT_EQ(kept[16 + i], len - 32 + i);
      }
    // The payload is exactly the kept rows (K and V, fp32): streaming heads freed theirs.
    EXPECT_EQ(e.kv().footprint().device_payload_bytes, entries * 2 * c.head_dim * 4);
    EXPECT_LT(e.kv().footprint().physical_bytes(), c.full_kv_bytes(len, 4));
  };
  check(T);
  for (int i = 0; i < 20; ++i) logits = e.decode({seq}, {logits[0].argmax().item<int64_t>()});
  check(T + 20);
  const auto counters = e.kv().counters();
  EXPECT_EQ(counters.at("streaming_heads"), c.n_layers * c.n_kv_heads / 2);
  EXPECT_EQ(counters.at("calib_from_cache"), 0.0);
}

TEST(DuoAttention, ArtifactIsCachedReusedAndCheckedForCorruption) {
  const std::string dir = test::make_temp_dir("duo_cache");
  const nlohmann::json p = params(dir);
  const int64_t before = tensor_artifacts_computed();
  auto a = MethodRegistry::instance().calibrate("duo_attention", test::testbed(true), p);
  EXPECT_EQ(tensor_artifacts_computed(), before + 1);
  EXPECT_FALSE(a->from_cache);
  ASSERT_TRUE(file_exists(a->path));
  EXPECT_EQ(a->file_bytes, static_cast<int64_t>(MappedFile(a->path).size()));
  // Another model object with the same weights: read from the file, not computed again.
  auto b = MethodRegistry::instance().calibrate("duo_attention", test::testbed(true), p);
  EXPECT_EQ(tensor_artifacts_computed(), before + 1);
  EXPECT_TRUE(b->from_cache);
  EXPECT_EQ(b->key, a->key);
  EXPECT_EQ(b->path, a->path);
  EXPECT_TRUE(at::equal(dynamic_cast<const TensorArtifact&>(*a).get("head_scores"),
                        dynamic_cast<const TensorArtifact&>(*b).get("head_scores")));
  // The split parameters are not calibration inputs: the same artifact serves every ratio.
  auto r = MethodRegistry::instance().calibrate("duo_attention", test::testbed(true),
                                                params(dir, {{"head_compression_ratio", 0.25}}));
  EXPECT_EQ(r->key, a->key);
  // Other calibration text: another artifact.
  auto o = MethodRegistry::instance().calibrate("duo_attention", test::testbed(true),
                                                params(dir, {{"calib_samples", 3}}));
  EXPECT_NE(o->key, a->key);
  // One payload byte changed: refused, naming the file.
  {
    std::fstream f(a->path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-2, std::ios::end);
    const char byte = static_cast<char>(f.get());
    f.seekp(-2, std::ios::end);
    f.put(static_cast<char>(~byte));
  }
  try {
    MethodRegistry::instance().calibrate("duo_attention", test::testbed(true), p);
    FAIL() << "a corrupt artifact was accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(a->path), std::string::npos) << w;
    EXPECT_NE(w.find("corrupt"), std::string::npos) << w;
  }
  // Cut short: refused too (the safetensors reader names the file).
  { std::ofstream(a->path, std::ios::binary | std::ios::trunc) << "xx"; }
  EXPECT_THROW(MethodRegistry::instance().calibrate("duo_attention", test::testbed(true), p), Error);
}

TEST(DuoAttention, MissingCalibrationTextAndModelAreNamed) {
  try {
    MethodRegistry::instance().calibrate("duo_attention", test::testbed(true),
                                         params("", {{"calib_corpus", "no-such-corpus"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-corpus"), std::string::npos) << e.what();
  }
  const ModelConfig& c = test::testbed()->config;
  try {
    MethodRegistry::instance().create("duo_attention", CacheContext{c, c10::kCPU, c10::kFloat},
                                      params(""));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duo_attention calibrates on the run's model"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvb
