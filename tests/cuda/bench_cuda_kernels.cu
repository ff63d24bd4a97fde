// GPU micro-benchmarks of kvbench's decode kernels, measured against a device-to-device copy timed
// in the same process. Built, not run by ctest.
//
//   kvb_cuda_bench --json=PATH [--quick] [--filter=SUBSTR]   built-in runner: every case, a JSON
//                                                            file and a table on stdout
//   kvb_cuda_bench --smoke --json=PATH                       tiny shapes, exit 1 unless every case
//                                                            ran with finite outputs (run on the
//                                                            CPU by the emulator, tests/cuda_emu)
//   kvb_cuda_bench --list                                    the plan only (no device needed)
//   kvb_cuda_bench --benchmark_filter=...                    Google Benchmark (when linked)
//
// Protocol: inputs are random (never zeros) with random page ids; each timed launch is bracketed by
// CUDA events; at least 25 ms of warm-up; at least 10 samples and 0.3 s; the median, p10 and p90
// are reported; input sets rotate so that consecutive launches never hit data left in L2 (sets are
// replicated until they span 4x the L2 size). Bytes: everything the kernel reads or writes once:
// K/V payload (codes, scales, mins, residual rows), page-table and index entries, q, o and the
// split workspace (written and read back). fp16-equivalent bytes: the K/V of the same full context
// at fp16 (what a dense fp16 decode reads), so fp16_equiv_gbps / fp16 kernel's gbps is the
// user-visible speedup.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common.cuh"  // KVB_LAUNCH
#include "kvb_cuda.cuh"

#if KVB_HAVE_GBENCH
#include <benchmark/benchmark.h>
#endif

namespace kc = kvb::kernels::cuda;
using kvb::kernels::DecodeAttentionParams;
using kvb::kernels::GatherMode;
using kvb::kernels::KiviDecodeParams;
using kvb::kernels::KiviLayout;
using kvb::kernels::KvDtype;

namespace {

#define BENCH_CUDA(x)                                                                      \
  do {                                                                                     \
    const cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "kvb_cuda_bench: %s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

// Llama-3-8B attention shape.
constexpr int kKvHeads = 8, kQoHeads = 32, kHeadDim = 128;

struct Shape {
  int batch, context;
};

struct CaseResult {
  std::string kernel;
  Shape shape{};
  int splits = 1;
  int sets = 1;
  double median_us = 0, p10_us = 0, p90_us = 0;
  int n = 0;
  double bytes = 0, fp16_bytes = 0;
  bool finite = true;
  std::string note;
  // --smoke under the CUDA emulator: the bytes of the distinct 32-byte sectors one launch read
  // through __ldg, and what the byte accounting above says those reads are (K/V payload, page and
  // index entries, and q where the kernel loads it with __ldg), so the GB/s denominators are
  // checked against what the kernel really touches.
  double traced_bytes = -1, traced_expected = 0;
};

__global__ void fill_random_u16(uint16_t* p, size_t n, uint32_t seed, int mode) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h =
        static_cast<uint32_t>(i) * 2654435761u ^ (seed * 97531u + static_cast<uint32_t>(i >> 32));
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h & 0xffffff) / 16777216.0f;  // [0, 1)
    float x;
    if (mode == 0)
      x = (u - 0.5f) * 4.0f;  // values: about N(0, 1.15)
    else if (mode == 1)
      x = 0.01f + u * 0.1f;  // scales: positive
    else
      x = (u - 0.5f) * 2.0f;  // mins
    p[i] = mode == 3 ? __bfloat16_as_ushort(__float2bfloat16_rn((u - 0.5f) * 4.0f))
                     : __half_as_ushort(__float2half_rn(x));
  }
}

__global__ void fill_random_u8(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed * 40503u);
    h ^= h >> 16;
    h *= 2246822519u;
    p[i] = static_cast<uint8_t>(h >> 7);
  }
}

// Owns device memory.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevMem(size_t b) : bytes(b) { BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(b, 16))); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
using Mem = std::unique_ptr<DevMem>;
Mem alloc(size_t b) { return std::make_unique<DevMem>(b); }

