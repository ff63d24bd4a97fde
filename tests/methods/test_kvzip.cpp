// kvzip on kvb-testbed: the kept sets are those of a direct computation of the reconstruction
// attention (kvpress's repeat prompts, its key subset, max over queries and the GQA group, sinks
// first, one ranking over the whole cache), the reconstruction leaves no KV behind and evicted
// entries free memory, its prefilled tokens are counted, and protocols that cannot run the pass
// refuse the method before anything runs.

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/run_config.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/context_pass.h"
#include "methods/common/evicting_kv_cache.h"
#include "tests/methods/calibrated_test_util.h"

namespace kvb {
namespace {

const char* kText =
    "The lighthouse keeper wrote the passkey 48213 on a card and hid it under the blue stone. "
    "Every evening the boats came home, and the keeper counted them twice before sleeping.";

struct Prepared {
  std::vector<int64_t> context;               // BOS + text
  std::vector<std::vector<int64_t>> repeats;  // one reconstruction prompt per chunk
  std::vector<std::pair<int64_t, int64_t>> chunks;
};

// kvpress's reconstruction prompts, rebuilt here from its description so that the store's are
// checked against them.
Prepared prepare(const Tokenizer& tok, int64_t chunk) {
  Prepared p;
  p.context = {1};
  const std::vector<int64_t> body = tok.encode(kText);
  p.context.insert(p.context.end(), body.begin(), body.end());
  const int64_t n = static_cast<int64_t>(p.context.size());
  const auto first = tok.encode("\n\nRepeat the previous context exactly.");
  const auto later =
      tok.encode("\n\nRepeat the part of the previous context exactly, starting with");
  const auto close = tok.encode("\n");
  for (int64_t s = 1; s < n; s += chunk) {
    const int64_t e = std::min(n, s + chunk);
    std::vector<int64_t> ids = s == 1 ? first : later;
    if (s > 1) ids.insert(ids.end(), p.context.begin() + (s - 8), p.context.begin() + s);
    ids.insert(ids.end(), close.begin(), close.end());
    ids.insert(ids.end(), p.context.begin() + s, p.context.begin() + e);
    p.repeats.push_back(ids);
    p.chunks.push_back({s, e});
  }
  return p;
}

ContextPass pass_for(Engine& e, int64_t seq, const Prepared& p, const Tokenizer& tok) {
  ContextPass pass;
  pass.engine = &e;
  pass.seq = seq;
  pass.context = p.context;
  pass.prefix_tokens = 1;
  pass.turn_close = tok.encode("\n");
  pass.encode = [&tok](const std::string& s) { return tok.encode(s); };
  return pass;
}

// Scores [layer][kv head][token] computed directly from the queries, keys and values the model
// produces with the full cache. plus (KVzip+): each weight divided by the norm of the attention's
// input row (RMSNorm of the residual stream, times the norm weight) and multiplied by the norm of
// the entry's value through its query head's slice of W_O.
std::vector<std::vector<std::vector<double>>> direct_scores(const std::shared_ptr<Model>& m,
                                                            const Prepared& p, int64_t n_sink,
                                                            bool plus = false) {
  const ModelConfig& c = m->config;
  auto owned = std::make_unique<test::LayerCapture>(make_default_kv(*m), c.n_layers);
  test::LayerCapture* cap = owned.get();
  Engine e(m, std::move(owned));
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {p.context}, nullptr, false);
  for (const auto& ids : p.repeats) {
    const int64_t f = e.fork(seq);
    e.prefill({f}, {ids}, nullptr, false);
    e.release(f);
  }
  const int64_t n = static_cast<int64_t>(p.context.size()), G = c.n_heads / c.n_kv_heads;
  const int64_t D = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<std::vector<std::vector<double>>> out(
      c.n_layers, std::vector<std::vector<double>>(c.n_kv_heads, std::vector<double>(n, 0.0)));
  for (int l = 0; l < c.n_layers; ++l) {
    const at::Tensor K = cap->k(l), Q = cap->q(l), V = cap->v(l), X = cap->x(l);
    const at::Tensor w_norm = m->weights.layers[l].attn_norm.to(at::kDouble);
    const at::Tensor wo = m->weights.layers[l].wo.to(at::kDouble);  // [dim, Hq * D]
    int64_t row = n;
    for (size_t ci = 0; ci < p.repeats.size(); ++ci) {
      const auto [s, en] = p.chunks[ci];
      const int64_t r = static_cast<int64_t>(p.repeats[ci].size());
      std::vector<int64_t> cols;  // sinks, the chunk, the repeat itself
      for (int64_t t = 0; t < std::min(n_sink, s); ++t) cols.push_back(t);
      for (int64_t t = s; t < en; ++t) cols.push_back(t);
      for (int64_t t = 0; t < r; ++t) cols.push_back(row + t);
      const at::Tensor keys = K.index_select(0, at::tensor(cols, at::kLong));  // [m, Hkv, D]
      const int64_t m0 = static_cast<int64_t>(cols.size()) - r;
      for (int64_t h = 0; h < c.n_kv_heads; ++h)
        for (int64_t g = 0; g < G; ++g) {
          std::vector<double> value_scale(static_cast<size_t>(m0), 1.0);  // per column
          if (plus)
            for (int64_t j = 0; j < m0; ++j)
              value_scale[j] =
                  wo.narrow(1, (h * G + g) * D, D).matmul(V[cols[j]][h]).norm().item<double>();
          for (int64_t i = 0; i < r; ++i) {
            const at::Tensor q = Q[row + i][h * G + g];
            const at::Tensor lg = (keys.select(1, h).matmul(q) * scale).narrow(0, 0, m0 + i + 1);
            const at::Tensor w = at::softmax(lg, 0);
            double row_scale = 1.0;
            if (plus) {
              const at::Tensor x = X[row + i];
              const at::Tensor normed = x / (x.pow(2).mean() + c.norm_eps).sqrt() * w_norm;
              row_scale = 1.0 / normed.norm().item<double>();
            }
            for (int64_t j = 0; j < m0; ++j) {
              const int64_t t = cols[j];
              if (t < s) continue;  // a sink: only in the denominator
              out[l][h][t] =
                  std::max(out[l][h][t], w[j].item<double>() * row_scale * value_scale[j]);
            }
          }
        }
      row += r;
    }
  }
  return out;
}

// The kept sets a direct computation gives: sinks first, then one ranking over every layer and
// head (ties: earlier layer, head, token), `per_head x heads x layers` entries in all.
std::vector<std::vector<std::vector<int32_t>>> expected_kept(
    const ModelConfig& c, std::vector<std::vector<std::vector<double>>> score, int64_t n_sink,
    int64_t per_head) {
  const int64_t n = static_cast<int64_t>(score[0][0].size());
  double top = 0;
  for (auto& l : score)
    for (auto& h : l) top = std::max(top, *std::max_element(h.begin(), h.end()));
  struct E {
    double s;
    int l, h, t;
  };
  std::vector<E> all;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int t = 0; t < n; ++t) all.push_back({t < n_sink ? top + 1 : score[l][h][t], l, h, t});
  std::stable_sort(all.begin(), all.end(), [](const E& a, const E& b) { return a.s > b.s; });
  const int64_t total = per_head * c.n_kv_heads * c.n_layers;
  std::vector<std::vector<std::vector<int32_t>>> kept(
      c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads));
  for (int64_t i = 0; i < total; ++i) kept[all[i].l][all[i].h].push_back(all[i].t);
  for (auto& l : kept)
    for (auto& h : l) std::sort(h.begin(), h.end());
  return kept;
}

