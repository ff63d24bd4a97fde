// kivi with store=kernel: the paged KIVI layout written by the quantize-and-append kernel and read
// by the fused decode kernel. Checked against two independent things: exact attention over the
// store's own contents as the tensor-op dequantizer reads them (so the kernel and the dequantizer
// agree on every byte of the layout), and the codec store (the same quantization policy: the
// stored values must be equal). Then fork / truncate, the ledger, the engine end to end on
// stories260K, parameter errors, and (with a GPU) CUDA against the CPU store.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/attention.h"
#include "harness/kv/method_registry.h"
#include "kernels/torch/kivi_torch.h"
#include "methods/common/codec_kv_cache.h"
#include "methods/kivi/kivi_kernel_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

// A testbed-like shape: head_dim 64, GQA 4:1.
ModelConfig synthetic_config() {
  ModelConfig c;
  c.name = "synthetic:kivi-kernel-test";
  c.format = "synthetic";
  c.dim = 512;
  c.hidden_dim = 1024;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 100;
  c.max_seq_len = 4096;
  return c;
}

std::unique_ptr<KvCache> make(const CacheContext& ctx, nlohmann::json params) {
  return MethodRegistry::instance().create("kivi", ctx, params);
}

const nlohmann::json kParams = {
    {"k_bits", 4}, {"v_bits", 2}, {"group_size", 32}, {"residual_length", 64}};

// One step's inputs: per layer q [T, Hq, D], k, v [T, Hkv, D] fp32 (keys with a few loud channels,
// as real keys have).
struct Step {
  StepBatch batch;
  std::vector<at::Tensor> q, k, v;
};

Step make_step(const ModelConfig& c, const std::vector<int64_t>& ids,
               const std::vector<int64_t>& past, const std::vector<int64_t>& news, uint64_t seed,
               const c10::Device& dev = c10::Device(c10::kCPU)) {
  Step s;
  s.batch.seq_ids = ids;
  s.batch.past_lens = past;
  s.batch.q_indptr = {0};
  for (int64_t n : news) s.batch.q_indptr.push_back(s.batch.q_indptr.back() + n);
  for (size_t b = 0; b < ids.size(); ++b)
    for (int64_t i = 0; i < news[b]; ++i) s.batch.positions.push_back(past[b] + i);
  bool decode = true;
  for (int64_t n : news) decode = decode && n == 1;
  s.batch.phase = decode ? Phase::kDecode : Phase::kPrefill;
  const int64_t T = s.batch.num_tokens();
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor loud = at::ones({c.head_dim});
  loud.narrow(0, 0, 4).fill_(6.0);
  for (int l = 0; l < c.n_layers; ++l) {
    s.q.push_back(at::randn({T, c.n_heads, c.head_dim}, g).to(dev));
    s.k.push_back((at::randn({T, c.n_kv_heads, c.head_dim}, g) * loud).to(dev));
    s.v.push_back(at::randn({T, c.n_kv_heads, c.head_dim}, g).to(dev));
  }
  return s;
}

std::vector<at::Tensor> run_step(KvCache& kv, const Step& s, float sm_scale = 0.125f) {
  kv.begin_step(s.batch);
  std::vector<at::Tensor> outs;
  for (size_t l = 0; l < s.q.size(); ++l) {
    LayerInput in;
    in.layer = static_cast<int>(l);
    in.q = &s.q[l];
    in.k = &s.k[l];
    in.k_pre_rope = &s.k[l];
    in.v = &s.v[l];
    in.batch = &s.batch;
    in.sm_scale = sm_scale;
    outs.push_back(kv.attend(in));
  }
  kv.end_step(s.batch);
  return outs;
}

