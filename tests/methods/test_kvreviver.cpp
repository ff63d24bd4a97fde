// kvreviver (methods/kvreviver): the count-sketch on hand-made rows, the exact-region rule
// (recent + heavy candidates), attention = one softmax over exact + reconstructed tokens (checked
// against probe_view and the sketch API), lossless revival with a wide sketch, keep-everything =
// full logits, the ledger against hand-computed bytes, counters, determinism, fork/truncate, and
// the CPU-fp32-only refusal. Sketch-mode tests set reconstruction=sketch (the default is merge).
// Merge mode: the buckets on hand-made rows, a bucket of identical tokens = their exact attention,
// attention = softmax over probe_view (centroids re-rotated at the rounded mean position), a wide
// merge = full attention, the ledger by hand, determinism, merge beats sketch at the defaults.
// With a codec (KvReviverCodec): the exact region's bytes are the codec's, eviction-only equals
// H2O with the same codec, and revival still beats eviction when the rows are 2-bit.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/engine/engine.h"
#include "harness/engine/transformer.h"
#include "harness/kv/method_registry.h"
#include "methods/kvreviver/kvreviver.h"
#include "tests/methods/cache_driver.h"
#include "tests/methods/method_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::rnd;
using test::tiny;

using kvreviver::CountSketch;
using kvreviver::MergeBuckets;
using kvreviver::token_key;

CacheContext ctx_of(const Model& m) { return CacheContext{m.config, m.device, m.dtype}; }

std::unique_ptr<KvCache> make(const CacheContext& ctx,
                              nlohmann::json params = nlohmann::json::object()) {
  return MethodRegistry::instance().create("kvreviver", ctx, params);
}

KvReviverKvCache& rev(KvCache& kv) { return dynamic_cast<KvReviverKvCache&>(kv); }

using test::Driver;

at::Tensor trace(std::unique_ptr<KvCache> kv, std::unique_ptr<Engine>* engine = nullptr,
                 int64_t prefill_chunk = 7) {
  EngineOptions o;
  o.prefill_chunk = prefill_chunk;
  auto e = std::make_unique<Engine>(test::stories260k(), std::move(kv), o);
  std::vector<int64_t> prompt = {1};
  for (int i = 0; i < 39; ++i) prompt.push_back(260 + (i * 13) % 250);
  int64_t s = e->new_sequence();
  std::vector<at::Tensor> rows;
  e->prefill({s}, {prompt}, [&](const at::Tensor& l, int64_t) { rows.push_back(l.clone()); });
  int64_t tok = rows.back()[rows.back().size(0) - 1].argmax().item<int64_t>();
  for (int i = 0; i < 10; ++i) {
    at::Tensor l = e->decode({s}, {tok});
    rows.push_back(l.clone());
    tok = l[0].argmax().item<int64_t>();
  }
  if (engine) *engine = std::move(e);
  return at::cat(rows);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Relative L2 reconstruction error of n random rows folded into a sketch.
double sketch_error(int64_t depth, int64_t width, int64_t n, uint64_t seed) {
  CountSketch s(depth, width, 8, seed);
  at::Tensor x = rnd({n, 8}, static_cast<uint32_t>(seed + 1));
  for (int64_t i = 0; i < n; ++i) s.add(token_key(i, 0), x[i].data_ptr<float>());
  double err = 0, norm = 0;
  std::vector<float> r(8);
  for (int64_t i = 0; i < n; ++i) {
    s.reconstruct(token_key(i, 0), r.data());
    for (int c = 0; c < 8; ++c) {
      const double d = r[c] - x[i][c].item<float>();
      err += d * d;
      norm += x[i][c].item<float>() * x[i][c].item<float>();
    }
  }
  return std::sqrt(err / norm);
}

// ---------------------------------------------------------------- the sketch

TEST(KvReviverSketch, OneRowIsExactAndCollisionsAddWithTheirSigns) {
  const float a[3] = {1, -2, 3}, b[3] = {10, 20, -30};
  for (int64_t depth : {1, 2, 3, 4}) {
    CountSketch s(depth, 64, 3, 7);
    std::vector<float> r(3, -1.f);
    s.reconstruct(token_key(5, 0), r.data());
    EXPECT_EQ(r, (std::vector<float>{0, 0, 0}));  // empty
    EXPECT_EQ(s.bytes(), 0);
    s.add(token_key(5, 0), a);
    EXPECT_EQ(s.bytes(), depth * 64 * 3 * 4);
    s.reconstruct(token_key(5, 0), r.data());
    EXPECT_EQ(r, (std::vector<float>{1, -2, 3})) << depth;
  }
  // Width 1, depth 1: everything collides; the estimate of a is a + s(a) s(b) b.
  CountSketch one(1, 1, 3, 3);
  one.add(token_key(0, 0), a);
  one.add(token_key(1, 0), b);
  const float sab = one.sign(0, token_key(0, 0)) * one.sign(0, token_key(1, 0));
  std::vector<float> r(3);
  one.reconstruct(token_key(0, 0), r.data());
  for (int c = 0; c < 3; ++c) EXPECT_FLOAT_EQ(r[c], a[c] + sab * b[c]);
}

TEST(KvReviverSketch, ReconstructionIsTheMedianOverRowsOfSignedBuckets) {
  for (int64_t depth : {3, 4, 5}) {
    CountSketch s(depth, 8, 4, 11);
    at::Tensor x = rnd({40, 4}, 12);
    for (int64_t i = 0; i < 40; ++i) s.add(token_key(i, 0), x[i].data_ptr<float>());
    for (int64_t i = 0; i < 40; i += 7) {
      std::vector<float> got(4);
      s.reconstruct(token_key(i, 0), got.data());
      for (int64_t c = 0; c < 4; ++c) {
        std::vector<float> est;
        for (int64_t r = 0; r < depth; ++r)
          est.push_back(s.sign(r, token_key(i, 0)) *
                        s.table()[(r * 8 + s.bucket(r, token_key(i, 0))) * 4 + c]);
        std::sort(est.begin(), est.end());
        const float med = depth % 2 ? est[depth / 2] : 0.5f * (est[depth / 2 - 1] + est[depth / 2]);
        EXPECT_FLOAT_EQ(got[c], med) << depth << " " << i << " " << c;
      }
    }
  }
}

TEST(KvReviverSketch, ErrorFallsWithWidthAndHashesDependOnSeedAndEpoch) {
  const double narrow = sketch_error(3, 16, 200, 1), wide = sketch_error(3, 4096, 200, 1);
  RecordProperty("rel_err_w16", std::to_string(narrow));
  RecordProperty("rel_err_w4096", std::to_string(wide));
  EXPECT_GT(narrow, 1.0);  // 200 rows in 16 buckets: ~sqrt(200 / 16) rows of noise
  EXPECT_LT(wide, 0.2);
  CountSketch a(3, 1 << 20, 1, 1), b(3, 1 << 20, 1, 2);
  int same_seed_diff = 0, epoch_diff = 0;
  for (int64_t t = 0; t < 50; ++t) {
    same_seed_diff += a.bucket(0, token_key(t, 0)) != b.bucket(0, token_key(t, 0));
    epoch_diff += a.bucket(1, token_key(t, 0)) != a.bucket(1, token_key(t, 1));
    EXPECT_EQ(a.bucket(2, token_key(t, 0)),
              CountSketch(3, 1 << 20, 1, 1).bucket(2, token_key(t, 0)));
  }
  EXPECT_GE(same_seed_diff, 49);
  EXPECT_GE(epoch_diff, 49);
}

// ---------------------------------------------------------------- the store

TEST(KvReviverStore, KeepsRecentAndHeavyCandidatesExactAndSketchesTheRest) {
  // q = (2, 0); tokens 1 and 3 have key (10, 0), the rest (0, 0). Budget 4 = 2 heavy + 2 recent.
  ModelConfig c = tiny(1, 1, 1, 2);
  for (bool revive : {true, false}) {
    auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 4},
                                                 {"budget_unit", "tokens_per_head"},
                                                 {"revive", revive},
                                                 {"reconstruction", "sketch"},
                                                 {"width", 8},
                                                 {"depth", 1}});
    Driver d{kv.get(), 1};
    at::Tensor q = at::tensor({2.f, 0.f}).view({1, 1, 2});
    for (int t = 0; t < 12; ++t) {
      const float big = (t == 1 || t == 3) ? 10.f : 0.f;
      d.step(q, at::tensor({big, 0.f}).view({1, 1, 2}), rnd({1, 1, 2}, 100 + t),
             t == 0 ? Phase::kPrefill : Phase::kDecode);
      EXPECT_LE(rev(*kv).kept_indices(0, 0, 0).size(), 4u);
    }
    EXPECT_EQ(rev(*kv).kept_indices(0, 0, 0), (std::vector<int32_t>{1, 3, 10, 11})) << revive;
    auto cnt = kv->counters();
    EXPECT_EQ(cnt.at("evicted_entries"), 8);
    EXPECT_EQ(cnt.at("sketched_entries"), revive ? 8 : 0);
    EXPECT_EQ(cnt.at("sketch_bytes"), revive ? 2 * 1 * 8 * 2 * 4 : 0);
    EXPECT_EQ(rev(*kv).key_sketch(0, 0, 0).bytes(), revive ? 8 * 2 * 4 : 0);
  }
}

