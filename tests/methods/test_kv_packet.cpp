// kv_packet and the machinery under it, on the real stories260K: rope_shift moves a key exactly; a
// spliced cache equals one prefilled at the shifted positions; the qa document route (separate
// prefills + splice) computes what the training forward with its block-diagonal mask computes, and
// not what a full recomputation computes; documents are cut at sentence ends and put back whole;
// the qa protocol records the route's time to first token, documents and overhead; the trainer
// lowers its KL and writes an adapter the method loads; bad adapters and parameters are refused.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since LibTorch 2)
#include <gtest/gtest.h>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/engine/transformer.h"
#include "harness/eval/documents.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/document_reuse.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/rope_shift.h"
#include "harness/kv/splice.h"
#include "harness/report/leaderboard.h"
#include "harness/store/results_db.h"
#include "harness/train/trainer.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/dms/dms_adapter.h"
#include "methods/kv_packet/packet_adapter.h"
#include "methods/kv_packet/packet_train.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

CacheContext ctx() {
  auto m = test::stories260k();
  return CacheContext{m->config, m->device, m->dtype};
}

std::unique_ptr<KvCache> make(const std::string& method, const nlohmann::json& params) {
  return MethodRegistry::instance().create(method, ctx(), params);
}

std::vector<int64_t> tokens(int n, int salt) {
  std::vector<int64_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 37 + salt * 101) % 500);
  return t;
}

using test::metric;

TEST(RopeShift, MovesKeysToTheirNewPositions) {
  ModelConfig c = test::stories260k()->config;
  ModelConfig scaled = c;  // Llama 3.1's frequency scaling: rotations still compose
  scaled.rope_scaling.type = "llama3";
  scaled.rope_scaling.factor = 8;
  scaled.rope_scaling.original_max_position_embeddings = 64;
  ModelConfig inter = c;
  inter.rope_style = RopeStyle::kInterleaved;
  for (const ModelConfig* cfg : {&c, &scaled, &inter}) {
    at::Tensor cos, sin;
    compute_rope_tables(*cfg, 2000, &cos, &sin);
    at::Tensor raw = at::randn({5, cfg->n_kv_heads, cfg->head_dim});
    auto at_pos = [&](int64_t p) {
      at::Tensor idx = at::arange(p, p + 5, at::kLong);
      return apply_rope(raw, cos.index_select(0, idx), sin.index_select(0, idx), cfg->rope_style);
    };
    for (int64_t delta : {1, 37, 1500, -30}) {
      at::Tensor moved = rope_shift(at_pos(40), *cfg, delta);
      EXPECT_LT((moved - at_pos(40 + delta)).abs().max().item<double>(), 2e-5) << delta;
    }
    EXPECT_LT((rope_shift(rope_shift(at_pos(3), *cfg, 900), *cfg, -900) - at_pos(3)).abs().max().item<double>(), 2e-5);
  }
}

// Prefills `toks` as sequence `seq` of `kv` at positions first.. (no engine: it starts every
// sequence at 0).
void prefill_at(KvCache& kv, int64_t seq, const std::vector<int64_t>& toks, int64_t first) {
  StepBatch b;
  b.seq_ids = {seq};
  b.q_indptr = {0, static_cast<int64_t>(toks.size())};
  b.past_lens = {0};
  for (size_t i = 0; i < toks.size(); ++i) b.positions.push_back(first + static_cast<int64_t>(i));
  transformer_forward(*test::stories260k(), kv, toks, b, {});
}