TEST(KiviKernel, DecodeEqualsExactAttentionOverItsOwnDequantizedStore) {
  const ModelConfig c = synthetic_config();
  CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto kv = make(ctx, [] {
    auto p = kParams;
    p["store"] = "kernel";
    return p;
  }());
  auto& store = dynamic_cast<KiviKernelKvCache&>(*kv);
  // Prompts of 54 and 97 tokens (partial pages, one past R), then 150 decode steps with the batch
  // in reverse order (ring rows 1, 0: the gathered-ring path) every other step.
  run_step(*kv, make_step(c, {10, 11}, {0, 0}, {54, 97}, 1));
  int64_t la = 54, lb = 97;
  double worst = 0;
  for (int t = 0; t < 150; ++t) {
    const bool rev = t % 2 == 1;
    std::vector<int64_t> ids = rev ? std::vector<int64_t>{11, 10} : std::vector<int64_t>{10, 11};
    std::vector<int64_t> past = rev ? std::vector<int64_t>{lb, la} : std::vector<int64_t>{la, lb};
    Step s = make_step(c, ids, past, {1, 1}, 100 + t);
    std::vector<at::Tensor> outs = run_step(*kv, s);
    ASSERT_TRUE(store.last_step_used_decode_kernel());
    ++la, ++lb;
    for (int l = 0; l < c.n_layers; ++l)
      for (int b = 0; b < 2; ++b) {
        auto [K, V] = store.dequantized(l, ids[b]);
        ASSERT_EQ(K.size(0), b == (rev ? 1 : 0) ? la : lb);
        // The kernel saw q in fp16; so does the reference.
        at::Tensor q = s.q[l].narrow(0, b, 1).to(at::kHalf).to(at::kFloat);
        at::Tensor want = attend_dense(q, K, V, 0.125f);
        at::Tensor got = outs[l].narrow(0, b, 1);
        ASSERT_EQ(got.scalar_type(), at::kFloat);
        worst = std::max(worst, (got - want).abs().max().item<double>());
      }
  }
  EXPECT_LT(worst, 3e-3);  // fp16 output rounding (|o| ~ 1) and fp32 accumulation order
  const auto m = kv->counters();
  EXPECT_EQ(m.at("decode_kernel_steps"), 150);
  EXPECT_EQ(m.at("exact_steps"), 1);
}

TEST(KiviKernel, StoresExactlyWhatTheCodecStoreStores) {
  // The same policy and rounding as the codec store: after a prompt, a chunked continuation and
  // decode steps, both hold the same dequantized keys and values (fp16 residual in both), and the
  // exact (multi-token) steps return the same attention.
  const ModelConfig c = synthetic_config();
  CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto codec_p = kParams, kernel_p = kParams;
  codec_p["store"] = "codec";
  kernel_p["store"] = "kernel";
  auto a = make(ctx, codec_p), b = make(ctx, kernel_p);
  auto& codec = dynamic_cast<CodecKvCache&>(*a);
  auto& kernel = dynamic_cast<KiviKernelKvCache&>(*b);
  std::vector<Step> steps = {make_step(c, {1}, {0}, {70}, 7), make_step(c, {1}, {70}, {45}, 8)};
  for (int t = 0; t < 40; ++t) steps.push_back(make_step(c, {1}, {115 + t}, {1}, 9 + t));
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<at::Tensor> oa = run_step(*a, steps[i]), ob = run_step(*b, steps[i]);
    if (i < 2) {  // exact steps: both attend over the same stored values + the new rows
      for (size_t l = 0; l < oa.size(); ++l)
        EXPECT_LT((oa[l] - ob[l]).abs().max().item<double>(), 1e-5) << "step " << i;
    }
  }
  const int64_t n = 155, W = c.kv_dim();
  for (int l = 0; l < c.n_layers; ++l) {
    auto [K, V] = kernel.dequantized(l, 1);
    std::vector<float> kc(static_cast<size_t>(n * W)), vc(static_cast<size_t>(n * W));
    codec.stream(1, l, KvKind::kKey).decode(kc.data());
    codec.stream(1, l, KvKind::kValue).decode(vc.data());
    at::Tensor Kc = at::from_blob(kc.data(), {n, c.n_kv_heads, c.head_dim}).clone();
    at::Tensor Vc = at::from_blob(vc.data(), {n, c.n_kv_heads, c.head_dim}).clone();
    EXPECT_LT((K - Kc).abs().max().item<double>(), 1e-5) << "layer " << l;
    EXPECT_LT((V - Vc).abs().max().item<double>(), 1e-5) << "layer " << l;
    // And it really is quantized: 2-bit values differ from the inputs.
    EXPECT_GT((V.narrow(0, 0, 64) - steps[0].v[l].narrow(0, 0, 64)).abs().max().item<double>(),
              0.05);
  }
}

