// Optimised CPU decode attention over paged fp16/bf16 (or fp32) KV, dense or gathered
// (decode_attention.h), and the fp32 merge of partial softmax states. One work item is (sequence,
// range of positions), all kv heads. Per tile of kTile positions and per kv head, every query head
// of the group is scored against the tile's K rows in register blocks (tile_attention.h), the K
// rows read from the pages and widened to fp32 in registers (pool_rows.h); the online softmax is
// updated, and the V rows are added into the group's outputs the same way. While a tile is computed
// the next one's token rows are prefetched, a few cache lines per block of score rows. A sequence
// split into ranges (when the batch alone gives the threads too few items) has its ranges' softmax
// states merged at the end. The item is built for x86-64-v3 (F16C) and for the baseline
// (cpu_clones.h's KVB_CPU_V3), with the same bits in both, and its softmax uses the exp of
// fast_exp.h.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/pool_rows.h"
#include "kvb/kernels/detail/tile_attention.h"

namespace kvb::kernels {

namespace {

// Positions per tile: a tile's K and V token rows (64 KiB each at 8 kv heads x head_dim 128 in
// fp16) and the next tile's, being prefetched, stay in L2. (When the rows were widened into fp32
// tiles in memory, 32 was the best of 16, 32 and 64.)
constexpr int kTile = 32;
constexpr int64_t kMinRange = 512;  // positions per work item when a sequence is split
// The tile prefetched while one is computed is kAhead tiles on (2 measured no better than 1), into
// L2 only (prefetcht1): a tile's 128 KiB prefetched into the 32 KiB L1 evicted the lines in use,
// and the 32K-position call spent ~40% more time than with L2 as the target.
constexpr int kAhead = 1;
constexpr int kRing = kAhead + 1;
constexpr int kPrefetchLocality = 2;  // __builtin_prefetch's: 2 = prefetcht1 on x86

struct Scratch {
  std::vector<float> q, s;     // [H, hd], [group, kTile]
  int64_t rows[kRing][kTile];  // pool element offsets of a tile's tokens (kv head 0)
  int count[kRing];            // rows in each
};

// The pool rows of scan positions [t0, t1) of sequence b into rows[] (skipping the dead slots of a
// selected last page); returns their count.
int resolve_rows(const DecodeAttentionParams& p, int b, int64_t t0, int64_t t1, int64_t* rows) {
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t page_stride = static_cast<int64_t>(p.page_size) * tok_stride;
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  const int64_t len = p.kv_lens[b];
  int n = 0;
  for (int64_t j = t0; j < t1; ++j) {
    int64_t pos = j;
    if (p.gather == GatherMode::kTokens) {
      pos = p.gather_indices[p.gather_indptr[b] + j];
    } else if (p.gather == GatherMode::kPages) {
      pos = static_cast<int64_t>(p.gather_indices[p.gather_indptr[b] + j / p.page_size]) *
                p.page_size +
            j % p.page_size;
      if (pos >= len) continue;
    }
    rows[n++] = pages[pos / p.page_size] * page_stride + (pos % p.page_size) * tok_stride;
  }
  return n;
}

// The next tile's token rows, K row then V row of each token (a token's kv heads are adjacent),
// cache line by cache line, per_step lines at each call: the decode item calls it once per block
// of score rows, so that the loads from memory go out between the arithmetic instead of stalling
// it in one burst per tile. rest() issues whatever the tile's steps left.
struct NextTilePrefetch {
  const char* k;
  const char* v;
  const int64_t* rows;  // [n] pool element offsets
  int n;
  int64_t esz, row_lines, per_step;
  int r = 0, half = 0;  // half 0: the K row, 1: the V row
  int64_t line = 0;

  KVB_SIMD_INLINE void operator()() {
    int64_t budget = per_step;
    while (budget > 0 && r < n) {
      const char* row = (half ? v : k) + rows[r] * esz;
      const int64_t end = line + budget < row_lines ? line + budget : row_lines;
      budget -= end - line;
#pragma GCC unroll 4
      for (; line < end; ++line) __builtin_prefetch(row + line * 64, 0, kPrefetchLocality);
      if (line == row_lines) {
        line = 0;
        r += half;
        half ^= 1;
      }
    }
  }
  KVB_SIMD_INLINE void rest() {
    per_step = row_lines * 2 * n;
    (*this)();
  }
};

// One work item: sequence b, positions [j0, j1) of its scan, every kv head, the pages' rows read
// through Lanes (pool_rows.h). Its online-softmax state per query head h of the sequence: m[h],
// l[h], acc[h * hd] (unnormalised).
template <class Lanes>
KVB_SIMD_INLINE void attend_range(const DecodeAttentionParams& p, int b, int64_t j0, int64_t j1,
                                  Scratch& w, float* m, float* l, float* acc) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int hd = p.head_dim, H = p.num_qo_heads;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t esz = kv_dtype_bytes(p.dtype), tok_bytes = tok_stride * esz;
  using Elem = typename Lanes::Elem;
  const auto* kpool = static_cast<const Elem*>(p.k_pages);
  const auto* vpool = static_cast<const Elem*>(p.v_pages);