TEST(Splice, EqualsAPrefillAtTheShiftedPositions) {
  const auto& c = test::stories260k()->config;
  auto a = make("full", {}), b = make("full", {});
  const auto doc = tokens(54, 1), other = tokens(23, 2);
  prefill_at(*a, 0, other, 0);
  prefill_at(*a, 1, doc, 0);
  prefill_at(*b, 0, doc, 23);  // the document where the splice puts it
  ASSERT_NE(splicing(*a), nullptr);
  splicing(*a)->splice(7, {{0, 0}, {1, 23}});
  EXPECT_EQ(a->seq_len(7), 77);
  EXPECT_EQ(a->seq_len(1), 54);  // sources stay
  for (int l = 0; l < c.n_layers; ++l) {
    const auto got = probe_view_of(*a, l, 7), want = probe_view_of(*b, l, 0),
               first = probe_view_of(*a, l, 0);
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_LT((got[h].k.narrow(0, 23, 54) - want[h].k).abs().max().item<double>(), 1e-4) << l;
      EXPECT_LT((got[h].v.narrow(0, 23, 54) - want[h].v).abs().max().item<double>(), 1e-4) << l;
      EXPECT_TRUE(got[h].k.narrow(0, 0, 23).equal(first[h].k)) << "the unshifted part is copied";
    }
  }
  // A store that cannot splice says so by name.
  Engine e(test::stories260k(), make("paged", {}));
  const int64_t s = e.new_sequence();
  e.prefill({s}, {tokens(10, 3)});
  try {
    e.compose({s});
    FAIL() << "paged composed";
  } catch (const kvb::Error& err) {
    EXPECT_NE(std::string(err.what()).find("cannot splice"), std::string::npos) << err.what();
  }
}

// An eviction store splices what each source kept: at a keep-everything budget it is the dense
// splice; at a real budget (each document compressed by its own end_prefill) the kept entries are
// the sources' in order, indices moved on and keys re-rotated by the offset.
TEST(Splice, EvictingStoreSplicesWhatEachSourceKept) {
  const auto& c = test::stories260k()->config;
  const auto doc = tokens(54, 1), other = tokens(23, 2);
  auto dense = make("full", {});
  auto all = make("snapkv", {{"budget", 1.0}});
  auto half = make("snapkv", {{"budget", 0.5}, {"window", 4}});
  for (KvCache* kv : {dense.get(), all.get(), half.get()}) {
    prefill_at(*kv, 0, other, 0);
    kv->end_prefill(0);
    prefill_at(*kv, 1, doc, 0);
    kv->end_prefill(1);
    ASSERT_NE(splicing(*kv), nullptr) << kv->name();
    splicing(*kv)->splice(7, {{0, 0}, {1, 23}});
    EXPECT_EQ(kv->seq_len(7), 77) << kv->name();
  }
  auto* ev = dynamic_cast<EvictingKvCache*>(half.get());
  ASSERT_NE(ev, nullptr);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto want = probe_view_of(*dense, l, 7), got = probe_view_of(*all, l, 7);
    const auto src = probe_view_of(*half, l, 1), spliced = probe_view_of(*half, l, 7);
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_TRUE(got[h].index.equal(at::arange(77, at::kLong))) << l;
      EXPECT_LT((got[h].k - want[h].k).abs().max().item<double>(), 1e-5) << l;
      EXPECT_LT((got[h].v - want[h].v).abs().max().item<double>(), 1e-5) << l;
      // budget 0.5: 11 of the 23 tokens and 27 of the 54, in source order.
      const auto a = ev->kept_indices(0, l, h), b = ev->kept_indices(1, l, h);
      auto d = ev->kept_indices(7, l, h);
      ASSERT_EQ(a.size(), 11u);
      ASSERT_EQ(b.size(), 27u);
      std::vector<int32_t> expect = a;
      for (int32_t i : b) expect.push_back(i + 23);
      EXPECT_EQ(d, expect) << l << " " << h;
      at::Tensor moved = rope_shift(src[h].k.unsqueeze(1), c, 23).squeeze(1);
      EXPECT_LT((spliced[h].k.narrow(0, 11, 27) - moved).abs().max().item<double>(), 1e-5) << l;
      EXPECT_TRUE(spliced[h].v.narrow(0, 11, 27).equal(src[h].v)) << l;
    }
  }
}