TEST(KiviKernel, ForkContinuesLikeTheOriginalAndTruncateRestoresTheResidual) {
  const ModelConfig c = synthetic_config();
  CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto p = kParams;
  p["store"] = "kernel";
  auto kv = make(ctx, p);
  auto& store = dynamic_cast<KiviKernelKvCache&>(*kv);
  run_step(*kv, make_step(c, {1}, {0}, {100}, 3));
  kv->fork(1, 2);
  for (int t = 0; t < 30; ++t) {
    Step one = make_step(c, {1}, {100 + t}, {1}, 50 + t);
    Step two = one;
    two.batch.seq_ids = {2};
    std::vector<at::Tensor> oa = run_step(*kv, one), ob = run_step(*kv, two);
    for (size_t l = 0; l < oa.size(); ++l) ASSERT_TRUE(at::equal(oa[l], ob[l])) << t;
  }
  // 130 tokens at R = 64: keys 0..127 quantized, values 0..65. Back to 100: keys 64..99 and values
  // 36..99 return to the residual, as their dequantized values.
  auto before = store.dequantized(0, 2);
  const Footprint f0 = kv->footprint();
  kv->truncate(2, 100);
  EXPECT_EQ(kv->seq_len(2), 100);
  auto after = store.dequantized(0, 2);
  // (rounded to the fp16 residual: relative 2^-11)
  EXPECT_TRUE(at::allclose(after.first, before.first.narrow(0, 0, 100), 1e-3, 1e-4));
  EXPECT_TRUE(at::allclose(after.second, before.second.narrow(0, 0, 100), 1e-3, 1e-4));
  // Two pages fewer (keys 64..127 and values 36..65 left them), 34 more residual rows.
  const Footprint f1 = kv->footprint();
  EXPECT_EQ(f0.device_metadata_bytes - f1.device_metadata_bytes,
            c.n_layers * 2 * kernels::kivi_page_meta_bytes(store.layout()));
  EXPECT_EQ(f1.device_payload_bytes - f0.device_payload_bytes,
            c.n_layers * (34 * c.kv_dim() * 2 - 2 * kernels::kivi_page_code_bytes(store.layout())));
  // Decoding on after the truncation still equals exact attention over the store.
  Step s = make_step(c, {2}, {100}, {1}, 999);
  std::vector<at::Tensor> o = run_step(*kv, s);
  auto [K, V] = store.dequantized(1, 2);
  at::Tensor want = attend_dense(s.q[1].to(at::kHalf).to(at::kFloat), K, V, 0.125f);
  EXPECT_LT((o[1] - want).abs().max().item<double>(), 3e-3);
  // Releasing returns the pages: a new sequence reuses them without growing the pools.
  kv->release(1);
  kv->release(2);
  const Footprint empty = kv->footprint();
  EXPECT_EQ(empty.device_payload_bytes, 0);
  EXPECT_EQ(empty.tokens_held, 0);
}