  w.q.resize(static_cast<size_t>(H) * hd);
  w.s.resize(static_cast<size_t>(group) * kTile);
  detail::load_row(p.q, p.dtype, static_cast<int64_t>(b) * H * hd, static_cast<int64_t>(H) * hd,
                   w.q.data());
  for (float& x : w.q) x *= p.sm_scale;
  for (int h = 0; h < H; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
  }
  std::fill(acc, acc + static_cast<int64_t>(H) * hd, 0.f);

  // Tile t's rows live in w.rows[t % kRing]; tile t + kAhead's are resolved and prefetched while
  // tile t is computed.
  const int64_t row_lines = (tok_bytes + 63) / 64;
  auto tile_rows = [&](int64_t t) KVB_SIMD_INLINE_LAMBDA {
    const int64_t a = j0 + t * kTile;
    return a < j1 ? resolve_rows(p, b, a, std::min(j1, a + kTile), w.rows[t % kRing]) : 0;
  };
  auto prefetcher = [&](int64_t t, int cnt) KVB_SIMD_INLINE_LAMBDA {
    return NextTilePrefetch{static_cast<const char*>(p.k_pages),
                            static_cast<const char*>(p.v_pages),
                            w.rows[t % kRing],
                            cnt,
                            esz,
                            row_lines,
                            0};
  };
  for (int64_t t = 0; t < kAhead; ++t) {
    w.count[t % kRing] = tile_rows(t);
    if (t > 0) prefetcher(t, w.count[t % kRing]).rest();
  }
  for (int64_t t = 0; j0 + t * kTile < j1; ++t) {
    const int n = w.count[t % kRing];
    const int n_ahead = w.count[(t + kAhead) % kRing] = tile_rows(t + kAhead);
    NextTilePrefetch pf = prefetcher(t + kAhead, n_ahead);
    const int64_t steps = p.num_kv_heads * detail::tile_scores_steps(group, n);
    if (steps > 0) pf.per_step = (2 * row_lines * n_ahead + steps - 1) / steps;
    if (n > 0) {
      const int64_t* rows = w.rows[t % kRing];
      for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
        const int h0 = kvh * group;
        const int64_t off = static_cast<int64_t>(kvh) * hd;
        const detail::PoolRows<Lanes> kr{kpool, rows, off}, vr{vpool, rows, off};
        detail::tile_scores(w.q.data() + static_cast<int64_t>(h0) * hd, group, hd, kr, n,
                            w.s.data(), kTile, pf);
        for (int g = 0; g < group; ++g)
          detail::tile_softmax(w.s.data() + g * kTile, n, m + h0 + g, l + h0 + g,
                               acc + static_cast<int64_t>(h0 + g) * hd, hd);
        detail::tile_values(acc + static_cast<int64_t>(h0) * hd, group, hd, w.s.data(), kTile, vr,
                            n);
      }
    }
    pf.rest();
  }
}

using ItemFn = void (*)(const DecodeAttentionParams&, int, int64_t, int64_t, Scratch&, float*,
                        float*, float*);

template <class Lanes>
void attend_range_baseline(const DecodeAttentionParams& p, int b, int64_t j0, int64_t j1,
                           Scratch& w, float* m, float* l, float* acc) {
  attend_range<Lanes>(p, b, j0, j1, w, m, l, acc);
}

#if KVB_HAVE_CPU_V3
template <class Lanes>
KVB_CPU_V3 void attend_range_v3(const DecodeAttentionParams& p, int b, int64_t j0, int64_t j1,
                                Scratch& w, float* m, float* l, float* acc) {
  attend_range<Lanes>(p, b, j0, j1, w, m, l, acc);
}
#endif

// The work item for the cache's dtype (fp16, bf16; fp32 for the LibTorch adapter's float caches)
// on this CPU.
ItemFn pick_item(KvDtype d) {
#if KVB_HAVE_CPU_V3
  static const bool v3 = detail::cpu_has_v3();
  if (v3) {
    if (d == KvDtype::kF32) return attend_range_v3<detail::F32Lanes>;
    return d == KvDtype::kBF16 ? attend_range_v3<detail::Bf16Lanes>
                               : attend_range_v3<detail::F16cLanes>;
  }
#endif
  if (d == KvDtype::kF32) return attend_range_baseline<detail::F32Lanes>;
  return d == KvDtype::kBF16 ? attend_range_baseline<detail::Bf16Lanes>
                             : attend_range_baseline<detail::F16Lanes>;
}

}  // namespace

