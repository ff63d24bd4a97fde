// quest (methods/quest): the page bound and the page selection on hand-made numbers, page min/max
// bookkeeping, decode attention over exactly the selected pages (CPU kernel path and LibTorch path
// against an independent LibTorch reference), keep-everything = full logits bit for bit, the read
// counters and the ledger against hand-computed values, determinism.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "methods/quest/quest.h"
#include "tests/methods/cache_driver.h"
#include "tests/methods/method_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::rnd;
using test::tiny;

CacheContext ctx_of(const Model& m) { return CacheContext{m.config, m.device, m.dtype}; }

std::unique_ptr<KvCache> make(const CacheContext& ctx, const std::string& name,
                              nlohmann::json params = nlohmann::json::object()) {
  return MethodRegistry::instance().create(name, ctx, params);
}

QuestKvCache& as_quest(KvCache& kv) { return dynamic_cast<QuestKvCache&>(kv); }

// Drives a cache by hand (tests/methods/cache_driver.h) and reports the last layer's output: the
// first skip_layers layers attend densely.
test::Driver last_layer_driver(KvCache* kv, int64_t n_layers) {
  test::Driver d{kv, n_layers};
  d.output_layer = -1;
  return d;
}

// Prefill a 40-token prompt in chunks of 7, then decode 10 tokens; every logit row.
at::Tensor trace(std::unique_ptr<KvCache> kv, KvCache** keep = nullptr,
                 std::unique_ptr<Engine>* engine = nullptr) {
  EngineOptions o;
  o.prefill_chunk = 7;
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
  if (keep) *keep = &e->kv();
  if (engine) *engine = std::move(e);
  return at::cat(rows);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// ---------------------------------------------------------------- hand-made numbers

TEST(QuestSelect, UpperBoundTakesTheBetterCornerPerChannelAndBoundsEveryKey) {
  const float q[2] = {1.f, -2.f}, mn[2] = {0.f, -1.f}, mx[2] = {3.f, 2.f};
  EXPECT_FLOAT_EQ(quest::page_upper_bound(q, mn, mx, 2), 3.f + 2.f);  // max(0, 3) + max(2, -4)
  const float q2[3] = {-1.f, 0.f, 0.5f}, mn2[3] = {-2.f, 5.f, -4.f}, mx2[3] = {1.f, 6.f, -3.f};
  EXPECT_FLOAT_EQ(quest::page_upper_bound(q2, mn2, mx2, 3), 2.f + 0.f - 1.5f);
  // On random pages the bound is >= q . k for every key of the page, and tight per channel.
  for (uint32_t seed = 0; seed < 20; ++seed) {
    at::Tensor keys = rnd({16, 8}, 100 + seed), qq = rnd({8}, 200 + seed);
    at::Tensor lo = std::get<0>(keys.min(0)).contiguous(),
               hi = std::get<0>(keys.max(0)).contiguous();
    const float u = quest::page_upper_bound(qq.data_ptr<float>(), lo.data_ptr<float>(),
                                            hi.data_ptr<float>(), 8);
    EXPECT_GE(u + 1e-5, keys.matmul(qq).max().item<float>()) << seed;
    EXPECT_NEAR(u, at::maximum(qq * lo, qq * hi).sum().item<float>(), 1e-5);
  }
}

TEST(QuestSelect, ReadsTheCurrentPageAndTheBestOthers) {
  const std::vector<float> s = {5, 1, 9, 3, 2};
  EXPECT_EQ(quest::select_pages(s.data(), 5, 3, false), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(quest::select_pages(s.data(), 5, 1, false), (std::vector<int64_t>{4}));
  EXPECT_EQ(quest::select_pages(s.data(), 5, 5, false), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(quest::select_pages(s.data(), 5, 9, false), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const std::vector<float> t = {0, 1, 9, 3, 2};
  EXPECT_EQ(quest::select_pages(t.data(), 5, 3, false), (std::vector<int64_t>{2, 3, 4}));
  // keep_first: page 0 whatever its score; the current page even with the lowest score.
  EXPECT_EQ(quest::select_pages(t.data(), 5, 3, true), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(quest::select_pages(t.data(), 5, 1, true), (std::vector<int64_t>{0, 4}));
  const std::vector<float> low_last = {4, 3, 2, -100};
  EXPECT_EQ(quest::select_pages(low_last.data(), 4, 2, false), (std::vector<int64_t>{0, 3}));
  // Ties go to the lower page.
  const std::vector<float> tie = {1, 1, 1, 0};
  EXPECT_EQ(quest::select_pages(tie.data(), 4, 2, false), (std::vector<int64_t>{0, 3}));
}

TEST(QuestSelect, BudgetInTokensBecomesWholePages) {
  EXPECT_EQ(quest::pages_for_budget(64, 100, 16), 4);
  EXPECT_EQ(quest::pages_for_budget(63, 100, 16), 3);
  EXPECT_EQ(quest::pages_for_budget(10, 100, 16), 1);   // never below one page
  EXPECT_EQ(quest::pages_for_budget(100, 100, 16), 7);  // budget covers everything: every page
  EXPECT_EQ(quest::pages_for_budget(500, 100, 16), 7);
  EXPECT_EQ(quest::pages_for_budget(99, 100, 16), 6);
}

// ---------------------------------------------------------------- the store, driven by hand

TEST(QuestStore, PageBoundsTrackTheKeysAcrossChunksAndTruncation) {
  ModelConfig c = tiny(2, 4, 2, 4);
  auto kv = make({c, c10::kCPU, c10::kFloat}, "quest", {{"page_size", 4}});
  test::Driver d = last_layer_driver(kv.get(), 2);
  at::Tensor k = rnd({10, 2, 4}, 1);
  for (int64_t s = 0; s < 10; s += 3) {
    const int64_t n = std::min<int64_t>(3, 10 - s);
    d.step(rnd({n, 4, 4}, 10 + s), k.narrow(0, s, n), rnd({n, 2, 4}, 20 + s), Phase::kPrefill);
  }
  QuestKvCache& qc = as_quest(*kv);
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = 0; p < 3; ++p) {
      at::Tensor rows = k.narrow(0, 4 * p, std::min<int64_t>(4, 10 - 4 * p));
      EXPECT_TRUE(at::equal(qc.page_min(0, layer, p), std::get<0>(rows.min(0)))) << p;
      EXPECT_TRUE(at::equal(qc.page_max(0, layer, p), std::get<0>(rows.max(0)))) << p;
    }
  }
  EXPECT_THROW(qc.page_min(0, 0, 3), kvb::Error);
  kv->truncate(0, 6);  // page 1 keeps tokens 4 and 5 only
  EXPECT_TRUE(at::equal(qc.page_max(0, 1, 1), std::get<0>(k.narrow(0, 4, 2).max(0))));
  EXPECT_TRUE(at::equal(qc.page_min(0, 1, 1), std::get<0>(k.narrow(0, 4, 2).min(0))));
  EXPECT_EQ(kv->seq_len(0), 6);
  EXPECT_THROW(kv->truncate(0, 7), kvb::Error);
}

// The Quest rule computed independently with LibTorch ops for one decode query q [Hq, D] over
// keys/values [n, Hkv, D]: per query head the page bounds, aggregated over the group, top pages,
// softmax over the selected tokens.
at::Tensor quest_reference(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V,
                           int64_t ps, int64_t k_pages, const std::string& agg, bool keep_first,
                           std::vector<std::vector<int64_t>>* pages_out) {
  const int64_t n = K.size(0), Hkv = K.size(1), Hq = q.size(0), G = Hq / Hkv, D = q.size(1);
  const int64_t P = (n + ps - 1) / ps;
  at::Tensor out = at::zeros({Hq, D});
  pages_out->clear();
  for (int64_t h = 0; h < Hkv; ++h) {
    std::vector<float> score(static_cast<size_t>(P));
    for (int64_t p = 0; p < P; ++p) {
      at::Tensor rows = K.narrow(0, p * ps, std::min(ps, n - p * ps)).select(1, h);
      at::Tensor lo = std::get<0>(rows.min(0)), hi = std::get<0>(rows.max(0));
      at::Tensor u = at::maximum(q.narrow(0, h * G, G) * lo, q.narrow(0, h * G, G) * hi).sum(1);
      score[p] = agg == "max" ? u.max().item<float>() : u.mean().item<float>();
    }
    std::vector<int64_t> chosen = {P - 1};
    if (keep_first && P > 1) chosen.push_back(0);
    while (static_cast<int64_t>(chosen.size()) < std::min(k_pages, P)) {
      int64_t best = -1;
      for (int64_t p = 0; p < P; ++p) {
        if (std::find(chosen.begin(), chosen.end(), p) != chosen.end()) continue;
        if (best < 0 || score[p] > score[best]) best = p;
      }
      chosen.push_back(best);
    }
    std::sort(chosen.begin(), chosen.end());
    pages_out->push_back(chosen);
    std::vector<int64_t> tok;
    for (int64_t p : chosen)
      for (int64_t t = p * ps; t < std::min(n, (p + 1) * ps); ++t) tok.push_back(t);
    at::Tensor idx = at::tensor(tok, at::kLong);
    at::Tensor Ks = K.select(1, h).index_select(0, idx), Vs = V.select(1, h).index_select(0, idx);
    for (int64_t g = 0; g < G; ++g) {
      at::Tensor pr = at::softmax(Ks.matmul(q[h * G + g]) / std::sqrt(static_cast<double>(D)), 0);
      out[h * G + g] = pr.matmul(Vs);
    }
  }
  return out;
}

TEST(QuestStore, DecodeAttendsExactlyOverTheSelectedPages) {
  ModelConfig c = tiny(3, 4, 2, 4);
  int checked_sparse = 0, differing_heads = 0;
  for (bool generic : {false, true}) {
    for (const char* agg : {"max", "mean"}) {
      for (bool first : {false, true}) {
        QuestKvCache::Options o;
        o.budget = Budget{8, BudgetUnit::kTokensPerHead};
        o.page_size = 4;
        o.skip_layers = 1;
        o.keep_first_page = first;
        o.gqa_agg = std::string(agg) == "max" ? GqaAgg::kMax : GqaAgg::kMean;
        o.force_generic = generic;
        auto kv = std::make_unique<QuestKvCache>(CacheContext{c, c10::kCPU, c10::kFloat}, o);
        test::Driver d = last_layer_driver(kv.get(), 3);
        at::Tensor K = rnd({30, 2, 4}, 7) * 2, V = rnd({30, 2, 4}, 8);
        d.step(rnd({22, 4, 4}, 9), K.narrow(0, 0, 22), V.narrow(0, 0, 22), Phase::kPrefill);
        for (int64_t t = 22; t < 30; ++t) {
          at::Tensor q = rnd({1, 4, 4}, 50 + t) * 2;
          at::Tensor out = d.step(q, K.narrow(0, t, 1), V.narrow(0, t, 1), Phase::kDecode);
          std::vector<std::vector<int64_t>> pages;
          at::Tensor want = quest_reference(q[0], K.narrow(0, 0, t + 1), V.narrow(0, 0, t + 1), 4,
                                            2, agg, first, &pages);
          EXPECT_LT(max_diff(out[0], want), 1e-5) << agg << first << generic << " t " << t;
          for (int64_t h = 0; h < 2; ++h) {
            EXPECT_EQ(as_quest(*kv).last_pages(0, 2, h), pages[h]) << t << "/" << h;
            EXPECT_TRUE(as_quest(*kv).last_pages(0, 0, h).empty());  // skipped layer: dense
          }
          checked_sparse += static_cast<int>(pages[0].size()) < (t + 4) / 4;
          differing_heads += pages[0] != pages[1];
        }
      }
    }
  }
  EXPECT_GT(checked_sparse, 40);
  EXPECT_GT(differing_heads, 0);  // one page set per KV head
}

// ---------------------------------------------------------------- stories260K

TEST(QuestModel, KeepEverythingBudgetReproducesFullLogitsBitForBit) {
  auto m = test::stories260k();
  at::Tensor ref = trace(make(ctx_of(*m), "full"));
  for (nlohmann::json p : {nlohmann::json{{"budget", 1.0}},
                           nlohmann::json{{"budget", 1.0}, {"skip_layers", 0}, {"page_size", 1}},
                           nlohmann::json{{"budget", 50},
                                          {"budget_unit", "tokens_per_head"},
                                          {"skip_layers", 0},
                                          {"keep_first_page", true}}}) {
    at::Tensor got = trace(make(ctx_of(*m), "quest", p));
    EXPECT_TRUE(at::equal(got, ref)) << p.dump() << " max diff " << max_diff(got, ref);
  }
}

TEST(QuestModel, SmallBudgetChangesTheDecodeLogitsOnly) {
  auto m = test::stories260k();
  at::Tensor ref = trace(make(ctx_of(*m), "full"));
  at::Tensor got = trace(make(
      ctx_of(*m), "quest",
      {{"budget", 8}, {"budget_unit", "tokens_per_head"}, {"page_size", 4}, {"skip_layers", 0}}));
  // Prefill rows (40) are exact; decode rows read 2 of 11..13 pages.
  EXPECT_TRUE(at::equal(got.narrow(0, 0, 40), ref.narrow(0, 0, 40)));
  EXPECT_GT(max_diff(got.narrow(0, 40, 10), ref.narrow(0, 40, 10)), 1e-3);
}

TEST(QuestModel, ReadCountersMatchHandCountedPages) {
  auto m = test::stories260k();
  KvCache* kv = nullptr;
  std::unique_ptr<Engine> e;
  trace(make(ctx_of(*m), "quest",
             {{"budget", 16}, {"budget_unit", "tokens_per_head"}, {"page_size", 8}}),
        &kv, &e);
  // Decode step j (0..9) sees 41 + j tokens: the current page (tokens 40.. or 48..) plus one
  // full other page: 9 + j tokens for j < 8, then 9 and 10. Layers 2..4 select, 0..1 read all.
  const double sel = 119, vis = 455;  // sum over the 10 steps, per layer and KV head
  auto c = kv->counters();
  EXPECT_EQ(c.at("decode_head_reads"), 10 * 5 * 4);
  EXPECT_NEAR(c.at("read_fraction.selected_layers"), sel / vis, 1e-12);
  EXPECT_NEAR(c.at("read_tokens_per_head_step.selected_layers"), sel / 10, 1e-12);
  EXPECT_NEAR(c.at("pages_read_per_head_step.selected_layers"), 2.0, 1e-12);
  EXPECT_NEAR(c.at("read_fraction"), (3 * sel + 2 * vis) / (5 * vis), 1e-12);
  EXPECT_NEAR(c.at("read_tokens_per_head_step"), (3 * sel + 2 * vis) / 50, 1e-12);
  EXPECT_NEAR(c.at("sparse_read_share.selected_layers"), 1.0, 1e-12);
  // Bytes: selected K/V rows + every page's bounds in the selected layers, vs a dense read.
  const double pages = 8 * 6 + 2 * 7;  // pages scored per step, summed
  EXPECT_NEAR(c.at("read_bytes_fraction"), (3 * (sel + pages) + 2 * vis) / (5 * vis), 1e-12);
  EXPECT_EQ(c.at("setting.page_size"), 8);
  EXPECT_EQ(c.at("setting.skip_layers"), 2);
}

TEST(QuestModel, LedgerHoldsTheFullKvPlusPageBounds) {
  auto m = test::stories260k();
  const auto& cfg = m->config;
  const int64_t per_token = cfg.kv_bytes_per_token(4);  // 5 layers x 4 heads x 2 x 8 x 4 = 1280
  ASSERT_EQ(per_token, 1280);
  for (int64_t ps : {16, 5}) {
    EngineOptions eo;
    eo.prefill_chunk = 64;
    Engine e(m, make(ctx_of(*m), "quest", {{"budget", 0.25}, {"page_size", ps}}), eo);
    std::vector<int64_t> t(40, 300);
    t[0] = 1;
    int64_t s = e.new_sequence();
    e.prefill({s}, {t});
    for (int i = 0; i < 3; ++i) e.decode({s}, {301 + i});
    Footprint f = e.kv().footprint();
    const int64_t pages = (43 + ps - 1) / ps, cap = as_quest(e.kv()).capacity(s);
    const int64_t per_page = 5 * 4 * 2 * 8 * 4;  // min + max, every layer and KV head, fp32
    EXPECT_EQ(cap % ps, 0);
    EXPECT_EQ(f.device_payload_bytes, 43 * per_token) << ps;
    EXPECT_EQ(f.device_metadata_bytes, pages * per_page) << ps;
    EXPECT_EQ(f.device_index_bytes, 0);
    EXPECT_EQ(f.device_reserved_bytes, (cap - 43) * per_token + (cap / ps - pages) * per_page);
    EXPECT_EQ(f.tokens_held, 43);
    EXPECT_EQ(f.logical_bytes, 43 * per_token);
    // A page's bounds are 2 key rows: 2 / 16 of the keys of a 16-token page (Quest's 12.5%).
    EXPECT_EQ(per_page * 16, 2 * (16 * per_token / 2));
  }
}

TEST(QuestModel, DeterministicAndTheLibTorchPathAgrees) {
  auto m = test::stories260k();
  nlohmann::json p = {{"budget", 0.3}, {"page_size", 4}, {"skip_layers", 1}};
  at::Tensor a = trace(make(ctx_of(*m), "quest", p));
  at::Tensor b = trace(make(ctx_of(*m), "quest", p));
  EXPECT_TRUE(at::equal(a, b));
  QuestKvCache::Options o;
  o.budget = Budget{0.3, BudgetUnit::kRatio};
  o.page_size = 4;
  o.skip_layers = 1;
  o.force_generic = true;
  KvCache* gk = nullptr;
  KvCache* fk = nullptr;
  std::unique_ptr<Engine> ge, fe;
  at::Tensor g = trace(std::make_unique<QuestKvCache>(ctx_of(*m), o), &gk, &ge);
  at::Tensor f = trace(make(ctx_of(*m), "quest", p), &fk, &fe);
  EXPECT_LT(max_diff(g, a), 1e-4);
  EXPECT_EQ(gk->counters(), fk->counters());
}

TEST(QuestModel, ForkedSequencesAreIndependent) {
  auto m = test::stories260k();
  Engine e(m, make(ctx_of(*m), "quest", {{"budget", 0.25}, {"page_size", 4}}));
  std::vector<int64_t> t = {1};
  for (int i = 1; i < 30; ++i) t.push_back(3 + (i * 37) % 500);
  int64_t a = e.new_sequence();
  e.prefill({a}, {t});
  int64_t b = e.fork(a);
  at::Tensor la = e.decode({a}, {300});
  at::Tensor lb = e.decode({b}, {300});
  EXPECT_TRUE(at::equal(la, lb));
  at::Tensor la2 = e.decode({a}, {301});
  at::Tensor lb2 = e.decode({b}, {302});
  EXPECT_GT(max_diff(la2, lb2), 1e-3);
  EXPECT_EQ(e.kv().footprint().tokens_held, 64);
}

// Quest x codec: the rows live in CodecStreams (fp16 halves the payload exactly; kivi-2 stores far
// less), page bounds still come from the exact keys, and forks stay independent.
TEST(QuestCodec, Fp16HalvesThePayloadAndKeepsTheLogitsClose) {
  auto m = test::stories260k();
  nlohmann::json p = {{"budget", 0.3}, {"page_size", 4}, {"skip_layers", 1}};
  KvCache* k0 = nullptr;
  KvCache* k1 = nullptr;
  std::unique_ptr<Engine> e0, e1;
  at::Tensor a = trace(make(ctx_of(*m), "quest", p), &k0, &e0);
  auto p16 = p;
  p16["codec"] = "fp16";
  at::Tensor b = trace(make(ctx_of(*m), "quest", p16), &k1, &e1);
  EXPECT_LT(max_diff(a, b), 0.05);
  EXPECT_GT(max_diff(a, b), 0.0);  // fp16 rounding is really applied
  const Footprint f0 = k0->footprint(), f1 = k1->footprint();
  EXPECT_EQ(f1.tokens_held, 50);
  EXPECT_EQ(f0.device_payload_bytes, 50 * 1280);
  EXPECT_EQ(f1.device_payload_bytes, 50 * 640);
  EXPECT_EQ(f1.device_metadata_bytes, f0.device_metadata_bytes);  // page bounds only
  EXPECT_EQ(f1.logical_bytes, f0.logical_bytes);
  const auto c1 = k1->counters();
  EXPECT_TRUE(std::any_of(c1.begin(), c1.end(), [](const auto& kv) { return kv.first.rfind("codec.", 0) == 0; }))
      << "the codec's figures are in the counters";
}

TEST(QuestCodec, ReadingEverythingEqualsTheEvictionStoreWithTheSameCodec) {
  // Both keep post-RoPE keys (StreamingLLM in absolute mode), hold prompt rows exact until the end
  // of prefill and a step's own rows exact while it attends: the same codec gives the same logits.
  auto m = test::stories260k();
  for (const char* codec : {"kivi-2", "pertoken-4"}) {
    at::Tensor a = trace(make(ctx_of(*m), "quest",
                              {{"budget", 1.0}, {"codec", codec}, {"codec_residual", 32}}));
    at::Tensor b = trace(make(ctx_of(*m), "streaming_llm",
                              {{"budget", 1.0}, {"position_mode", "absolute"}, {"codec", codec},
                               {"codec_residual", 32}}));
    EXPECT_LT(max_diff(a, b), 1e-4) << codec;
    EXPECT_GT(max_diff(a, trace(make(ctx_of(*m), "full"))), 1e-3) << codec << ": the codec is applied";
  }
}

TEST(QuestCodec, Kivi2StoresUnderAThirdAndForksStayIndependent) {
  auto m = test::stories260k();
  Engine e(m, make(ctx_of(*m), "quest",
                   {{"budget", 0.25}, {"page_size", 4}, {"codec", "kivi-2"}, {"codec_residual", 32}}));
  std::vector<int64_t> t = {1};
  for (int i = 1; i < 200; ++i) t.push_back(3 + (i * 37) % 500);
  int64_t a = e.new_sequence();
  e.prefill({a}, {t});
  const Footprint f = e.kv().footprint();
  EXPECT_EQ(f.tokens_held, 200);
  EXPECT_LT(static_cast<double>(f.device_payload_bytes + f.device_metadata_bytes -
                                (50 * 5 * 4 * 2 * 8 * 4)),  // less the page bounds (fp32)
            0.35 * 200 * 1280);
  int64_t b = e.fork(a);
  at::Tensor la = e.decode({a}, {300});
  at::Tensor lb = e.decode({b}, {300});
  EXPECT_TRUE(at::equal(la, lb));
  EXPECT_TRUE(la.isfinite().all().item<bool>());
  at::Tensor la2 = e.decode({a}, {301});
  at::Tensor lb2 = e.decode({b}, {302});
  EXPECT_GT(max_diff(la2, lb2), 1e-3);
  EXPECT_EQ(e.kv().footprint().tokens_held, 404);
  // The codec store runs on the CPU fp32 path only: the LibTorch path refuses it by name.
  QuestKvCache::Options o;
  o.force_generic = true;
  o.codec = make_plain_codec(RowDtype::kF16);
  EXPECT_THROW(QuestKvCache(ctx_of(*m), o), Error);
}

}  // namespace
}  // namespace kvb