TEST(SplitDocuments, CutsAtSentenceEndsAndPutsTheContextBackWhole) {
  Tokenizer tok(test::stories260k()->tokenizer_path);
  auto corpus = load_corpus("tinystories-valid-sample", resolve_data_dir(test::data_dir()));
  const auto ids = tok.encode(corpus->text.substr(0, 3000));
  const auto docs = split_documents(ids, 64, tok);
  ASSERT_GT(docs.size(), 5u);
  std::vector<int64_t> back;
  int sentence_ends = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_LE(docs[d].size(), 64u);
    EXPECT_GE(docs[d].size(), d + 1 < docs.size() ? 32u : 1u);
    back.insert(back.end(), docs[d].begin(), docs[d].end());
    const std::string& last = tok.piece(docs[d].back());
    sentence_ends += last.find_first_of(".!?") != std::string::npos || last == "<0x0A>";
  }
  EXPECT_EQ(back, ids);
  // Cutting blindly would end ~1 document in 10 at a sentence end; TinyStories has one in almost every
  // half-document (the misses: a long sentence of dialogue).
  EXPECT_GE(sentence_ends, 0.8 * static_cast<double>(docs.size()));
  EXPECT_EQ(split_documents(ids, 0, tok).size(), 1u);
}

// The trained header and trailer, written where the method loads them from.
std::string adapter_file(const kv_packet::Adapter& a) {
  const std::string path = test::make_temp_dir("kvpacket") + "/adapter.safetensors";
  a.save(path, {{"model", "stories260K"}});
  return path;
}

TEST(KvPacket, DocumentRouteComputesTheTrainingForward) {
  auto m = test::stories260k();
  const auto& c = m->config;
  Tokenizer tok(m->tokenizer_path);
  const auto a = kv_packet::Adapter::fresh(c, 3, 2, 0.5, 11);
  auto kv = make("kv_packet", {{"adapter", adapter_file(a)}, {"doc_tokens", 40}});
  const DocumentReuse* r = document_reuse_of(*kv);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->extra_rows(), 5);
  Engine e(m, std::move(kv));
  std::vector<int64_t> ctx_ids = {c.bos_id};
  for (int64_t t : tok.encode("Tom had a red ball. He liked to play with the ball every day. One day the "
                              "ball went up a tree. Tom was sad. His dad came and got the ball down. "
                              "Tom was happy again. Anna saw a big dog. The dog was very friendly."))
    ctx_ids.push_back(t);
  const auto docs = split_documents(std::vector<int64_t>(ctx_ids.begin() + 1, ctx_ids.end()), 40, tok);
  ASSERT_GE(docs.size(), 2u);
  const DocumentPrefill d = prefill_documents(e, *r, ctx_ids, tok);
  EXPECT_EQ(d.documents, static_cast<int64_t>(docs.size()));
  EXPECT_EQ(e.kv().seq_len(d.seq), static_cast<int64_t>(ctx_ids.size() + 5 * docs.size()));
  const auto query = tok.encode("Where did the ball go? The ball went up a");
  std::vector<at::Tensor> rows;
  e.prefill({d.seq}, {query}, [&](const at::Tensor& l, int64_t) { rows.push_back(l); });
  const at::Tensor route = at::cat(rows, 0);

  TrainWeights w = train_weights_from_model(m->weights, c, "cpu");
  at::Tensor cos, sin;
  compute_rope_tables(c, 400, &cos, &sin);
  at::NoGradGuard ng;
  const at::Tensor student = kv_packet::student_query_logits(w, c, a.header, a.trailer, docs, query, cos, sin);
  ASSERT_EQ(student.sizes(), route.sizes());
  EXPECT_LT((student - route).abs().max().item<double>(), 2e-3);

  // ... and not what recomputing the whole context computes.
  Engine full(m, make("full", {}));
  const int64_t s = full.new_sequence();
  std::vector<int64_t> all = ctx_ids;
  all.insert(all.end(), query.begin(), query.end());
  std::vector<at::Tensor> frows;
  full.prefill({s}, {all}, [&](const at::Tensor& l, int64_t) { frows.push_back(l); });
  const at::Tensor recomputed = at::cat(frows, 0).narrow(0, static_cast<int64_t>(ctx_ids.size()), static_cast<int64_t>(query.size()));
  EXPECT_GT((recomputed - route).abs().max().item<double>(), 0.1);
}