TEST(Kvzip, KeepsWhatTheReconstructionAttentionRanksHighestOverTheWholeCache) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  Tokenizer tok(m->tokenizer_path);
  const int64_t chunk = 24, n_sink = 4;
  const Prepared p = prepare(tok, chunk);
  ASSERT_GE(p.repeats.size(), 2u) << "the text must span several chunks";
  const int64_t n = static_cast<int64_t>(p.context.size());
  const int64_t per_head = n / 2;  // budget 0.5
  const auto kept = expected_kept(c, direct_scores(m, p, n_sink), n_sink, per_head);

  Engine e(m, test::make_with_model(m, "kvzip", {{"chunk_size", chunk}, {"n_sink", n_sink}}));
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {p.context}, nullptr, false);
  auto* pc = dynamic_cast<ContextPassCache*>(&e.kv());
  ASSERT_NE(pc, nullptr);
  const int64_t extra = pc->run_context_pass(pass_for(e, seq, p, tok));
  int64_t expect_extra = 0;
  for (const auto& r : p.repeats) expect_extra += static_cast<int64_t>(r.size());
  EXPECT_EQ(extra, expect_extra);
  EXPECT_EQ(e.kv().counters().at("reconstruction_tokens"), static_cast<double>(expect_extra));
  e.kv().end_prefill(seq);
  auto* store = dynamic_cast<EvictingKvCache*>(&e.kv());
  ASSERT_NE(store, nullptr);
  bool uneven = false;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const auto& want = kept[l][h];
      EXPECT_EQ(store->kept_indices(seq, l, h), want) << "layer " << l << " head " << h;
      uneven |= static_cast<int64_t>(want.size()) != per_head;
    }
  EXPECT_TRUE(uneven) << "the global ranking gave every head the same budget: not exercised";
}