TEST(KvReviverStore, AttentionIsOneSoftmaxOverExactAndReconstructedTokens) {
  ModelConfig c = tiny(2, 4, 2, 4);
  at::Tensor cos, sin;
  compute_rope_tables(c, 64, &cos, &sin);
  for (bool pre_rope : {true, false}) {
    auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 5},
                                                 {"budget_unit", "tokens_per_head"},
                                                 {"width", 4},
                                                 {"depth", 3},
                                                 {"reconstruction", "sketch"},
                                                 {"keys_pre_rope", pre_rope}});
    Driver d{kv.get(), 2};
    at::Tensor K = rnd({20, 2, 4}, 1), V = rnd({20, 2, 4}, 2);
    d.step(rnd({9, 4, 4}, 3), K.narrow(0, 0, 9), V.narrow(0, 0, 9), Phase::kPrefill);
    for (int64_t t = 9; t < 20; ++t) {
      // Before the step: what attention will read, by token index (exact + reconstructed).
      std::vector<HeadSnapshot> view = probe_view_of(*kv, 0, 0);
      ASSERT_EQ(view.size(), 2u);
      at::Tensor q = rnd({1, 4, 4}, 40 + t) * 2;
      at::Tensor out = d.step(q, K.narrow(0, t, 1), V.narrow(0, t, 1), Phase::kDecode);
      for (int64_t h = 0; h < 2; ++h) {
        ASSERT_EQ(view[h].index.size(0), t);  // every token: nothing is lost from the view
        at::Tensor Kh = at::cat({view[h].k, K[t][h].unsqueeze(0)});
        at::Tensor Vh = at::cat({view[h].v, V[t][h].unsqueeze(0)});
        for (int64_t g = 0; g < 2; ++g) {
          at::Tensor p = at::softmax(Kh.matmul(q[0][h * 2 + g]) / 2.0, 0);
          EXPECT_LT(max_diff(out[0][h * 2 + g], p.matmul(Vh)), 1e-5) << t << "/" << h;
        }
      }
    }
    // The view's vague rows are the sketch's reconstructions, re-rotated to their positions.
    std::vector<HeadSnapshot> view = probe_view_of(*kv, 1, 0);
    std::vector<int32_t> kept = rev(*kv).kept_indices(0, 1, 1);
    int checked = 0;
    for (int64_t r = 0; r < 20; ++r) {
      const int32_t t = static_cast<int32_t>(view[1].index[r].item<int64_t>());
      EXPECT_EQ(t, r);
      if (std::find(kept.begin(), kept.end(), t) != kept.end()) {
        EXPECT_TRUE(at::equal(view[1].k[r], K[t][1]));
        continue;
      }
      at::Tensor rk = at::empty({1, 1, 4}), rv = at::empty({4});
      rev(*kv).key_sketch(0, 1, 1).reconstruct(token_key(t, 0), rk.data_ptr<float>());
      rev(*kv).value_sketch(0, 1, 1).reconstruct(token_key(t, 0), rv.data_ptr<float>());
      if (pre_rope) rk = apply_rope(rk, cos.narrow(0, t, 1), sin.narrow(0, t, 1), c.rope_style);
      EXPECT_LT(max_diff(view[1].k[r], rk.view({4})), 1e-5) << t;
      EXPECT_TRUE(at::equal(view[1].v[r], rv)) << t;
      // Width 4 for 15 tokens: collisions, the reconstruction is not the key.
      checked += max_diff(view[1].v[r], V[t][1]) > 1e-3;
    }
    EXPECT_GT(checked, 5);
  }
}