TEST(KiviKernel, ForkSharesPagesAndCopiesThemOnWrite) {
  // A fork shares the prompt's pages (the ledger counts them once); each branch then writes its own
  // copy of a page before appending into it. Both branches decode exactly like independent
  // sequences fed the same tokens.
  const ModelConfig c = synthetic_config();
  CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto p = kParams;  // K4V2, G 32, R 64
  p["store"] = "kernel";
  auto shared = make(ctx, p), alone = make(ctx, p);
  const Step prompt = make_step(c, {1}, {0}, {300}, 21);
  run_step(*shared, prompt);
  const Footprint before = shared->footprint();
  shared->fork(1, 2);
  const Footprint after = shared->footprint();
  EXPECT_EQ(after.device_metadata_bytes, before.device_metadata_bytes);  // no page copied
  EXPECT_EQ(after.tokens_held, 600);
  Step p2 = prompt;
  p2.batch.seq_ids = {2};
  run_step(*alone, prompt);
  run_step(*alone, p2);  // the independent twin of the fork
  EXPECT_GT(alone->footprint().device_metadata_bytes, after.device_metadata_bytes);
  for (int t = 0; t < 100; ++t) {
    // Different tokens per branch; the batch order alternates (ring gather path).
    const bool rev = t % 2 == 1;
    std::vector<int64_t> ids = rev ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 2};
    Step s = make_step(c, ids, {300 + t, 300 + t}, {1, 1}, 500 + t);
    std::vector<at::Tensor> oa = run_step(*shared, s), ob = run_step(*alone, s);
    for (size_t l = 0; l < oa.size(); ++l) ASSERT_TRUE(at::equal(oa[l], ob[l])) << "step " << t;
  }
  // Only the pages the branches wrote into were copied, once per branch at most.
  const double copies = shared->counters().at("cow_page_copies");
  EXPECT_GT(copies, 0);
  EXPECT_LE(copies, 2 * 4);
  EXPECT_LT(shared->footprint().device_metadata_bytes, alone->footprint().device_metadata_bytes);
  shared->release(1);
  shared->release(2);
  EXPECT_EQ(shared->footprint().device_metadata_bytes, 0);
}

TEST(KiviKernel, LedgerCountsPagesResidualAndReservedRoom) {
  const ModelConfig c = synthetic_config();
  CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto kv = make(ctx, {{"preset", "kivi-2"}, {"store", "kernel"}});  // G 32, R 128
  run_step(*kv, make_step(c, {1, 2}, {0, 0}, {1000, 300}, 5));
  const kernels::KiviLayout& L = dynamic_cast<KiviKernelKvCache&>(*kv).layout();
  int64_t pages = 0, residual_rows = 0;
  for (int64_t n : {1000, 300}) {
    pages += kernels::kivi_pages_needed(L, n);
    residual_rows += 2 * n - kernels::kivi_k_quant_len(L, n) - kernels::kivi_v_quant_len(L, n);
  }
  const int64_t row = c.kv_dim() * 2;  // fp16 residual rows
  const Footprint f = kv->footprint();
  EXPECT_EQ(f.device_payload_bytes,
            c.n_layers * (pages * kernels::kivi_page_code_bytes(L) + residual_rows * row));
  EXPECT_EQ(f.device_metadata_bytes, c.n_layers * pages * kernels::kivi_page_meta_bytes(L));
  EXPECT_EQ(f.device_index_bytes, pages * 4 + 2 * 4);
  EXPECT_GT(f.device_reserved_bytes, 0);
  EXPECT_EQ(f.tokens_held, 1300);
  EXPECT_EQ(f.logical_bytes, 1300 * c.kv_bytes_per_token(4));
  // 2-bit codes + 32/32 bits of metadata, plus the 128-token fp16 residual: far below fp32.
  const double bits = kv->counters().at("effective_bits_per_element");
  EXPECT_GT(bits, 3.0);
  EXPECT_LT(bits, 8.0);
  EXPECT_LT(f.physical_bytes() * 4, f.logical_bytes);
}

TEST(KiviKernel, EngineOnStoriesDecodesThroughTheKernelCloseToTheCodecStore) {
  static std::shared_ptr<Model> m = load_model(test::models_dir() + "/stories260K");
  CacheContext ctx{m->config, m->device, m->dtype};
  auto run = [&](const std::string& store, std::map<std::string, double>* counters) {
    Engine e(m,
             make(ctx, {{"k_bits", 4}, {"v_bits", 4}, {"residual_length", 32}, {"store", store}}));
    std::vector<int64_t> ids = {e.new_sequence(), e.new_sequence()};
    std::vector<std::vector<int64_t>> prompts(2);
    for (int i = 0; i < 2; ++i) {
      prompts[i].push_back(1);
      for (int j = 1; j < 70 + 30 * i; ++j) prompts[i].push_back(3 + (j * 37 + i * 11) % 500);
    }
    e.prefill(ids, prompts);
    std::vector<at::Tensor> rows;
    for (int step = 0; step < 60; ++step)
      rows.push_back(e.decode(ids, {300 + step % 50, 200 + (step * 7) % 90}));
    *counters = e.kv().counters();
    return at::cat(rows);
  };
  std::map<std::string, double> ck, cc;
  at::Tensor a = run("kernel", &ck), b = run("codec", &cc);
  EXPECT_EQ(ck.at("decode_kernel_steps"), 60);
  EXPECT_EQ(ck.at("kernel_store"), 1);
  EXPECT_EQ(cc.count("kernel_store"), 0u);
  const double diff = (a - b).abs().max().item<double>(), scale = b.abs().max().item<double>();
  EXPECT_LT(diff, 0.05 * scale);
  EXPECT_GT(a.argmax(-1).eq(b.argmax(-1)).to(at::kFloat).mean().item<double>(), 0.9);
}