// The document route's question logits with the packets kept in a codec store.
at::Tensor route_logits(const nlohmann::json& params) {
  auto m = test::stories260k();
  Tokenizer tok(m->tokenizer_path);
  Engine e(m, make("kv_packet", params));
  std::vector<int64_t> ctx_ids = {m->config.bos_id};
  for (int64_t t : tok.encode("Lily had a little cat. The cat liked to sleep in the sun. One day the cat "
                              "ran into the garden and hid under a big red flower. Lily looked and "
                              "looked. At last she found the cat under the flower and they went home."))
    ctx_ids.push_back(t);
  const DocumentPrefill d = prefill_documents(e, *document_reuse_of(e.kv()), ctx_ids, tok);
  return e.prefill({d.seq}, {tok.encode("Where did the cat hide? Under a big red")}, nullptr, false);
}

TEST(KvPacket, PacketsComposeWithACodecStore) {
  const nlohmann::json base = {{"wrap", "bos"}, {"doc_tokens", 24}};
  auto with = [&](const std::string& codec) {
    nlohmann::json p = base;
    p["codec"] = codec;
    p["codec_residual"] = 0;
    return p;
  };
  const at::Tensor dense = route_logits(base);
  const double fp16 = (route_logits(with("fp16")) - dense).abs().max().item<double>();
  const double kivi4 = (route_logits(with("kivi-4")) - dense).abs().max().item<double>();
  const double kivi2 = (route_logits(with("kivi-2")) - dense).abs().max().item<double>();
  EXPECT_LT(fp16, 2e-2);  // fp16 rows re-rotated: rounding only
  EXPECT_GT(kivi4, fp16);
  EXPECT_GT(kivi2, kivi4);  // fewer bits, further from the dense packets
  EXPECT_LT(kivi4, 2.0);
  std::cerr << "logit error vs dense packets: fp16 " << fp16 << ", kivi-4 " << kivi4 << ", kivi-2 "
            << kivi2 << "\n";
}

// Packets kept by another method's store (composition by wrapping): SnapKV-compressed documents
// hold fewer rows and answer from them; at a keep-everything budget they are the dense packets.
TEST(KvPacket, PacketsComposeWithAnEvictingStore) {
  const nlohmann::json base = {{"wrap", "bos"}, {"doc_tokens", 24}};
  auto inner = [&](double budget) {
    nlohmann::json p = base;
    p["inner"] = "snapkv";
    p["inner_params"] = nlohmann::json{{"budget", budget}, {"window", 4}}.dump();
    return p;
  };
  const at::Tensor dense = route_logits(base);
  const double all = (route_logits(inner(1.0)) - dense).abs().max().item<double>();
  const double half = (route_logits(inner(0.5)) - dense).abs().max().item<double>();
  EXPECT_LT(all, 1e-3);
  EXPECT_GT(half, all);
  // Kept entries in a codec (eviction x quantization): fp16 rows re-rotated are rounding only.
  nlohmann::json fp16 = base;
  fp16["inner"] = "snapkv";
  fp16["inner_params"] = R"({"budget": 1.0, "codec": "fp16", "codec_residual": 0})";
  EXPECT_LT((route_logits(fp16) - dense).abs().max().item<double>(), 2e-2);
  auto kv = make("kv_packet", inner(0.5));
  EXPECT_NE(document_reuse_of(*kv), nullptr);
  EXPECT_NE(kv->name().find("snapkv"), std::string::npos) << kv->name();
  std::cerr << "logit error vs dense packets: snapkv 1.0 " << all << ", snapkv 0.5 " << half << "\n";
}