TEST(KvReviverStore, AWideSketchRevivesEvictedTokensAlmostLosslessly) {
  ModelConfig c = tiny(1, 2, 1, 4);
  at::Tensor cos, sin;
  compute_rope_tables(c, 64, &cos, &sin);
  auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 4},
                                               {"budget_unit", "tokens_per_head"},
                                               {"width", 4096},
                                               {"reconstruction", "sketch"},
                                               {"measure_error", true}});
  Driver d{kv.get(), 1};
  at::Tensor K = rnd({16, 1, 4}, 5), V = rnd({16, 1, 4}, 6);
  // Keys post-RoPE as the engine hands them.
  at::Tensor Kr = apply_rope(K, cos.narrow(0, 0, 16), sin.narrow(0, 0, 16), c.rope_style);
  for (int64_t t = 0; t < 16; ++t)
    d.step(rnd({1, 2, 4}, 20 + t), Kr.narrow(0, t, 1), V.narrow(0, t, 1),
           t == 0 ? Phase::kPrefill : Phase::kDecode);
  auto view = probe_view_of(*kv, 0, 0);
  EXPECT_LT(max_diff(view[0].k, Kr.select(1, 0)), 1e-5);
  EXPECT_LT(max_diff(view[0].v, V.select(1, 0)), 1e-6);
  auto cnt = kv->counters();
  EXPECT_EQ(cnt.at("evicted_entries"), 12);
  EXPECT_LT(cnt.at("recon_rel_err_k.at_eviction"), 1e-6);
  EXPECT_LT(cnt.at("recon_rel_err_k.at_attention"), 1e-5);
  EXPECT_LT(cnt.at("recon_rel_err_v.at_attention"), 1e-6);
  EXPECT_GT(cnt.at("vague_attention_mass"), 0.1);
}