// Grid-stride fills: at most 1024 blocks of 256, fewer for small buffers.
unsigned fill_blocks(size_t n) {
  return static_cast<unsigned>(std::min<size_t>(1024, (n + 255) / 256));
}
void fill16(const Mem& m, uint32_t seed, int mode) {
  const size_t n = m->bytes / 2;
  KVB_LAUNCH(fill_blocks(n), 256, 0, nullptr, fill_random_u16)(m->as<uint16_t>(), n, seed, mode);
  BENCH_CUDA(cudaGetLastError());
}
void fill8(const Mem& m, uint32_t seed) {
  KVB_LAUNCH(fill_blocks(m->bytes), 256, 0, nullptr, fill_random_u8)
  (m->as<uint8_t>(), m->bytes, seed);
  BENCH_CUDA(cudaGetLastError());
}
Mem upload(const std::vector<int32_t>& h) {
  Mem m = alloc(h.size() * 4);
  BENCH_CUDA(cudaMemcpy(m->p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  return m;
}

struct Device {
  int sms = 0;
  size_t l2_bytes = 0;
  std::string name;
};

Device device_info() {
  Device d;
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  d.sms = prop.multiProcessorCount;
  d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  d.name = prop.name;
  return d;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * (v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  return i + 1 < v.size() ? v[i] + (pos - i) * (v[i + 1] - v[i]) : v.back();
}

bool g_smoke =
    false;  // --smoke: 2 samples after 1 warm-up launch (a run of the code, not a timing)

// Times launch(set) over rotating input sets; fills res with median/p10/p90 in microseconds.
void time_launches(const std::function<void(int)>& launch, int sets, bool quick, CaseResult& res) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  int it = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double warm_s = quick ? 0.01 : 0.025;
  do {  // warm-up: at least warm_s and 3 launches
    launch(it++ % sets);
    BENCH_CUDA(cudaDeviceSynchronize());
  } while (!g_smoke &&
           (it < 3 ||
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < warm_s));
  std::vector<double> us;
  double total_s = 0;
  const double min_s = quick ? 0.05 : 0.3;
  const int min_n = g_smoke ? 2 : 10, max_n = g_smoke ? 2 : quick ? 50 : 400;
  while ((static_cast<int>(us.size()) < min_n || total_s < min_s) &&
         static_cast<int>(us.size()) < max_n) {
    BENCH_CUDA(cudaEventRecord(a));
    launch(it++ % sets);
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
    total_s += ms * 1e-3;
  }
  BENCH_CUDA(cudaGetLastError());
  res.median_us = percentile(us, 50);
  res.p10_us = percentile(us, 10);
  res.p90_us = percentile(us, 90);
  res.n = static_cast<int>(us.size());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

// Device-to-device copy bandwidth, bytes read + written: the ceiling measured in this process.
double copy_gbps(size_t bytes, bool quick) {
  Mem src = alloc(bytes), dst = alloc(bytes);
  fill8(src, 1);
  CaseResult r;
  time_launches(
      [&](int) { BENCH_CUDA(cudaMemcpyAsync(dst->p, src->p, bytes, cudaMemcpyDeviceToDevice)); }, 1,
      quick, r);
  return 2.0 * bytes / (r.median_us * 1e-6) / 1e9;
}

// Under the emulator with --smoke: one more launch with __ldg's sectors counted.
void trace_reads(CaseResult& r, const std::function<void()>& launch) {
#if KVB_CUDA_EMU
  if (!g_smoke) return;
  kvb::emu::start_read_tracking();
  launch();
  r.traced_bytes = static_cast<double>(kvb::emu::stop_read_tracking());
#else
  (void)r;
  (void)launch;
#endif
}

// Random page tables for `batch` sequences of `context` tokens at page size ps.
struct Table {
  std::vector<int32_t> indptr, indices, lens;
  int pages = 0;
};
Table make_table(int batch, int context, int ps, std::mt19937& rng) {
  Table t;
  const int per = (context + ps - 1) / ps;
  t.pages = batch * per;
  t.indices.resize(t.pages);
  std::iota(t.indices.begin(), t.indices.end(), 0);
  std::shuffle(t.indices.begin(), t.indices.end(), rng);
  t.indptr.resize(batch + 1);
  for (int b = 0; b <= batch; ++b) t.indptr[b] = b * per;
  t.lens.assign(batch, context);
  return t;
}

int rotation_sets(double set_bytes, const Device& d) {
  const double want = 4.0 * static_cast<double>(d.l2_bytes);
  return std::max(1, std::min(16, static_cast<int>(std::ceil(want / std::max(set_bytes, 1.0)))));
}

bool outputs_finite(const Mem& o, size_t n, KvDtype dt) {
  std::vector<uint16_t> h(n);
  BENCH_CUDA(cudaMemcpy(h.data(), o->p, n * 2, cudaMemcpyDeviceToHost));
  for (uint16_t x : h) {
    const uint32_t exp = dt == KvDtype::kBF16 ? (x >> 7) & 0xff : (x >> 10) & 0x1f;
    if (exp == (dt == KvDtype::kBF16 ? 0xffu : 0x1fu)) return false;
  }
  return true;
}

double fp16_kv_bytes(const Shape& s) {
  return 2.0 * s.batch * s.context * kKvHeads * kHeadDim * 2.0;
}

// ---- one case: a kernel on a shape ----

// Dense or gathered paged decode; gather_frac < 1 keeps that fraction of tokens or pages.
CaseResult bench_paged(const Shape& s, KvDtype dt, GatherMode mode, double frac, const Device& dev,
                       bool quick, kc::DecodeKernel kernel = kc::DecodeKernel::kCudaCores) {
  CaseResult r;
  r.shape = s;
  r.kernel = std::string(mode == GatherMode::kNone     ? "paged_"
                         : mode == GatherMode::kTokens ? "gather_tokens_"
                                                       : "gather_pages_") +
             kvb::kernels::kv_dtype_name(dt);
  if (mode != GatherMode::kNone)
    r.kernel += "_" + std::to_string(static_cast<int>(frac * 100)) + "pct";
  const int ps = 16;
  std::mt19937 rng(static_cast<uint32_t>(s.batch * 131 + s.context));
  const Table t = make_table(s.batch, s.context, ps, rng);
  const size_t pool = static_cast<size_t>(t.pages) * ps * kKvHeads * kHeadDim * 2;
  std::vector<int32_t> gptr(1, 0), gidx;
  int64_t attended = 0, scan_max = 0;
  if (mode == GatherMode::kTokens) {
    const int keep = std::max(1, static_cast<int>(s.context * frac));
    for (int b = 0; b < s.batch; ++b) {
      std::vector<int32_t> all(s.context);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(keep);
      std::sort(all.begin(),
                all.end());  // kept-token lists are ordered, as an eviction store keeps them
      gidx.insert(gidx.end(), all.begin(), all.end());
      gptr.push_back(static_cast<int32_t>(gidx.size()));
    }
    attended = keep;
    scan_max = keep;
  } else if (mode == GatherMode::kPages) {
    const int per = (s.context + ps - 1) / ps, keep = std::max(1, static_cast<int>(per * frac));
    for (int b = 0; b < s.batch; ++b) {
      std::vector<int32_t> all(per);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(keep);
      gidx.insert(gidx.end(), all.begin(), all.end());
      gptr.push_back(static_cast<int32_t>(gidx.size()));
    }
    attended = static_cast<int64_t>(keep) * ps;
    scan_max = attended;
  } else {
    attended = s.context;
    scan_max = s.context;
  }
  const double kv_payload = 2.0 * s.batch * attended * kKvHeads * kHeadDim * 2.0;
  const int sets = rotation_sets(kv_payload, dev);
  r.sets = sets;
  std::vector<Mem> ks, vs, qs;
  for (int i = 0; i < sets; ++i) {
    ks.push_back(alloc(pool));
    vs.push_back(alloc(pool));
    qs.push_back(alloc(static_cast<size_t>(s.batch) * kQoHeads * kHeadDim * 2));
    fill16(ks.back(), 10 + i, dt == KvDtype::kBF16 ? 3 : 0);
    fill16(vs.back(), 20 + i, dt == KvDtype::kBF16 ? 3 : 0);
    fill16(qs.back(), 30 + i, dt == KvDtype::kBF16 ? 3 : 0);
  }
  Mem o = alloc(static_cast<size_t>(s.batch) * kQoHeads * kHeadDim * 2);
  Mem ip = upload(t.indptr), ix = upload(t.indices), ln = upload(t.lens);
  Mem gp = upload(gptr), gx = upload(gidx.empty() ? std::vector<int32_t>{0} : gidx);
  DecodeAttentionParams p;
  p.dtype = dt;
  p.o = o->p;
  p.page_indptr = ip->as<int32_t>();
  p.page_indices = ix->as<int32_t>();
  p.kv_lens = ln->as<int32_t>();
  p.gather = mode;
  p.gather_indptr = mode == GatherMode::kNone ? nullptr : gp->as<int32_t>();
  p.gather_indices = mode == GatherMode::kNone ? nullptr : gx->as<int32_t>();
  p.batch_size = s.batch;
  p.num_qo_heads = kQoHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.page_size = ps;
  p.max_scan_len = static_cast<int32_t>(mode == GatherMode::kPages ? scan_max : scan_max);
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.q = qs[0]->p;
  p.k_pages = ks[0]->p;
  p.v_pages = vs[0]->p;
  std::string why;
  if (!kc::decode_attention_supported(p, &why)) {
    r.note = "unsupported: " + why;
    return r;
  }
  const kc::DecodePlan plan = kc::decode_attention_plan(p);
  r.splits = plan.num_splits;
  Mem ws = alloc(plan.workspace_bytes);
  BENCH_CUDA(cudaMemset(o->p, 0xff, o->bytes));  // poison
  time_launches(
      [&](int i) {
        p.q = qs[i]->p;
        p.k_pages = ks[i]->p;
        p.v_pages = vs[i]->p;
        BENCH_CUDA(kc::decode_attention_cuda(p, plan, ws->p, nullptr, kernel));
      },
      sets, quick, r);
  r.finite = outputs_finite(o, o->bytes / 2, dt);
  trace_reads(r, [&] { BENCH_CUDA(kc::decode_attention_cuda(p, plan, ws->p, nullptr, kernel)); });
  const double pages_read = mode == GatherMode::kPages
                                ? static_cast<double>(gidx.size())
                                : static_cast<double>(s.batch) * ((attended + ps - 1) / ps);
  const double meta = 4.0 * (pages_read + 2 * s.batch + 1 + gidx.size());
  const double qo = 2.0 * 2 * s.batch * kQoHeads * kHeadDim;
  const double ws_bytes =
      plan.num_splits > 1 ? 2.0 * s.batch * kQoHeads * plan.num_splits * (kHeadDim + 2) * 4 : 0;
  r.bytes = kv_payload + meta + qo + ws_bytes;
  r.fp16_bytes = fp16_kv_bytes(s);
  r.traced_expected = kv_payload + 4.0 * (pages_read + gidx.size()) + qo / 2;
  return r;
}

// KIVI decode on CUDA cores, or (tc) with whole quantized pages on tensor cores.
CaseResult bench_kivi(const Shape& s, int bits, bool tc, const Device& dev, bool quick) {
  CaseResult r;
  r.shape = s;
  r.kernel = "kivi" + std::to_string(bits) + (tc ? "_tc" : "");
  const kc::KiviDecodeKernel kernel =
      tc ? kc::KiviDecodeKernel::kTensorCores : kc::KiviDecodeKernel::kCudaCores;
  KiviLayout L;
  L.num_kv_heads = kKvHeads;
  L.head_dim = kHeadDim;
  L.page_size = 32;
  L.k_bits = L.v_bits = bits;
  L.v_group_size = 32;
  L.residual_length = 128;
  const int64_t U = kvb::kernels::kivi_residual_capacity(L);
  const int ctx = s.context;  // tokens in the store
  const int pages_per = static_cast<int>(kvb::kernels::kivi_pages_needed(L, ctx));
  std::mt19937 rng(static_cast<uint32_t>(s.batch * 7 + ctx + bits));
  Table t;
  t.pages = s.batch * std::max(1, pages_per);
  t.indices.resize(t.pages);
  std::iota(t.indices.begin(), t.indices.end(), 0);
  std::shuffle(t.indices.begin(), t.indices.end(), rng);
  for (int b = 0; b <= s.batch; ++b) t.indptr.push_back(b * std::max(1, pages_per));
  t.lens.assign(s.batch, ctx);
  const size_t blocks = static_cast<size_t>(t.pages) * kKvHeads;
  const size_t kcb = blocks * kvb::kernels::kivi_k_page_bytes(L),
               vcb = blocks * kvb::kernels::kivi_v_page_bytes(L);
  const size_t kmeta = blocks * kHeadDim * 2,
               vmeta = blocks * L.page_size * (kHeadDim / L.v_group_size) * 2;
  const size_t res = static_cast<size_t>(s.batch) * U * kKvHeads * kHeadDim * 2;
  const double kv_read = static_cast<double>(s.batch) * kKvHeads *
                         kvb::kernels::kivi_decode_kv_bytes(L, KvDtype::kF16, ctx);
  const int sets = rotation_sets(kv_read, dev);
  r.sets = sets;
  struct Set {
    Mem kc, vc, ks, km, vs, vm, kr, vr, q;
  };
  std::vector<Set> S;
  for (int i = 0; i < sets; ++i) {
    Set x{
        alloc(kcb),   alloc(vcb),   alloc(kmeta),
        alloc(kmeta), alloc(vmeta), alloc(vmeta),
        alloc(res),   alloc(res),   alloc(static_cast<size_t>(s.batch) * kQoHeads * kHeadDim * 2)};
    fill8(x.kc, 40 + i);
    fill8(x.vc, 50 + i);
    fill16(x.ks, 60 + i, 1);
    fill16(x.km, 61 + i, 2);
    fill16(x.vs, 62 + i, 1);
    fill16(x.vm, 63 + i, 2);
    fill16(x.kr, 64 + i, 0);
    fill16(x.vr, 65 + i, 0);
    fill16(x.q, 66 + i, 0);
    S.push_back(std::move(x));
  }
  Mem o = alloc(static_cast<size_t>(s.batch) * kQoHeads * kHeadDim * 2);
  Mem ip = upload(t.indptr), ix = upload(t.indices), ln = upload(t.lens);
  KiviDecodeParams p;
  p.dtype = KvDtype::kF16;
  p.layout = L;
  p.o = o->p;
  p.page_indptr = ip->as<int32_t>();
  p.page_indices = ix->as<int32_t>();
  p.kv_lens = ln->as<int32_t>();
  p.batch_size = s.batch;
  p.num_qo_heads = kQoHeads;
  p.max_kv_len = ctx;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  auto point = [&](int i) {
    const Set& x = S[i];
    p.q = x.q->p;
    p.k_codes = x.kc->as<uint8_t>();
    p.v_codes = x.vc->as<uint8_t>();
    p.k_scales = x.ks->as<uint16_t>();
    p.k_mins = x.km->as<uint16_t>();
    p.v_scales = x.vs->as<uint16_t>();
    p.v_mins = x.vm->as<uint16_t>();
    p.k_residual = x.kr->p;
    p.v_residual = x.vr->p;
  };
  point(0);
  std::string why;
  if (!(tc ? kc::kivi_decode_tc_supported(p, &why) : kc::kivi_decode_supported(p, &why))) {
    r.note = "unsupported: " + why;
    return r;
  }
  const kc::DecodePlan plan = kc::kivi_decode_plan(p);
  r.splits = plan.num_splits;
  Mem ws = alloc(plan.workspace_bytes);
  BENCH_CUDA(cudaMemset(o->p, 0xff, o->bytes));
  time_launches(
      [&](int i) {
        point(i);
        BENCH_CUDA(kc::kivi_decode_cuda(p, plan, ws->p, nullptr, kernel));
      },
      sets, quick, r);
  r.finite = outputs_finite(o, o->bytes / 2, KvDtype::kF16);
  trace_reads(r, [&] { BENCH_CUDA(kc::kivi_decode_cuda(p, plan, ws->p, nullptr, kernel)); });
  const double meta = 4.0 * (static_cast<double>(s.batch) * pages_per + 2 * s.batch + 1);
  const double qo = 2.0 * 2 * s.batch * kQoHeads * kHeadDim;
  const double ws_bytes =
      plan.num_splits > 1 ? 2.0 * s.batch * kQoHeads * plan.num_splits * (kHeadDim + 2) * 4 : 0;
  r.bytes = kv_read + meta + qo + ws_bytes;
  r.fp16_bytes = fp16_kv_bytes(s);
  r.traced_expected =
      kv_read + 4.0 * s.batch * pages_per;  // q goes to shared memory by plain loads
  return r;
}

struct Plan {
  std::vector<Shape> shapes;
  std::vector<std::string> kernels;
};

Plan make_plan(bool quick, bool smoke = false) {
  Plan p;
  if (smoke)
    p.shapes = {{2, 1100}};  // splits > 1 for every kernel, so the merge runs too
  else if (quick)
    p.shapes = {{1, 4096}, {16, 32768}};
  else
    p.shapes = {{1, 4096},   {1, 32768}, {1, 131072}, {16, 4096},
                {16, 32768}, {64, 4096}, {64, 8192}};
  p.kernels = {"paged_fp16",
               "paged_bf16",
               "paged_fp16_tc",
               "paged_bf16_tc",
               "kivi4",
               "kivi2",
               "kivi4_tc",
               "kivi2_tc",
               "gather_tokens_25pct",
               "gather_pages_25pct",
               "gather_tokens_25pct_tc",
               "gather_pages_25pct_tc"};
  return p;
}

CaseResult run_case(const std::string& k, const Shape& s, const Device& dev, bool quick) {
  if (k == "paged_fp16") return bench_paged(s, KvDtype::kF16, GatherMode::kNone, 1.0, dev, quick);
  if (k == "paged_bf16") return bench_paged(s, KvDtype::kBF16, GatherMode::kNone, 1.0, dev, quick);
  if (k == "paged_fp16_tc")
    return bench_paged(s, KvDtype::kF16, GatherMode::kNone, 1.0, dev, quick,
                       kc::DecodeKernel::kTensorCores);
  if (k == "paged_bf16_tc")
    return bench_paged(s, KvDtype::kBF16, GatherMode::kNone, 1.0, dev, quick,
                       kc::DecodeKernel::kTensorCores);
  if (k == "gather_tokens_25pct")
    return bench_paged(s, KvDtype::kF16, GatherMode::kTokens, 0.25, dev, quick);
  if (k == "gather_pages_25pct")
    return bench_paged(s, KvDtype::kF16, GatherMode::kPages, 0.25, dev, quick);
  if (k == "gather_tokens_25pct_tc")
    return bench_paged(s, KvDtype::kF16, GatherMode::kTokens, 0.25, dev, quick,
                       kc::DecodeKernel::kTensorCores);
  if (k == "gather_pages_25pct_tc")
    return bench_paged(s, KvDtype::kF16, GatherMode::kPages, 0.25, dev, quick,
                       kc::DecodeKernel::kTensorCores);
  if (k == "kivi4") return bench_kivi(s, 4, false, dev, quick);
  if (k == "kivi4_tc") return bench_kivi(s, 4, true, dev, quick);
  if (k == "kivi2_tc") return bench_kivi(s, 2, true, dev, quick);
  return bench_kivi(s, 2, false, dev, quick);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// The results as JSON (what scripts/device-check.sh tabulates), written to a temporary file and
// renamed over `path`, so that the file is always whole. copy_end 0: not measured yet.
bool write_json(const std::string& path, const Device& dev, double copy0, double copy_end,
                const std::vector<CaseResult>& results) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kvb_cuda_bench: cannot write %s\n", tmp.c_str());
    return false;
  }
  std::fprintf(f, "{\n  \"device\": {\"name\": \"%s\", \"sms\": %d, \"l2_bytes\": %zu},\n",
               json_escape(dev.name).c_str(), dev.sms, dev.l2_bytes);
  std::fprintf(f,
               "  \"copy_gbps\": %.3f,\n  \"copy_gbps_end\": %.3f,\n  \"shape\": "
               "{\"num_kv_heads\": %d, \"num_qo_heads\": %d, \"head_dim\": %d},\n",
               copy0, copy_end, kKvHeads, kQoHeads, kHeadDim);
  std::fprintf(f, "  \"cases\": [\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const CaseResult& r = results[i];
    std::fprintf(
        f,
        "    {\"kernel\": \"%s\", \"batch\": %d, \"context\": %d, \"splits\": %d, \"sets\": %d, "
        "\"median_us\": %.3f, \"p10_us\": %.3f, \"p90_us\": %.3f, \"n\": %d, \"bytes\": %.0f, "
        "\"fp16_bytes\": %.0f, \"finite\": %s, \"note\": \"%s\"}%s\n",
        r.kernel.c_str(), r.shape.batch, r.shape.context, r.splits, r.sets, r.median_us, r.p10_us,
        r.p90_us, r.n, r.bytes, r.fp16_bytes, r.finite ? "true" : "false",
        json_escape(r.note).c_str(), i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  const bool ok = std::fclose(f) == 0 && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) std::fprintf(stderr, "kvb_cuda_bench: cannot write %s\n", path.c_str());
  return ok;
}

int run_builtin(const std::string& json_path, bool quick, bool smoke, const std::string& filter) {
  const Device dev = device_info();
  const size_t copy_bytes = smoke   ? (size_t(4) << 20)
                            : quick ? (size_t(1) << 30)
                                    : (size_t(2) << 30);
  quick |= smoke;
  g_smoke = smoke;
  const double copy0 = copy_gbps(copy_bytes, quick);
  std::printf("device %s, %d SMs, L2 %.1f MB; D2D copy %.1f GB/s (read + write)\n",
              dev.name.c_str(), dev.sms, dev.l2_bytes / 1e6, copy0);
  const Plan plan = make_plan(quick, smoke);
  std::vector<CaseResult> results;
  for (const Shape& s : plan.shapes)
    for (const std::string& k : plan.kernels) {
      const std::string name =
          k + "/b" + std::to_string(s.batch) + "/ctx" + std::to_string(s.context);
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      CaseResult r = run_case(k, s, dev, quick);
      r.kernel = k;
      results.push_back(r);
      const double gbps = r.median_us > 0 ? r.bytes / (r.median_us * 1e-6) / 1e9 : 0;
      std::printf(
          "%-22s b%-3d ctx%-7d splits %-3d %10.1f us  [%.1f, %.1f] n=%d  %8.1f GB/s  %5.1f%% "
          "copy%s%s\n",
          k.c_str(), s.batch, s.context, r.splits, r.median_us, r.p10_us, r.p90_us, r.n, gbps,
          100.0 * gbps / copy0, r.finite ? "" : "  NON-FINITE OUTPUT",
          r.note.empty() ? "" : ("  " + r.note).c_str());
      std::fflush(stdout);
      // Rewritten after every case: a stage killed by its timeout keeps what it measured.
      if (!write_json(json_path, dev, copy0, 0.0, results)) return 2;
    }
  const double copy1 = copy_gbps(copy_bytes, quick);
  if (!write_json(json_path, dev, copy0, copy1, results)) return 2;
  std::printf("D2D copy at the end %.1f GB/s; wrote %s\n", copy1, json_path.c_str());
  int traced_off = 0;
  for (const CaseResult& r : results) {
    if (r.traced_bytes < 0) continue;
    const double ratio = r.traced_bytes / r.traced_expected;
    std::printf(
        "%-22s b%-3d ctx%-7d read through __ldg: %.0f bytes traced, %.0f accounted (%.4f)\n",
        r.kernel.c_str(), r.shape.batch, r.shape.context, r.traced_bytes, r.traced_expected, ratio);
    traced_off += std::fabs(ratio - 1.0) > 0.02;
  }
  if (traced_off) {
    std::fprintf(stderr,
                 "kvb_cuda_bench --smoke: %d case(s) read more than 2%% more or less than "
                 "their byte accounting says\n",
                 traced_off);
    return 1;
  }
  if (smoke)
    for (const CaseResult& r : results)
      if (!r.finite || r.median_us <= 0 || !r.note.empty() || r.bytes <= 0) {
        std::fprintf(stderr, "kvb_cuda_bench --smoke: %s b%d ctx%d did not run cleanly%s%s\n",
                     r.kernel.c_str(), r.shape.batch, r.shape.context,
                     r.finite ? "" : " (non-finite output)",
                     r.note.empty() ? "" : (": " + r.note).c_str());
        return 1;
      }
  return 0;
}

#if KVB_HAVE_GBENCH
// Google Benchmark: each (kernel, shape) of the full plan, one iteration = one launch (manual time
// from the built-in runner's median is not used: gbench repeats the case itself).
void register_gbench(bool quick) {
  for (const Shape& s : make_plan(quick).shapes)
    for (const std::string& k : make_plan(quick).kernels) {
      const std::string name =
          k + "/b" + std::to_string(s.batch) + "/ctx" + std::to_string(s.context);
      benchmark::RegisterBenchmark(
          name.c_str(),
          [k, s, quick](benchmark::State& st) {
            const Device dev = device_info();
            CaseResult r;
            for (auto _ : st) {
              r = run_case(k, s, dev, quick);
              st.SetIterationTime(r.median_us * 1e-6);
            }
            st.counters["median_us"] = r.median_us;
            st.counters["gbps"] = r.median_us > 0 ? r.bytes / (r.median_us * 1e-6) / 1e9 : 0;
            st.counters["fp16_equiv_gbps"] =
                r.median_us > 0 ? r.fp16_bytes / (r.median_us * 1e-6) / 1e9 : 0;
            st.counters["splits"] = r.splits;
          })
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string json, filter;
  bool quick = false, smoke = false, list = false, builtin = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--json=", 0) == 0) {
      json = a.substr(7);
      builtin = true;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--smoke") {
      smoke = builtin = true;
    } else if (a == "--list") {
      list = true;
    } else if (a.rfind("--filter=", 0) == 0) {
      filter = a.substr(9);
    }
  }
  if (list) {
    const Plan p = make_plan(quick, smoke);
    std::printf(
        "kvb_cuda_bench plan (%s): shapes (batch x context) with %d kv heads, %d qo heads, "
        "head_dim %d:\n",
        smoke   ? "smoke"
        : quick ? "quick"
                : "full",
        kKvHeads, kQoHeads, kHeadDim);
    for (const Shape& s : p.shapes) std::printf("  b%d x %d\n", s.batch, s.context);
    std::printf("kernels:");
    for (const auto& k : p.kernels) std::printf(" %s", k.c_str());
    std::printf("\nplus a D2D copy ceiling before and after\n");
    return 0;
  }
  (void)builtin;  // only the Google Benchmark build reads it
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "kvb_cuda_bench: no CUDA device\n");
    return 3;
  }
#if KVB_HAVE_GBENCH
  if (!builtin) {
    register_gbench(quick);
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
#endif
  if (json.empty()) json = "kvb_cuda_bench.json";
  return run_builtin(json, quick, smoke, filter);
}