TEST(KvPacket, QaDocumentRouteRecordsItsWorkAndOverhead) {
  std::string dir = test::make_temp_dir("kvpacket-qa");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  env.cache_dir = dir + "/cache";
  auto run = [&](const std::string& method) {
    return execute_run(resolve_run_config(nlohmann::json::parse(
                           "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": " + method +
                           ", \"protocol\": {\"name\": \"qa\", \"source\": \"synthetic\", \"task\": "
                           "\"passkey\", \"length\": 256, \"num_samples\": 1, \"depths\": \"0.5\"}}")),
                       db, env);
  };
  RunOutcome full = run("\"full\"");
  RunOutcome none = run("{\"name\": \"kv_packet\", \"params\": {\"wrap\": \"none\", \"doc_tokens\": 64}}");
  RunOutcome bos = run("{\"name\": \"kv_packet\", \"params\": {\"wrap\": \"bos\", \"doc_tokens\": 64}}");
  const double docs = metric(none.metrics, "documents");
  EXPECT_GE(docs, 4);  // 255 tokens after the BOS in documents of at most 64
  EXPECT_LE(docs, 8);
  EXPECT_EQ(metric(bos.metrics, "documents"), docs);
  // At query time the route prefills only the question; recomputation prefills the context too.
  const double q = metric(none.metrics, "query_prefill_tokens");
  EXPECT_GT(q, 3);
  EXPECT_LT(q, 60);
  const double prompt = metric(full.metrics, "query_prefill_tokens");  // BOS + context + question
  EXPECT_NEAR(prompt, 256, 3);
  EXPECT_GT(metric(none.metrics, "ttft_ms"), 0);
  EXPECT_GT(metric(none.metrics, "document_prefill_ms"), 0);
  // Plain concatenation holds exactly the context; a BOS per document costs one row each.
  EXPECT_NEAR(metric(none.metrics, "compression_ratio"), 1.0, 1e-9);
  const double ctx = prompt - q;  // the context's tokens, BOS included
  EXPECT_NEAR(metric(bos.metrics, "compression_ratio"), ctx / (ctx + docs), 0.01);
  // The leaderboard's qa table shows the query-time work beside accuracy, paired against full.
  const Leaderboard lb = build_leaderboard(db, LeaderboardOptions{});
  ASSERT_EQ(lb.tables.size(), 1u);
  const LeaderTable& t = lb.tables[0];
  EXPECT_EQ(t.secondary, std::vector<std::string>{"ttft_ms"});
  ASSERT_EQ(t.rows.size(), 3u);
  for (const auto& r : t.rows)
    if (r.method == "kv_packet") {
      EXPECT_EQ(r.deltas.at("ttft_ms").status, "ok");
      EXPECT_EQ(r.deltas.at("ttft_ms").n, 1u);
    }
}