TEST(KvReviverStore, RefusesAnythingButCpuFp32) {
  ModelConfig c = tiny(1, 2, 1, 4);
  try {
    make({c, c10::kCPU, c10::kBFloat16});
    FAIL();
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("method kvreviver runs in fp32 only (dtype bf16"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make({c, c10::kCPU, c10::kFloat}, {{"budget", 1.5}}), kvb::Error);
  EXPECT_THROW(make({c, c10::kCPU, c10::kFloat}, {{"depth", 65}}), kvb::Error);
  EXPECT_THROW(make({c, c10::kCPU, c10::kFloat}, {{"reconstruction", "median"}}), kvb::Error);
}

TEST(KvReviverStore, TruncateDropsTheTailAndGivesReappendedTokensFreshBuckets) {
  ModelConfig c = tiny(1, 2, 1, 4);
  auto kv = make({c, c10::kCPU, c10::kFloat},
                 {{"budget", 4},
                  {"budget_unit", "tokens_per_head"},
                  {"width", 4096},
                  {"reconstruction", "sketch"}});
  Driver d{kv.get(), 1};
  for (int64_t t = 0; t < 12; ++t)
    d.step(rnd({1, 2, 4}, 20 + t), rnd({1, 1, 4}, 40 + t), rnd({1, 1, 4}, 60 + t),
           t == 0 ? Phase::kPrefill : Phase::kDecode);
  std::vector<int32_t> kept = rev(*kv).kept_indices(0, 0, 0);
  kv->truncate(0, 8);
  EXPECT_EQ(kv->seq_len(0), 8);
  std::vector<int32_t> want;
  for (int32_t t : kept)
    if (t < 8) want.push_back(t);
  EXPECT_EQ(rev(*kv).kept_indices(0, 0, 0), want);
  // Sketched tokens 8..11 (those not kept) cannot be subtracted: counted as stale.
  int64_t stale = 0;
  for (int32_t t = 8; t < 12; ++t) stale += std::find(kept.begin(), kept.end(), t) == kept.end();
  EXPECT_EQ(kv->counters().at("stale_sketch_tokens"), stale);
  EXPECT_EQ(probe_view_of(*kv, 0, 0)[0].index.size(0), 8);
  // Re-appended token indices live in the new epoch's buckets: a sketched one reconstructs its
  // new value (with the old epoch's key it would also pick up the stale old value).
  d.pos = 8;
  for (int64_t t = 8; t < 14; ++t)
    d.step(rnd({1, 2, 4}, 120 + t), rnd({1, 1, 4}, 140 + t), rnd({1, 1, 4}, 160 + t),
           Phase::kDecode);
  auto view = probe_view_of(*kv, 0, 0);
  ASSERT_EQ(view[0].index.size(0), 14);
  kept = rev(*kv).kept_indices(0, 0, 0);
  int revived = 0;
  for (int32_t t = 8; t < 12; ++t) {
    if (std::find(kept.begin(), kept.end(), t) != kept.end()) continue;
    EXPECT_LT(max_diff(view[0].v[t], rnd({1, 1, 4}, 160 + t).view({4})), 1e-5) << t;
    ++revived;
  }
  EXPECT_GE(revived, 2);
  EXPECT_THROW(kv->truncate(0, 20), kvb::Error);
}

// ---------------------------------------------------------------- merge mode

TEST(KvReviverMerge, BucketsOpenUntilWidthThenJoinTheNearestCentroid) {
  MergeBuckets mb(2, 2, true);
  EXPECT_EQ(mb.bytes(), 0);
  EXPECT_EQ(mb.nearest(std::vector<float>{0, 0}.data()), -1);
  const float k0[2] = {0, 0}, k1[2] = {10, 0}, k2[2] = {9, 1}, k3[2] = {1, -1};
  const float v0[2] = {1, 1}, v1[2] = {2, 2}, v2[2] = {4, 6}, v3[2] = {3, 3};
  EXPECT_EQ(mb.add(k0, v0, 4), 0);
  EXPECT_EQ(mb.bytes(), 2 * (2 * 2 * 4 + 4 + 8));
  EXPECT_EQ(mb.add(k1, v1, 7), 1);
  EXPECT_EQ(mb.add(k2, v2, 10), 1);  // full: nearest centroid (10, 0)
  EXPECT_EQ(mb.add(k3, v3, 5), 0);   // nearest centroid (0, 0)
  EXPECT_EQ(mb.used(), 2);
  EXPECT_EQ(mb.count(0), 2);
  EXPECT_EQ(mb.count(1), 2);
  EXPECT_EQ(mb.tokens(), 4);
  std::vector<float> k(2), v(2);
  mb.centroid(1, k.data(), v.data());
  EXPECT_EQ(k, (std::vector<float>{9.5f, 0.5f}));
  EXPECT_EQ(v, (std::vector<float>{3.f, 4.f}));
  EXPECT_EQ(mb.position_sum(1), 17);
  EXPECT_EQ(mb.position(1), 9);  // round(8.5) away from zero
  EXPECT_EQ(mb.position(0), 5);  // round(4.5)
  // Without positions: no position sums in the bytes.
  MergeBuckets np(3, 4, false);
  np.add(std::vector<float>(4, 1.f).data(), std::vector<float>(4, 2.f).data(), 0);
  EXPECT_EQ(np.bytes(), 3 * (2 * 4 * 4 + 4));
  EXPECT_THROW(np.position(0), kvb::InternalError);  // its owner never asks: a bug, not an input
}

// Full attention over every token, by hand: K post-RoPE [T, Hkv, D], q [Hq, D].
at::Tensor full_attention(const at::Tensor& K, const at::Tensor& V, const at::Tensor& q,
                          int64_t upto) {
  const int64_t Hq = q.size(0), Hkv = K.size(1), G = Hq / Hkv;
  std::vector<at::Tensor> outs;
  for (int64_t hq = 0; hq < Hq; ++hq) {
    at::Tensor Kh = K.narrow(0, 0, upto).select(1, hq / G), Vh = V.narrow(0, 0, upto).select(1, hq / G);
    at::Tensor p = at::softmax(Kh.matmul(q[hq]) / std::sqrt(static_cast<float>(q.size(1))), 0);
    outs.push_back(p.matmul(Vh));
  }
  return at::stack(outs);
}

TEST(KvReviverMerge, ABucketOfIdenticalTokensReproducesTheirExactAttention) {
  // Tokens 0..7 share one key (post-RoPE) and one value; 8..13 are random. Budget 4, all recent:
  // step t attends over tokens <= t - 5 merged and t - 4..t exact, so up to step 11 only identical
  // tokens are merged: with width 3 the first 3 evicted open buckets, every later one joins one
  // of them (all centroids equal), and attention must equal full attention exactly.
  ModelConfig c = tiny(1, 2, 1, 4);
  auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 4},
                                               {"budget_unit", "tokens_per_head"},
                                               {"recent_fraction", 1.0},
                                               {"width", 3},
                                               {"keys_pre_rope", false}});
  Driver d{kv.get(), 1};
  at::Tensor K = rnd({14, 1, 4}, 7) * 1.5, V = rnd({14, 1, 4}, 8);
  for (int64_t t = 1; t < 8; ++t) {
    K[t].copy_(K[0]);
    V[t].copy_(V[0]);
  }
  for (int64_t t = 0; t < 12; ++t) {
    at::Tensor q = rnd({1, 2, 4}, 30 + t) * 2;
    at::Tensor out = d.step(q, K.narrow(0, t, 1), V.narrow(0, t, 1),
                            t == 0 ? Phase::kPrefill : Phase::kDecode);
    EXPECT_LT(max_diff(out[0], full_attention(K, V, q[0], t + 1)), 1e-5) << t;
  }
  const MergeBuckets& mb = rev(*kv).buckets(0, 0, 0);
  EXPECT_EQ(mb.used(), 3);
  EXPECT_EQ(mb.tokens(), 8);  // after step 11: tokens 0..7 evicted, 8..11 exact
  auto cnt = kv->counters();
  EXPECT_EQ(cnt.at("merged_entries"), 8);
  EXPECT_EQ(cnt.at("merge.buckets_used"), 3);
  EXPECT_NEAR(cnt.at("merge.tokens_per_bucket"), 8.0 / 3.0, 1e-12);
  EXPECT_LT(cnt.at("recon_rel_err_k.at_eviction"), 1e-6);
  EXPECT_GT(cnt.at("vague_attention_mass"), 0.0);
  EXPECT_EQ(cnt.at("sketch_bytes"), 0);
  EXPECT_EQ(cnt.at("sketched_entries"), 0);
}