TEST(KiviKernel, RefusesWhatTheKernelsCannotServeNamingTheParameter) {
  const ModelConfig c = synthetic_config();
  CacheContext ctx{c, c10::Device(c10::kCPU), at::kFloat};
  auto expect_error = [&](nlohmann::json p, const std::string& want) {
    p["store"] = "kernel";
    try {
      make(ctx, p);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error({{"key_mode", "per_token"}}, "key_mode per_token");
  expect_error({{"residual_dtype", "fp32"}}, "residual_dtype fp32");
  expect_error({{"k_bits", 3}}, "k_bits 3");
  // The CUDA decode kernel is a CUDA choice: on the CPU only its default passes.
  expect_error({{"cuda_decode", "tensor_cores"}}, "method kivi: cuda_decode=tensor_cores");
  expect_error({{"cuda_decode", "auto"}}, "method kivi: cuda_decode=auto");
  // auto on the CPU is the codec store (the accuracy reference), with every setting.
  auto p = kParams;
  p["key_mode"] = "per_token";
  EXPECT_NE(dynamic_cast<CodecKvCache*>(MethodRegistry::instance().create("kivi", ctx, p).get()),
            nullptr);
}

TEST(KiviKernel, CudaStoreMatchesTheCpuStore) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  const ModelConfig c = synthetic_config();
  for (int bits : {2, 4, 8}) {
    CacheContext cpu{c, c10::Device(c10::kCPU), at::kFloat};
    CacheContext gpu{c, c10::Device("cuda"), at::kHalf};
    nlohmann::json p = {{"k_bits", bits},
                        {"v_bits", bits},
                        {"group_size", 32},
                        {"residual_length", 64},
                        {"store", "kernel"}};
    nlohmann::json pg = p;
    pg["cuda_decode"] = bits == 4 ? "tensor_cores" : "auto";  // both CUDA decode kernels
    auto a = make(cpu, p), b = make(gpu, pg);
    auto feed = [&](const Step& s) {
      std::vector<at::Tensor> oa = run_step(*a, s);
      Step h = s;
      for (auto* v : {&h.q, &h.k, &h.v})
        for (auto& t : *v) t = t.to(c10::Device("cuda")).to(at::kHalf);
      std::vector<at::Tensor> ob = run_step(*b, h);
      double worst = 0;
      for (size_t l = 0; l < oa.size(); ++l)
        worst =
            std::max(worst, (oa[l] - ob[l].to(at::kCPU).to(at::kFloat)).abs().max().item<double>());
      return worst;
    };
    // The CPU store takes fp32 rows and rounds them to fp16 itself; the GPU store gets fp16 rows:
    // the same stored bytes. Prefill is exact attention on both (fp32 vs fp16 compute).
    feed(make_step(c, {1, 2}, {0, 0}, {54, 300}, 11));
    double worst = 0;
    for (int t = 0; t < 80; ++t)
      worst = std::max(worst, feed(make_step(c, {1, 2}, {54 + t, 300 + t}, {1, 1}, 40 + t)));
    EXPECT_LT(worst, 5e-3) << bits << " bits";
    EXPECT_TRUE(dynamic_cast<KiviKernelKvCache&>(*b).last_step_used_decode_kernel());
  }
}

}  // namespace
}  // namespace kvb
