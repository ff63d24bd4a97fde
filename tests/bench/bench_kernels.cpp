// CPU micro-benchmarks of the decode and cache kernels (decode_attention.h, kivi_cache.h,
// kv_append.h) with a same-process memory-copy ceiling (report CPU kernels
// as a fraction of a 2-thread copy). Bytes counters count what each kernel reads: K/V payload
// (codes, scales, mins, residual rows) plus index arrays; the "fp16_equiv" counter counts the fp16
// K/V of the same context, so its rate against the fp16 kernel's is the user-visible speedup.
// Inputs are random and rotate over enough sets to exceed the last-level cache.
//
//   ./build/tests/bench/kvb_bench --benchmark_filter=Decode --benchmark_min_time=0.5

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "decode_test_util.h"
#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/kivi_cache.h"
#include "kvb/kernels/threads.h"

namespace kvb::kernels {
namespace {

constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128;
constexpr size_t kCacheBytes = size_t(64) << 20;  // rotate until the sets span this much

double fp16_bytes(int batch, int ctx) { return 2.0 * batch * ctx * kKvHeads * kHeadDim * 2; }

// The copy ceiling: memcpy over two 256 MiB buffers by `threads` threads, bytes read + written.
void BM_CopyCeiling(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const size_t bytes = size_t(256) << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : st) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t chunk = bytes / threads;
        std::memcpy(b.data() + t * chunk, a.data() + t * chunk, chunk);
      });
    for (auto& t : ts) t.join();
    benchmark::DoNotOptimize(b.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 2 * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_CopyCeiling)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// Dense (mode 0), token-gathered (1) or page-gathered (2, 25%) decode over fp16 (dt 0) / bf16 (1).