TEST(KvReviverMerge, AttentionIsOneSoftmaxOverExactRowsAndBucketCentroids) {
  // measure_error keeps the token -> bucket map: probe_view shows each vague token as its bucket's
  // centroid (n copies of one logit = the log(n) bias), so a plain softmax over the view is
  // attention. Pre-RoPE: the centroid of the pre-RoPE keys rotated at round(mean position).
  ModelConfig c = tiny(2, 4, 2, 4);
  at::Tensor cos, sin;
  compute_rope_tables(c, 64, &cos, &sin);
  for (bool pre_rope : {true, false}) {
    auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 5},
                                                 {"budget_unit", "tokens_per_head"},
                                                 {"width", 3},
                                                 {"measure_error", true},
                                                 {"keys_pre_rope", pre_rope}});
    Driver d{kv.get(), 2};
    at::Tensor K0 = rnd({22, 2, 4}, 1), V = rnd({22, 2, 4}, 2);  // K0: pre-RoPE
    at::Tensor K = apply_rope(K0, cos.narrow(0, 0, 22), sin.narrow(0, 0, 22), c.rope_style);
    d.step(rnd({9, 4, 4}, 3), K.narrow(0, 0, 9), V.narrow(0, 0, 9), Phase::kPrefill);
    for (int64_t t = 9; t < 22; ++t) {
      std::vector<HeadSnapshot> view = probe_view_of(*kv, 0, 0);
      ASSERT_EQ(view.size(), 2u);
      at::Tensor q = rnd({1, 4, 4}, 40 + t) * 2;
      at::Tensor out = d.step(q, K.narrow(0, t, 1), V.narrow(0, t, 1), Phase::kDecode);
      for (int64_t h = 0; h < 2; ++h) {
        ASSERT_EQ(view[h].index.size(0), t);
        at::Tensor Kh = at::cat({view[h].k, K[t][h].unsqueeze(0)});
        at::Tensor Vh = at::cat({view[h].v, V[t][h].unsqueeze(0)});
        for (int64_t g = 0; g < 2; ++g) {
          at::Tensor p = at::softmax(Kh.matmul(q[0][h * 2 + g]) / 2.0, 0);
          EXPECT_LT(max_diff(out[0][h * 2 + g], p.matmul(Vh)), 1e-5) << t << "/" << h;
        }
      }
    }
    // Hand-made centroids: group the vague tokens of layer 1, head 1 by their view rows.
    const MergeBuckets& mb = rev(*kv).buckets(0, 1, 1);
    EXPECT_EQ(mb.used(), 3);
    std::vector<HeadSnapshot> view = probe_view_of(*kv, 1, 0);
    std::vector<int32_t> kept = rev(*kv).kept_indices(0, 1, 1);
    EXPECT_EQ(mb.tokens(), 22 - static_cast<int64_t>(kept.size()));
    for (int64_t b = 0; b < 3; ++b) {
      // The members of bucket b: the vague tokens whose view value is b's centroid value.
      std::vector<float> ck(4), cv(4);
      mb.centroid(b, ck.data(), cv.data());
      at::Tensor cvt = at::tensor(cv);
      at::Tensor ksum = at::zeros({4}), vsum = at::zeros({4});
      int64_t n = 0, psum = 0;
      for (int64_t r = 0; r < 22; ++r) {
        if (std::find(kept.begin(), kept.end(), r) != kept.end()) continue;
        if (!at::equal(view[1].v[r], cvt)) continue;
        ksum += (pre_rope ? K0 : K)[r][1];
        vsum += V[r][1];
        psum += r;
        ++n;
      }
      ASSERT_EQ(n, mb.count(b)) << b;
      EXPECT_LT(max_diff(vsum / n, cvt), 1e-5);
      at::Tensor want = (ksum / n).view({1, 1, 4});
      if (pre_rope) {
        const int64_t rp = std::llround(static_cast<double>(psum) / n);
        EXPECT_EQ(mb.position(b), rp);
        want = apply_rope(want, cos.narrow(0, rp, 1), sin.narrow(0, rp, 1), c.rope_style);
      }
      for (int64_t r = 0; r < 22; ++r) {
        if (at::equal(view[1].v[r], cvt) &&
            std::find(kept.begin(), kept.end(), r) == kept.end()) {
          EXPECT_LT(max_diff(view[1].k[r], want.view({4})), 1e-5) << b << " " << r;
        }
      }
    }
    EXPECT_GT(kv->counters().at("recon_rel_err_k.at_attention"), 0.1);  // 17 tokens, 3 buckets
  }
  // Without measure_error the token -> bucket map is not kept: probe_view is unsupported.
  auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 2}, {"budget_unit", "tokens_per_head"}});
  Driver d{kv.get(), 2};
  d.step(rnd({6, 4, 4}, 3), rnd({6, 2, 4}, 4), rnd({6, 2, 4}, 5), Phase::kPrefill);
  EXPECT_TRUE(probe_view_of(*kv, 0, 0).empty());
}

