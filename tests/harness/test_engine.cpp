// Engine behaviour: batched decode of different-length prompts, paged store vs reference attention,
// fork with copy-on-write, seeded sampling.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/engine/engine.h"
#include "harness/engine/transformer.h"
#include "harness/kv/paged_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::shared_ptr<Model> stories(const std::string& dtype = "fp32", const std::string& name = "stories260K") {
  LoadOptions o;
  o.dtype = dtype;
  return load_model(test::models_dir() + "/" + name, o);
}

std::vector<std::vector<int64_t>> prompts() {
  // Different lengths on purpose (1, 5, 23 and 40 tokens), all starting with BOS.
  std::vector<std::vector<int64_t>> p = {{1}, {1, 403, 407, 261, 378}};
  std::vector<int64_t> a = {1}, b = {1};
  for (int i = 0; i < 22; ++i) a.push_back(259 + (i * 37) % 250);
  for (int i = 0; i < 39; ++i) b.push_back(300 + (i * 11) % 200);
  p.push_back(a);
  p.push_back(b);
  return p;
}

TEST(Engine, BatchedDecodeMatchesDecodingEachAlone) {
  for (const char* dtype : {"fp32", "bf16"}) {
    auto m = stories(dtype);
    GenerateOptions g;
    g.max_new_tokens = 40;
    g.stop_ids = {-1};  // never stop early: compare full lengths
    Engine batched(m, make_default_kv(*m));
    auto all = batched.generate(prompts(), g);
    for (size_t i = 0; i < prompts().size(); ++i) {
      Engine solo(m, make_default_kv(*m));
      auto one = solo.generate({prompts()[i]}, g);
      EXPECT_EQ(all.tokens[i], one.tokens[0]) << dtype << " prompt " << i;
      EXPECT_EQ(all.tokens[i].size(), 40u);
    }
  }
}

TEST(Engine, CpuKernelAndTorchAttentionAgree) {
  // fp32 on CPU uses the paged CPU kernel; bf16 uses the gather + bmm path. Compare the kernel path
  // against the torch path directly by running the same cache in both modes on fp32 data.
  auto m = stories("fp32");
  const auto& c = m->config;
  PagedKvCache kv(c, m->device, m->dtype, {4, 2});
  StepBatch b;
  b.seq_ids = {7, 9};
  b.q_indptr = {0, 13, 18};
  b.past_lens = {0, 0};
  for (int i = 0; i < 13; ++i) b.positions.push_back(i);
  for (int i = 0; i < 5; ++i) b.positions.push_back(i);
  kv.begin_step(b);
  at::manual_seed(3);
  at::Tensor q = at::randn({18, c.n_heads, c.head_dim});
  at::Tensor k = at::randn({18, c.n_kv_heads, c.head_dim});
  at::Tensor v = at::randn({18, c.n_kv_heads, c.head_dim});
  LayerInput in;
  in.layer = 0;
  in.q = &q;
  in.k = &k;
  in.k_pre_rope = &k;
  in.v = &v;
  in.batch = &b;
  in.sm_scale = 0.35f;
  at::Tensor out = kv.attend(in);
  // Reference: dense causal attention per sequence with GQA expansion.
  auto ref_seq = [&](int64_t start, int64_t n) {
    at::Tensor qs = q.narrow(0, start, n), ks = k.narrow(0, start, n), vs = v.narrow(0, start, n);
    const int64_t g = c.n_heads / c.n_kv_heads;
    ks = ks.repeat_interleave(g, 1);
    vs = vs.repeat_interleave(g, 1);
    at::Tensor s = at::einsum("thd,jhd->htj", {qs, ks}) * 0.35;
    at::Tensor mask = at::ones({n, n}, at::kBool).triu(1);
    s.masked_fill_(mask, -INFINITY);
    return at::einsum("htj,jhd->thd", {at::softmax(s, -1), vs});
  };
  at::Tensor ref = at::cat({ref_seq(0, 13), ref_seq(13, 5)});
  EXPECT_LT((out - ref).abs().max().item<double>(), 1e-5);
  kv.end_step(b);
  EXPECT_EQ(kv.seq_len(7), 13);
  EXPECT_EQ(kv.seq_len(9), 5);
  EXPECT_EQ(kv.block_table(7).size(), 4u);  // ceil(13 / 4)
}