void BM_Decode(benchmark::State& st) {
  const int batch = static_cast<int>(st.range(0)), ctx = static_cast<int>(st.range(1));
  const auto mode = static_cast<GatherMode>(st.range(2));
  const KvDtype dt = st.range(3) ? KvDtype::kBF16 : KvDtype::kF16;
  std::mt19937 rng(1);
  const size_t set_bytes = static_cast<size_t>(fp16_bytes(batch, ctx));
  const int sets =
      static_cast<int>(std::clamp<size_t>(kCacheBytes / std::max<size_t>(set_bytes, 1) + 1, 1, 8));
  std::vector<testing::PagedCache> cs;
  for (int i = 0; i < sets; ++i) {
    cs.push_back(testing::make_paged_cache(dt, std::vector<int32_t>(batch, ctx), kKvHeads, kGroup,
                                           kHeadDim, 16, rng));
    if (mode == GatherMode::kTokens) testing::set_token_gather(cs.back(), 0.25, rng);
    if (mode == GatherMode::kPages) testing::set_page_gather(cs.back(), 0.25, rng);
  }
  std::vector<uint16_t> o(cs[0].out_elems());
  int i = 0;
  for (auto _ : st) {
    decode_attention_cpu(cs[i++ % sets].params(o.data()));
    benchmark::DoNotOptimize(o.data());
  }
  const auto& c = cs[0];
  double attended = 0;
  for (int b = 0; b < batch; ++b)
    attended += static_cast<double>(decode_scan_len(c.params(o.data()), b));
  const double bytes = 2.0 * attended * kKvHeads * kHeadDim * 2 +
                       4.0 * (c.page_indices.size() + c.gather_indices.size());
  st.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                            benchmark::Counter::kIs1000);
  st.counters["fp16_equiv"] =
      benchmark::Counter(fp16_bytes(batch, ctx), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Decode)
    ->ArgNames({"batch", "ctx", "gather", "bf16"})
    ->Args({1, 4096, 0, 0})
    ->Args({1, 32768, 0, 0})
    ->Args({1, 32768, 0, 1})
    ->Args({4, 8192, 0, 0})
    ->Args({1, 32768, 1, 0})
    ->Args({1, 32768, 2, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_KiviDecode(benchmark::State& st) {
  const int batch = static_cast<int>(st.range(0)), ctx = static_cast<int>(st.range(1)),
            bits = static_cast<int>(st.range(2));
  KiviLayout L;
  L.num_kv_heads = kKvHeads;
  L.head_dim = kHeadDim;
  L.page_size = 32;
  L.k_bits = L.v_bits = bits;
  L.v_group_size = 32;
  L.residual_length = 128;
  std::mt19937 rng(2);
  auto s = testing::make_kivi_store(KvDtype::kF16, L, kGroup, batch, ctx, rng);
  testing::kivi_append_random(s, std::vector<int32_t>(batch, ctx), rng, kivi_append_cpu);
  s.q = testing::random_bits(s.out_elems(), KvDtype::kF16, rng);
  std::vector<uint16_t> o(s.out_elems());
  const KiviDecodeParams p = s.decode_params(o.data());
  for (auto _ : st) {
    kivi_decode_cpu(p);
    benchmark::DoNotOptimize(o.data());
  }
  const double bytes =
      static_cast<double>(batch) * kKvHeads * kivi_decode_kv_bytes(L, KvDtype::kF16, ctx);
  st.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                            benchmark::Counter::kIs1000);
  st.counters["fp16_equiv"] =
      benchmark::Counter(fp16_bytes(batch, ctx), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_KiviDecode)
    ->ArgNames({"batch", "ctx", "bits"})
    ->Args({1, 32768, 4})
    ->Args({1, 32768, 2})
    ->Args({4, 8192, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One decode step's quantize-and-append for a batch (the residual window slides every step).
void BM_KiviAppend(benchmark::State& st) {
  const int batch = static_cast<int>(st.range(0));
  KiviLayout L;
  L.num_kv_heads = kKvHeads;
  L.head_dim = kHeadDim;
  L.page_size = 32;
  L.k_bits = L.v_bits = 2;
  L.v_group_size = 32;
  L.residual_length = 128;
  std::mt19937 rng(3);
  const int steps = 4096;
  auto s = testing::make_kivi_store(KvDtype::kF16, L, kGroup, batch, 256 + steps + 8, rng);
  testing::kivi_append_random(s, std::vector<int32_t>(batch, 256), rng, kivi_append_cpu);
  std::vector<int32_t> indptr(batch + 1);
  for (int b = 0; b <= batch; ++b) indptr[b] = b;
  const auto k_new =
      testing::random_bits(static_cast<size_t>(batch) * kKvHeads * kHeadDim, KvDtype::kF16, rng);
  const auto v_new = testing::random_bits(k_new.size(), KvDtype::kF16, rng);
  int done = 0;
  for (auto _ : st) {
    if (done == steps) {
      st.SkipWithError("store full");
      break;
    }
    s.grow_pages(std::vector<int32_t>(batch, 1));
    kivi_append_cpu(s.append_params(k_new, v_new, indptr));
    for (auto& n : s.kv_lens) ++n;
    ++done;
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * batch);
}
BENCHMARK(BM_KiviAppend)->Arg(1)->Arg(16)->Iterations(2048)->Unit(benchmark::kMicrosecond);

// A batched decode step's matmul on one thread: `rows` activation rows against SmolLM2-135M's
// gate/up projection (576 -> 1536), weights rotating over sets that exceed the last-level cache (as
// a decode step's weights come from memory). tiled 1: gemm_nt_rows, the register-tiled kernel;
// tiled 0: the BLAS (gemm_nt), what linear_f32 uses past kMaxTiledRows. The flops counter against
// the core's peak shows which bound each meets; the crossover sets kMaxTiledRows.
void BM_LinearRows(benchmark::State& st) {
  const int64_t rows = st.range(0), in = 576, out = 1536;
  const bool tiled = st.range(1) != 0;
  set_cpu_threads(1);  // the BLAS on one thread too, as linear_f32 holds it
  const size_t w_floats = static_cast<size_t>(in * out);
  const size_t sets = std::max<size_t>(2, kCacheBytes / (w_floats * sizeof(float)));
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(sets * w_floats), x(static_cast<size_t>(rows * in)), y(rows * out);
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  size_t set = 0;
  for (auto _ : st) {
    const float* ws = w.data() + set * w_floats;
    if (tiled)
      detail::gemm_nt_rows(rows, out, in, x.data(), in, ws, in, 0.f, y.data(), out);
    else
      detail::gemm_nt(rows, out, in, x.data(), in, ws, in, 0.f, y.data(), out);
    benchmark::DoNotOptimize(y.data());
    set = (set + 1) % sets;
  }
  st.counters["flops"] =
      benchmark::Counter(2.0 * rows * in * out * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LinearRows)
    ->ArgNames({"rows", "tiled"})
    ->ArgsProduct({{2, 4, 8, 16, 32, 64}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvb::kernels

BENCHMARK_MAIN();