TEST(KvReviverMerge, AsManyBucketsAsEvictedTokensIsFullAttention) {
  // Every evicted token in its own bucket (count 1, bias 0; pre-RoPE: rotated back at its own
  // position): attention equals full attention over all tokens.
  ModelConfig c = tiny(1, 2, 1, 4);
  at::Tensor cos, sin;
  compute_rope_tables(c, 64, &cos, &sin);
  for (bool pre_rope : {true, false}) {
    auto kv = make({c, c10::kCPU, c10::kFloat}, {{"budget", 3},
                                                 {"budget_unit", "tokens_per_head"},
                                                 {"width", 64},
                                                 {"keys_pre_rope", pre_rope}});
    Driver d{kv.get(), 1};
    at::Tensor K = apply_rope(rnd({20, 1, 4}, 9), cos.narrow(0, 0, 20), sin.narrow(0, 0, 20),
                              c.rope_style);
    at::Tensor V = rnd({20, 1, 4}, 10);
    for (int64_t t = 0; t < 20; ++t) {
      at::Tensor q = rnd({1, 2, 4}, 50 + t) * 2;
      at::Tensor out = d.step(q, K.narrow(0, t, 1), V.narrow(0, t, 1),
                              t == 0 ? Phase::kPrefill : Phase::kDecode);
      EXPECT_LT(max_diff(out[0], full_attention(K, V, q[0], t + 1)), 1e-5) << t << pre_rope;
    }
    EXPECT_EQ(rev(*kv).buckets(0, 0, 0).used(), 17);  // tokens 0..16 evicted, 17..19 exact
    EXPECT_EQ(kv->counters().at("merge.tokens_per_bucket"), 1.0);
  }
}

// ---------------------------------------------------------------- stories260K

TEST(KvReviverModel, KeepEverythingReproducesFullLogits) {
  auto m = test::stories260k();
  at::Tensor ref =
      trace(MethodRegistry::instance().create("full", ctx_of(*m), nlohmann::json::object()));
  std::unique_ptr<Engine> e;
  at::Tensor got = trace(make(ctx_of(*m), {{"budget", 1.0}}), &e);
  // Same exact softmax, another summation order than full's kernel.
  EXPECT_LT(max_diff(got, ref), 1e-4);
  EXPECT_EQ(e->kv().counters().at("sketch_bytes"), 0);
  EXPECT_EQ(e->kv().counters().at("evicted_entries"), 0);
  EXPECT_EQ(e->kv().footprint().device_payload_bytes, 50 * m->config.kv_bytes_per_token(4));
}

TEST(KvReviverModel, RevivalBeatsPlainEvictionAndNarrowSketchesErrMore) {
  auto m = test::stories260k();
  at::Tensor ref =
      trace(MethodRegistry::instance().create("full", ctx_of(*m), nlohmann::json::object()));
  const double evict_only =
      max_diff(trace(make(ctx_of(*m), {{"budget", 0.25}, {"revive", false}})), ref);
  std::unique_ptr<Engine> wide_e, narrow_e;
  const double wide = max_diff(
      trace(make(ctx_of(*m), {{"budget", 0.25}, {"width", 512}, {"reconstruction", "sketch"}}),
            &wide_e),
      ref);
  const double narrow = max_diff(
      trace(make(ctx_of(*m), {{"budget", 0.25}, {"width", 4}, {"reconstruction", "sketch"}}),
            &narrow_e),
      ref);
  RecordProperty("max_logit_diff_evict_only", std::to_string(evict_only));
  RecordProperty("max_logit_diff_width512", std::to_string(wide));
  RecordProperty("max_logit_diff_width4", std::to_string(narrow));
  EXPECT_GT(evict_only, 1e-2);
  EXPECT_LT(wide, 0.5 * evict_only);
  EXPECT_LT(wide_e->kv().counters().at("recon_rel_err_k.at_eviction"),
            narrow_e->kv().counters().at("recon_rel_err_k.at_eviction"));
  EXPECT_LT(wide_e->kv().counters().at("recon_rel_err_v.at_eviction"),
            narrow_e->kv().counters().at("recon_rel_err_v.at_eviction"));
}

TEST(KvReviverModel, LedgerCountsExactEntriesSketchesAndIndices) {
  auto m = test::stories260k();
  EngineOptions eo;
  eo.prefill_chunk = 64;
  Engine e(m,
           make(ctx_of(*m),
                {{"budget", 0.25}, {"depth", 3}, {"width", 32}, {"reconstruction", "sketch"}}),
           eo);
  std::vector<int64_t> t = {1};
  for (int64_t i = 1; i < 255; ++i) t.push_back(3 + (i * 37 + i * i) % 500);
  int64_t s = e.new_sequence();
  e.prefill({s}, {t});
  Footprint f = e.kv().footprint();
  int64_t entries = 0, slack = 0, sketched_heads = 0;
  for (int l = 0; l < 5; ++l) {
    for (int64_t h = 0; h < 4; ++h) {
      const int64_t len = static_cast<int64_t>(rev(e.kv()).kept_indices(s, l, h).size());
      EXPECT_EQ(len, 63);  // floor(0.25 x 255)
      entries += len;
      slack += rev(e.kv()).capacity(s, l, h) - len;
      sketched_heads += rev(e.kv()).key_sketch(s, l, h).bytes() > 0;
    }
  }
  EXPECT_EQ(sketched_heads, 20);
  const int64_t sketch = 20 * 2 * 3 * 32 * 8 * 4;  // K and V, depth x width x head_dim fp32
  EXPECT_EQ(f.device_payload_bytes, entries * 64);
  EXPECT_EQ(f.device_metadata_bytes, entries * 4 + sketch);
  EXPECT_EQ(f.device_index_bytes, entries * 4 + 255 * 8);
  EXPECT_EQ(f.device_reserved_bytes, slack * (64 + 8));
  EXPECT_EQ(f.tokens_held, 63);
  EXPECT_EQ(f.logical_bytes, entries * 64);
  auto c = e.kv().counters();
  EXPECT_EQ(c.at("sketch_bytes"), sketch);
  EXPECT_EQ(c.at("sketched_entries"), 20 * (255 - 63));
  EXPECT_NEAR(c.at("kept_ratio"), 63.0 / 255.0, 1e-12);
  RecordProperty("physical_fraction_of_full",
                 std::to_string(static_cast<double>(f.physical_bytes()) /
                                (255.0 * m->config.kv_bytes_per_token(4))));
}