TEST(Engine, HalfPrecisionDecodeKernelAgreesWithTheTorchPath) {
  // bf16 / fp16 decode steps go through the decode-attention kernel (fp32 accumulation); the
  // switch decode_kernel=false runs LibTorch over the gathered rows. Same prompts, same forced
  // tokens: the logits agree within the half-precision rounding and the kernel really ran.
  for (const char* dtype : {"bf16"}) {  // fp16: Debian's CPU LibTorch has no fp16 matmul
    auto m = stories(dtype);
    auto run = [&](bool kernel, bool* used) {
      PagedKvCache::Options o;
      o.decode_kernel = kernel;
      auto kv = std::make_unique<PagedKvCache>(m->config, m->device, m->dtype, o);
      PagedKvCache* raw = kv.get();
      Engine e(m, std::move(kv));
      std::vector<int64_t> ids;
      for (size_t i = 0; i < prompts().size(); ++i) ids.push_back(e.new_sequence());
      e.prefill(ids, prompts());
      std::vector<at::Tensor> rows;
      for (int step = 0; step < 12; ++step) {
        std::vector<int64_t> toks;
        for (size_t i = 0; i < ids.size(); ++i) toks.push_back(300 + (step * 7 + i * 13) % 200);
        rows.push_back(e.decode(ids, toks).to(at::kFloat));
      }
      *used = raw->last_step_used_decode_kernel();
      return at::cat(rows);
    };
    bool used_kernel = false, used_torch = true;
    at::Tensor a = run(true, &used_kernel), b = run(false, &used_torch);
    EXPECT_TRUE(used_kernel) << dtype;
    EXPECT_FALSE(used_torch) << dtype;
    EXPECT_TRUE(a.isfinite().all().item<bool>()) << dtype;
    const double diff = (a - b).abs().max().item<double>();
    const double scale = b.abs().max().item<double>();
    EXPECT_LT(diff, 0.05 * scale) << dtype;
    // Both follow the same tokens: the argmax agrees almost everywhere.
    const double agree = a.argmax(-1).eq(b.argmax(-1)).to(at::kFloat).mean().item<double>();
    EXPECT_GT(agree, 0.9) << dtype;
  }
}

TEST(Engine, ForkSharesBlocksAndBranchesMatchIndependentRuns) {
  auto m = stories();
  auto prompt = prompts()[3];  // 40 tokens: 2 full blocks + a partial one at block size 16
  Engine e(m, make_default_kv(*m, 16));
  auto& kv = static_cast<PagedKvCache&>(e.kv());
  int64_t a = e.new_sequence();
  at::Tensor last = e.prefill({a}, {prompt});
  const int64_t blocks_before = kv.blocks_in_use();
  int64_t b = e.fork(a);
  EXPECT_EQ(kv.blocks_in_use(), blocks_before);  // fork copies nothing
  // Decode different tokens on the two branches (forces copy-on-write of the shared partial block).
  std::vector<int64_t> ta = {400, 401, 402}, tb = {300, 301, 302};
  at::Tensor la, lb;
  for (int i = 0; i < 3; ++i) {
    at::Tensor l = e.decode({a, b}, {ta[i], tb[i]});
    la = l[0];
    lb = l[1];
  }
  EXPECT_EQ(kv.blocks_in_use(), blocks_before + 1);  // only the partial block was copied
  for (auto [toks, logits] : {std::pair{ta, la}, std::pair{tb, lb}}) {
    Engine solo(m, make_default_kv(*m, 16));
    int64_t s = solo.new_sequence();
    solo.prefill({s}, {prompt});
    at::Tensor l;
    for (int64_t t : toks) l = solo.decode({s}, {t})[0];
    // The pair's matmuls are GEMMs, the solo run's GEMVs: the same sums, rounded in another order
    // (a few 1e-6 of the logits' size).
    EXPECT_LT((l - logits).abs().max().item<double>(), 1e-5 * (1 + logits.abs().max().item<double>()));
  }
}