TEST(Kvzip, PlusNormalizesByTheQueryInputAndTheValueOutput) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  Tokenizer tok(m->tokenizer_path);
  const int64_t chunk = 24, n_sink = 4;
  const Prepared p = prepare(tok, chunk);
  const int64_t n = static_cast<int64_t>(p.context.size());
  const auto plain = expected_kept(c, direct_scores(m, p, n_sink), n_sink, n / 2);
  const auto plus = expected_kept(c, direct_scores(m, p, n_sink, true), n_sink, n / 2);

  Engine e(m, test::make_with_model(m, "kvzip",
                                    {{"chunk_size", chunk}, {"n_sink", n_sink}, {"plus", true}}));
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {p.context}, nullptr, false);
  dynamic_cast<ContextPassCache&>(e.kv()).run_context_pass(pass_for(e, seq, p, tok));
  e.kv().end_prefill(seq);
  EXPECT_EQ(e.kv().counters().at("setting.plus"), 1.0);
  auto& store = dynamic_cast<EvictingKvCache&>(e.kv());
  int64_t differ = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_EQ(store.kept_indices(seq, l, h), plus[l][h]) << "layer " << l << " head " << h;
      differ += plus[l][h] != plain[l][h];
    }
  EXPECT_GT(differ, 0) << "KVzip+ kept what plain KVzip keeps everywhere: not exercised";
}

TEST(Kvzip, ThePassLeavesNoKvBehindAndEvictionFreesMemory) {
  auto m = test::testbed();
  const ModelConfig& c = m->config;
  Tokenizer tok(m->tokenizer_path);
  const Prepared p = prepare(tok, 2048);
  const int64_t n = static_cast<int64_t>(p.context.size());
  for (bool layerwise : {false, true}) {
    SCOPED_TRACE(layerwise);
    Engine e(m, test::make_with_model(m, "kvzip", {{"layerwise", layerwise}, {"budget", 0.25}}));
    const int64_t seq = e.new_sequence();
    e.prefill({seq}, {p.context}, nullptr, false);
    const Footprint before = e.kv().footprint();
    dynamic_cast<ContextPassCache&>(e.kv()).run_context_pass(pass_for(e, seq, p, tok));
    const Footprint after = e.kv().footprint();
    EXPECT_EQ(after.device_payload_bytes, before.device_payload_bytes);
    EXPECT_EQ(after.tokens_held, before.tokens_held);
    e.kv().end_prefill(seq);
    auto& store = dynamic_cast<EvictingKvCache&>(e.kv());
    int64_t entries = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      int64_t layer_entries = 0;
      for (int h = 0; h < c.n_kv_heads; ++h)
        layer_entries += static_cast<int64_t>(store.kept_indices(seq, l, h).size());
      if (layerwise) {
        EXPECT_EQ(layer_entries, (n / 4) * c.n_kv_heads);
      }
      entries += layer_entries;
    }
    EXPECT_EQ(entries, (n / 4) * c.n_kv_heads * c.n_layers);
    const Footprint fp = e.kv().footprint();
    EXPECT_EQ(fp.device_payload_bytes, entries * 2 * c.head_dim * 4);  // fp32 K and V rows
    EXPECT_LT(fp.device_payload_bytes, before.device_payload_bytes / 2);
  }
}

TEST(Kvzip, RefusesAPrefillWithoutTheReconstruction) {
  auto m = test::testbed();
  Engine e(m, test::make_with_model(m, "kvzip", nlohmann::json::object()));
  const int64_t seq = e.new_sequence();
  try {
    e.prefill({seq}, {test::walk_prompt(40, m->config.vocab_size)});
    FAIL() << "compressed without the reconstruction";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("without the context reconstruction pass"),
              std::string::npos)
        << err.what();
  }
}

TEST(Kvzip, ProtocolsWithoutAContextPassRefuseItBeforeAnyRun) {
  const nlohmann::json qa = {
      {"name", "qa"}, {"source", "synthetic"}, {"task", "passkey"}, {"length", 256}};
  nlohmann::json aware = qa;
  aware["mode"] = "query_aware";
  for (const nlohmann::json& proto :
       {nlohmann::json{{"name", "stream"}, {"dataset", "tinystories-valid-sample"}}, aware}) {
    try {
      resolve_run_config({{"model", "stories260K"}, {"method", "kvzip"}, {"protocol", proto}});
      ADD_FAILURE() << proto.dump();
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("protocol " + proto["name"].get<std::string>()),
                std::string::npos)
          << err.what();
    }
  }
  EXPECT_NO_THROW(
      resolve_run_config({{"model", "stories260K"}, {"method", "kvzip"}, {"protocol", qa}}));
}

}  // namespace
}  // namespace kvb