TEST(KvReviverModel, DeterministicAndSeeded) {
  auto m = test::stories260k();
  nlohmann::json p = {{"budget", 0.3}, {"width", 8}, {"reconstruction", "sketch"}};
  at::Tensor a = trace(make(ctx_of(*m), p));
  at::Tensor b = trace(make(ctx_of(*m), p));
  EXPECT_TRUE(at::equal(a, b));
  p["seed"] = 5;
  EXPECT_GT(max_diff(trace(make(ctx_of(*m), p)), a), 1e-4);
}

TEST(KvReviverModel, ForkCopiesExactRegionAndSketches) {
  auto m = test::stories260k();
  for (const char* mode : {"sketch", "merge"}) {
    Engine e(m, make(ctx_of(*m), {{"budget", 0.25}, {"reconstruction", mode}}));
    std::vector<int64_t> t = {1};
    for (int i = 1; i < 40; ++i) t.push_back(3 + (i * 37) % 500);
    int64_t a = e.new_sequence();
    e.prefill({a}, {t});
    int64_t b = e.fork(a);
    EXPECT_TRUE(at::equal(e.decode({a}, {300}), e.decode({b}, {300}))) << mode;
    EXPECT_GT(max_diff(e.decode({a}, {301}), e.decode({b}, {302})), 1e-3) << mode;
    EXPECT_EQ(rev(e.kv()).key_sketch(a, 2, 1).bytes(), rev(e.kv()).key_sketch(b, 2, 1).bytes());
    EXPECT_EQ(rev(e.kv()).buckets(a, 2, 1).bytes(), rev(e.kv()).buckets(b, 2, 1).bytes());
    EXPECT_EQ(rev(e.kv()).buckets(a, 2, 1).tokens(), rev(e.kv()).buckets(b, 2, 1).tokens());
    EXPECT_GT(std::string(mode) == "merge" ? rev(e.kv()).buckets(a, 2, 1).bytes()
                                           : rev(e.kv()).key_sketch(a, 2, 1).bytes(),
              0);
  }
}


TEST(KvReviverModel, MergeLedgerCountsBucketsByHand) {
  auto m = test::stories260k();
  for (bool pre_rope : {true, false}) {
    EngineOptions eo;
    eo.prefill_chunk = 64;
    Engine e(m, make(ctx_of(*m), {{"budget", 0.25}, {"width", 32}, {"keys_pre_rope", pre_rope}}),
             eo);
    std::vector<int64_t> t = {1};
    for (int64_t i = 1; i < 255; ++i) t.push_back(3 + (i * 37 + i * i) % 500);
    int64_t s = e.new_sequence();
    e.prefill({s}, {t});
    Footprint f = e.kv().footprint();
    int64_t entries = 0, slack = 0;
    for (int l = 0; l < 5; ++l) {
      for (int64_t h = 0; h < 4; ++h) {
        const int64_t len = static_cast<int64_t>(rev(e.kv()).kept_indices(s, l, h).size());
        EXPECT_EQ(len, 63);
        entries += len;
        slack += rev(e.kv()).capacity(s, l, h) - len;
        EXPECT_EQ(rev(e.kv()).buckets(s, l, h).used(), 32);
        EXPECT_EQ(rev(e.kv()).buckets(s, l, h).tokens(), 255 - 63);
        EXPECT_EQ(rev(e.kv()).key_sketch(s, l, h).bytes(), 0);
      }
    }
    // Per head: 32 buckets x (K and V sums, 8 fp32 each, + int32 count [+ int64 position sum]).
    const int64_t buckets = 20 * 32 * (2 * 8 * 4 + 4 + (pre_rope ? 8 : 0));
    EXPECT_EQ(f.device_payload_bytes, entries * 64);
    EXPECT_EQ(f.device_metadata_bytes, entries * 4 + buckets);
    EXPECT_EQ(f.device_index_bytes, entries * 4 + 255 * 8);
    EXPECT_EQ(f.device_reserved_bytes, slack * (64 + 8));
    EXPECT_EQ(f.tokens_held, 63);
    auto c = e.kv().counters();
    EXPECT_EQ(c.at("merge.bucket_bytes"), buckets);
    EXPECT_EQ(c.at("sketch_bytes"), 0);
    EXPECT_EQ(c.at("merged_entries"), 20 * (255 - 63));
    EXPECT_EQ(c.at("merge.buckets_used"), 32);
    EXPECT_EQ(c.at("merge.tokens_per_bucket"), 6.0);
    EXPECT_LT(f.physical_bytes(), 255 * m->config.kv_bytes_per_token(4));
    RecordProperty(std::string("physical_fraction_of_full_pre_rope_") + (pre_rope ? "1" : "0"),
                   std::to_string(static_cast<double>(f.physical_bytes()) /
                                  (255.0 * m->config.kv_bytes_per_token(4))));
  }
}

TEST(KvReviverModel, MergeIsDeterministicSeedFreeAndBeatsTheSketchAtTheDefaults) {
  auto m = test::stories260k();
  at::Tensor ref =
      trace(MethodRegistry::instance().create("full", ctx_of(*m), nlohmann::json::object()));
  at::Tensor a = trace(make(ctx_of(*m)));
  EXPECT_TRUE(at::equal(a, trace(make(ctx_of(*m)))));
  EXPECT_TRUE(at::equal(a, trace(make(ctx_of(*m), {{"seed", 5}}))));  // no hashing in merge mode
  const double merge = max_diff(a, ref);
  const double sketch = max_diff(trace(make(ctx_of(*m), {{"reconstruction", "sketch"}})), ref);
  RecordProperty("max_logit_diff_merge_default", std::to_string(merge));
  RecordProperty("max_logit_diff_sketch_default", std::to_string(sketch));
  EXPECT_GT(merge, 1e-3);  // something was merged
  EXPECT_LT(merge, sketch);
}