TEST(Engine, SeededSamplingIsDeterministicAndSeedSensitive) {
  auto m = stories();
  GenerateOptions g;
  g.max_new_tokens = 30;
  g.sampling.temperature = 1.0;
  g.sampling.top_p = 0.9;
  g.sampling.seed = 42;
  Engine e(m, make_default_kv(*m));
  auto r1 = e.generate({{1}}, g);
  auto r2 = e.generate({{1}}, g);
  EXPECT_EQ(r1.tokens, r2.tokens);
  g.sampling.seed = 43;
  auto r3 = e.generate({{1}}, g);
  EXPECT_NE(r1.tokens, r3.tokens);
  g.sampling.temperature = 0;
  auto greedy = e.generate({{1}}, g);
  EXPECT_NE(r1.tokens, greedy.tokens);
}

TEST(Engine, ReleasedSequencesReturnTheirBlocks) {
  auto m = stories();
  Engine e(m, make_default_kv(*m, 8));
  auto& kv = static_cast<PagedKvCache&>(e.kv());
  const int64_t base = kv.blocks_in_use();
  int64_t s = e.new_sequence();
  e.prefill({s}, {prompts()[3]});
  EXPECT_EQ(kv.blocks_in_use(), base + 5);  // 40 tokens / 8
  Footprint f = kv.footprint();
  EXPECT_EQ(f.tokens_held, 40);
  EXPECT_EQ(f.device_payload_bytes, 5 * 8 * m->config.n_layers * 2 * m->config.kv_dim() * 4);
  e.release(s);
  EXPECT_EQ(kv.blocks_in_use(), base);
}

TEST(Engine, SyntheticPresetIsDeterministicAndFinite) {
  LoadOptions o;
  o.synthetic_seed = 5;
  auto a = load_model("synthetic:tiny", o);
  auto b = load_model("synthetic:tiny", o);
  EXPECT_TRUE(at::equal(a->weights.layers[2].wqkv, b->weights.layers[2].wqkv));
  o.synthetic_seed = 6;
  auto c = load_model("synthetic:tiny", o);
  EXPECT_FALSE(at::equal(a->weights.layers[2].wqkv, c->weights.layers[2].wqkv));
  Engine e(a, make_default_kv(*a));
  std::vector<int64_t> ids(600);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 7919) % 512;
  auto r = e.score(ids);
  EXPECT_TRUE(std::isfinite(r.nll_sum));
  EXPECT_GT(r.ppl(), 1.0);
}

TEST(Engine, RopeStylesAreConsistentPermutations) {
  // Interleaved RoPE on x equals half-style RoPE on x with its pairs regrouped.
  at::manual_seed(1);
  const int64_t T = 5, H = 2, D = 8;
  at::Tensor x = at::randn({T, H, D});
  ModelConfig c;
  c.head_dim = D;
  c.rope_theta = 10000;
  at::Tensor cos, sin;
  compute_rope_tables(c, 16, &cos, &sin);
  at::Tensor pos = at::arange(3, 3 + T);
  at::Tensor cs = cos.index_select(0, pos), sn = sin.index_select(0, pos);
  at::Tensor inter = apply_rope(x, cs, sn, RopeStyle::kInterleaved);
  at::Tensor perm = at::cat({at::arange(0, D, 2), at::arange(1, D, 2)});  // evens then odds
  at::Tensor half = apply_rope(x.index_select(2, perm), cs, sn, RopeStyle::kHalf);
  EXPECT_LT((inter.index_select(2, perm) - half).abs().max().item<double>(), 1e-6);
  EXPECT_GT((inter - x).abs().max().item<double>(), 1e-2);  // it really rotated
}

}  // namespace
}  // namespace kvb