TEST(KvPacket, TrainerLowersItsKlAndWritesAnAdapterTheMethodLoads) {
  auto m = test::stories260k();
  kv_packet::TrainOptions o;
  o.tasks = {"passkey"};
  o.length = 200;
  o.doc_tokens = {48, 80};
  o.samples = 2;
  o.steps = 16;
  o.batch = 2;
  o.header_rows = 4;
  o.trailer_rows = 2;
  o.lr = 0.05;
  o.log_every = 4;
  o.data_dir = test::data_dir();
  o.out = test::make_temp_dir("kvpacket-train") + "/a.safetensors";
  std::vector<std::string> lines;
  o.log = [&](const std::string& s) { lines.push_back(s); };
  const auto r = kv_packet::train_adapter(m, o);
  EXPECT_EQ(r.steps, 16);
  // The step lines (after the data's own lines) carry the time so far and an ETA, 0s at the end.
  std::vector<std::string> steps;
  for (const auto& l : lines)
    if (l.rfind("step ", 0) == 0) steps.push_back(l);
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& l : steps) EXPECT_NE(l.find(" elapsed, ETA "), std::string::npos) << l;
  EXPECT_EQ(steps[3].substr(steps[3].size() - 6), "ETA 0s") << steps[3];
  EXPECT_EQ(r.samples, 2);
  EXPECT_GT(r.kl_first, 0);
  EXPECT_LT(r.kl_last, 0.8 * r.kl_first) << "first " << r.kl_first << ", last " << r.kl_last;
  const auto a = kv_packet::Adapter::load(o.out, m->config);
  EXPECT_EQ(a.header.size(0), 4);
  EXPECT_EQ(a.trailer.size(0), 2);
  EXPECT_EQ(a.info.at("doc_tokens"), "48,80");
  auto kv = make("kv_packet", {{"adapter", o.out}});
  EXPECT_EQ(document_reuse_of(*kv)->extra_rows(), 6);
  // The evaluation path agrees: on its training samples the trained adapter is closer to the
  // full-context teacher than the initialisation it started from. (Plain concatenation is not a
  // bar here: stories260K cannot do the passkey, and its answers barely depend on the context.)
  const auto start = kv_packet::Adapter::fresh(m->config, 4, 2, o.init_std, o.seed);
  const auto trained = kv_packet::evaluate_wrap(m, o, a.header, a.trailer);
  const auto initial = kv_packet::evaluate_wrap(m, o, start.header, start.trailer);
  EXPECT_EQ(trained.samples, 2);
  EXPECT_LT(trained.kl, 0.8 * initial.kl) << "initial " << initial.kl;
  EXPECT_GE(trained.argmax_agreement, 0.0);
  EXPECT_LE(trained.argmax_agreement, 1.0);
}

TEST(KvPacket, BadAdaptersAndParametersAreRefusedByName) {
  const auto& c = test::stories260k()->config;
  auto expect_error = [](const std::function<void()>& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error naming " << part;
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error([&] { make("kv_packet", {}); }, "kv_packet.adapter");
  const std::string good = adapter_file(kv_packet::Adapter::fresh(c, 2, 2, 0.02, 1));
  expect_error([&] { make("kv_packet", {{"wrap", "none"}, {"adapter", good}}); }, "wrap=none");
  // A DMS adapter is not a KV Packet adapter.
  const std::string dms_path = test::make_temp_dir("kvpacket-bad") + "/dms.safetensors";
  dms::Adapter::fresh(c, 8).save(dms_path);
  expect_error([&] { make("kv_packet", {{"adapter", dms_path}}); }, "dms.safetensors");
  // Made for a wider model.
  ModelConfig wide = c;
  wide.dim = c.dim * 2;
  const std::string wide_path = adapter_file(kv_packet::Adapter::fresh(wide, 2, 2, 0.02, 1));
  expect_error([&] { make("kv_packet", {{"adapter", wide_path}}); }, "should be [rows, " + std::to_string(c.dim));
  expect_error([&] { make("kv_packet", {{"adapter", "/nonexistent/a.safetensors"}}); }, "/nonexistent/a.safetensors");
  // Wrapping: a store that cannot splice, a malformed or misplaced parameter, itself.
  expect_error([&] { make("kv_packet", {{"wrap", "none"}, {"inner", "paged"}}); },
               "kv_packet.inner=paged");
  expect_error([&] { make("kv_packet", {{"wrap", "none"}, {"inner", "snapkv"}, {"inner_params", "{budget"}}); },
               "kv_packet.inner_params");
  expect_error([&] { make("kv_packet", {{"wrap", "none"}, {"inner", "snapkv"}, {"inner_params", "{\"budgt\": 0.5}"}}); },
               "budgt");
  expect_error([&] { make("kv_packet", {{"wrap", "none"}, {"inner", "snapkv"}, {"codec", "kivi-2"}}); },
               "kv_packet.codec");
  expect_error([&] { make("kv_packet", {{"wrap", "none"}, {"inner", "kv_packet"}}); }, "cannot wrap itself");
}

}  // namespace
}  // namespace kvb