void decode_attention_cpu(const DecodeAttentionParams& p) {
  const int H = p.num_qo_heads, hd = p.head_dim;
  int64_t total = 0;
  std::vector<int64_t> scan(p.batch_size);
  for (int b = 0; b < p.batch_size; ++b) total += (scan[b] = decode_scan_len(p, b));
  const bool parallel = total * H * hd > (1 << 18);
  // Work items: each sequence in ranges of >= kMinRange positions, enough of them for every thread
  // to have two when the batch alone does not (their states are merged below).
  const int threads = parallel ? std::max(1, omp_get_max_threads()) : 1;
  const int64_t want =
      threads > 1 ? std::max<int64_t>(1, (2 * threads + p.batch_size - 1) / p.batch_size) : 1;
  std::vector<int64_t> first(p.batch_size + 1, 0), chunk(p.batch_size, 1);
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t ranges = std::max<int64_t>(1, std::min(want, scan[b] / kMinRange));
    chunk[b] = (scan[b] + ranges - 1) / ranges;
    first[b + 1] = first[b] + ranges;
  }
  const int64_t items = first[p.batch_size];
  std::vector<float> st_m(items * H), st_l(items * H), st_acc(items * H * hd);
  const ItemFn attend = pick_item(p.dtype);
#pragma omp parallel if (parallel)
  {
    Scratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int b =
          static_cast<int>(std::upper_bound(first.begin(), first.end(), it) - first.begin() - 1);
      const int64_t j0 = (it - first[b]) * chunk[b], j1 = std::min(scan[b], j0 + chunk[b]);
      attend(p, b, j0, j1, w, st_m.data() + it * H, st_l.data() + it * H,
             st_acc.data() + it * H * hd);
    }
  }
  // Merge each sequence's ranges (one range: just the normalisation) and write the output.
  std::vector<float> out(static_cast<size_t>(H) * hd);
  for (int b = 0; b < p.batch_size; ++b) {
    for (int h = 0; h < H; ++h) {
      float M = -INFINITY;
      for (int64_t it = first[b]; it < first[b + 1]; ++it)
        if (st_l[it * H + h] > 0.f) M = std::max(M, st_m[it * H + h]);
      float* o = out.data() + static_cast<int64_t>(h) * hd;
      std::fill(o, o + hd, 0.f);
      float W = 0.f;
      for (int64_t it = first[b]; it < first[b + 1] && M > -INFINITY; ++it) {
        const float lw = st_l[it * H + h];
        if (!(lw > 0.f)) continue;
        const float c = first[b + 1] - first[b] == 1 ? 1.f : std::exp(st_m[it * H + h] - M);
        W += c * lw;
        const float* a = st_acc.data() + (it * H + h) * hd;
        for (int d = 0; d < hd; ++d) o[d] += c * a[d];
      }
      const float inv = W > 0.f ? 1.f / W : 0.f;
      for (int d = 0; d < hd; ++d) o[d] *= inv;
    }
    detail::store_row(p.o, p.dtype, static_cast<int64_t>(b) * H * hd, static_cast<int64_t>(H) * hd,
                      out.data());
  }
}

void attention_merge_cpu(const AttentionMergeParams& p) {
  const int64_t S = p.num_partials, D = p.head_dim;
  std::vector<float> acc(static_cast<size_t>(D));
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* m = p.partial_m + r * S;
    const float* l = p.partial_l + r * S;
    float M = -INFINITY;
    for (int64_t s = 0; s < S; ++s)
      if (l[s] > 0.f) M = std::max(M, m[s]);
    std::fill(acc.begin(), acc.end(), 0.f);
    float W = 0.f;
    if (M > -INFINITY) {
      for (int64_t s = 0; s < S; ++s) {
        if (!(l[s] > 0.f)) continue;
        const float w = l[s] * std::exp(m[s] - M);
        W += w;
        const float* o = p.partial_o + (r * S + s) * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * o[d];
      }
    }
    const float inv = W > 0.f ? 1.f / W : 0.f;
    for (int64_t d = 0; d < D; ++d) acc[d] *= inv;
    detail::store_row(p.o, p.o_dtype, r * D, D, acc.data());
    if (p.lse) p.lse[r] = W > 0.f ? M + std::log(W) : -INFINITY;
  }
}

}  // namespace kvb::kernels