// ---------------------------------------------------------------- the exact region's codec

TEST(KvReviverCodec, Fp16HalvesTheExactPayloadAndKeepsTheLogitsClose) {
  auto m = test::stories260k();
  std::unique_ptr<Engine> e32, e16;
  at::Tensor a = trace(make(ctx_of(*m), {{"budget", 1.0}}), &e32);
  at::Tensor b = trace(make(ctx_of(*m), {{"budget", 1.0}, {"codec", "fp16"}}), &e16);
  EXPECT_LT(max_diff(a, b), 0.05);
  EXPECT_GT(max_diff(a, b), 0.0);  // the fp16 rounding is really applied
  const Footprint f32 = e32->kv().footprint(), f16 = e16->kv().footprint();
  EXPECT_EQ(f32.device_payload_bytes, 50 * 1280);
  EXPECT_EQ(f16.device_payload_bytes, 50 * 640);
  EXPECT_EQ(f16.device_metadata_bytes, f32.device_metadata_bytes);  // scores only
  EXPECT_EQ(f16.logical_bytes, f32.logical_bytes);
  EXPECT_EQ(f16.tokens_held, 50);
}

TEST(KvReviverCodec, EvictionOnlyEqualsH2OWithTheSameCodec) {
  // revive=false is H2O's rule (recent half + heavy hitters by summed attention, keys post-RoPE);
  // both hold a decode step's rows exact until its end and then encode what is kept. The prompt
  // is one chunk here: the eviction store holds all prompt rows exact until the end of prefill,
  // kvreviver encodes after every chunk (its eviction runs per chunk; with 7-token chunks the two
  // differ by the later chunks attending the earlier ones encoded).
  auto m = test::stories260k();
  for (const char* codec : {"none", "kivi-2", "pertoken-4"}) {
    nlohmann::json codec_p = {{"budget", 0.25}, {"codec", codec}, {"codec_residual", 0}};
    auto rp = codec_p;
    rp["revive"] = false;
    auto hp = codec_p;
    hp["position_mode"] = "absolute";
    at::Tensor a = trace(make(ctx_of(*m), rp), nullptr, 64);
    at::Tensor b = trace(MethodRegistry::instance().create("h2o", ctx_of(*m), hp), nullptr, 64);
    EXPECT_LT(max_diff(a, b), 1e-4) << codec;
    if (std::string(codec) == "none") continue;
    nlohmann::json plain = {{"budget", 0.25}, {"revive", false}};
    EXPECT_GT(max_diff(a, trace(make(ctx_of(*m), plain), nullptr, 64)), 1e-3)
        << codec << ": the codec is applied";
  }
}

TEST(KvReviverCodec, Kivi2ExactRegionStoresLessRevivalStillHelpsAndForksStayApart) {
  auto m = test::stories260k();
  at::Tensor ref =
      trace(MethodRegistry::instance().create("full", ctx_of(*m), nlohmann::json::object()));
  nlohmann::json p = {{"budget", 0.25}, {"codec", "kivi-2"}, {"codec_residual", 0}};
  const double revived = max_diff(trace(make(ctx_of(*m), p)), ref);
  auto ev = p;
  ev["revive"] = false;
  const double evicted = max_diff(trace(make(ctx_of(*m), ev)), ref);
  RecordProperty("max_logit_diff_kivi2_merge", std::to_string(revived));
  RecordProperty("max_logit_diff_kivi2_evict_only", std::to_string(evicted));
  EXPECT_LT(revived, evicted);

  EngineOptions eo;
  eo.prefill_chunk = 64;
  Engine e(m, make(ctx_of(*m), p), eo);
  Engine e32(m, make(ctx_of(*m), {{"budget", 0.25}}), eo);
  std::vector<int64_t> t = {1};
  for (int64_t i = 1; i < 255; ++i) t.push_back(3 + (i * 37 + i * i) % 500);
  int64_t s = e.new_sequence();
  e.prefill({s}, {t});
  e32.prefill({e32.new_sequence()}, {t});
  const Footprint f = e.kv().footprint(), f32 = e32.kv().footprint();
  EXPECT_EQ(f.tokens_held, 63);
  EXPECT_EQ(f.logical_bytes, f32.logical_bytes);
  // 2-bit codes + fp16 scale/min per group: well under a third of the fp32 exact payload.
  EXPECT_LT(static_cast<double>(f.device_payload_bytes), 0.2 * f32.device_payload_bytes);
  EXPECT_GT(f.device_metadata_bytes, f32.device_metadata_bytes);  // + the codec's scales
  EXPECT_LT(f.physical_bytes(), f32.physical_bytes());
  for (int l = 0; l < 5; ++l)  // the buckets are the same size (fp32 sums), only the exact rows shrink
    for (int64_t h = 0; h < 4; ++h) EXPECT_EQ(rev(e.kv()).buckets(s, l, h).tokens(), 255 - 63);
  const auto c = e.kv().counters();
  EXPECT_TRUE(std::any_of(c.begin(), c.end(),
                          [](const auto& kv) { return kv.first.rfind("codec.", 0) == 0; }));

  int64_t b = e.fork(s);
  at::Tensor la = e.decode({s}, {300});
  EXPECT_TRUE(at::equal(la, e.decode({b}, {300})));
  EXPECT_TRUE(la.isfinite().all().item<bool>());
  EXPECT_GT(max_diff(e.decode({s}, {301}), e.decode({b}, {302})), 1e-3);
  // Truncation drops exact entries from the codec's streams too.
  e.kv().truncate(s, 200);
  EXPECT_EQ(e.kv().seq_len(s), 200);
  EXPECT_TRUE(e.decode({s}, {300}).isfinite().all().item<bool>());
}

}  // namespace
}  // namespace kvb
