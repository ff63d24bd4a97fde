// Optimised CPU decode attention over paged fp16/bf16 KV, dense or gathered (decode_attention.h),
// and the fp32 merge of partial softmax states. One work item is (sequence, kv head): its K/V rows
// are converted to fp32 a tile at a time and every query head of the group is served from that
// tile. The item is compiled for AVX2 as well as the baseline (cpu_clones.h) and its softmax uses
// the vectorisable exp of fast_exp.h.

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"

namespace kvb::kernels {

namespace {

constexpr int kTile = 64;  // rows converted to fp32 per step

struct Scratch {
  std::vector<float> k, v, q, acc, s;  // [kTile, hd] x2, [group, hd] x2, [group, kTile]
  std::vector<float> m, l;             // [group]
};

KVB_CPU_CLONES void attend_item(const DecodeAttentionParams& p, int b, int kvh, Scratch& w) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t page_stride = static_cast<int64_t>(p.page_size) * tok_stride;
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  const int64_t len = p.kv_lens[b];
  const int64_t scan = decode_scan_len(p, b);
  const int64_t qo_off = (static_cast<int64_t>(b) * p.num_qo_heads + kvh * group) * hd;

  w.q.resize(static_cast<size_t>(group) * hd);
  w.acc.assign(static_cast<size_t>(group) * hd, 0.f);
  w.k.resize(static_cast<size_t>(kTile) * hd);
  w.v.resize(static_cast<size_t>(kTile) * hd);
  w.s.resize(static_cast<size_t>(group) * kTile);
  w.m.assign(group, -INFINITY);
  w.l.assign(group, 0.f);
  detail::load_row(p.q, p.dtype, qo_off, static_cast<int64_t>(group) * hd, w.q.data());
  for (float& x : w.q) x *= p.sm_scale;

  int64_t rows[kTile];
  for (int64_t j0 = 0; j0 < scan; j0 += kTile) {
    // Resolve the tile's positions to pool rows (skipping the dead slots of a selected last page).
    int n = 0;
    for (int64_t j = j0; j < std::min(scan, j0 + kTile); ++j) {
      int64_t pos = j;
      if (p.gather == GatherMode::kTokens) {
        pos = p.gather_indices[p.gather_indptr[b] + j];
      } else if (p.gather == GatherMode::kPages) {
        pos = static_cast<int64_t>(p.gather_indices[p.gather_indptr[b] + j / p.page_size]) *
                  p.page_size +
              j % p.page_size;
        if (pos >= len) continue;
      }
      rows[n++] = pages[pos / p.page_size] * page_stride + (pos % p.page_size) * tok_stride +
                  static_cast<int64_t>(kvh) * hd;
    }
    if (n == 0) continue;
    // Ask for every line of the tile's rows first (rows lie a token stride apart, pages anywhere):
    // the conversion below then finds them arriving instead of waiting on each in turn.
    const int64_t esz = kv_dtype_bytes(p.dtype), row_bytes = hd * esz;
    for (int i = 0; i < n; ++i)
      for (int64_t off = 0; off < row_bytes; off += 64) {
        __builtin_prefetch(static_cast<const char*>(p.k_pages) + rows[i] * esz + off);
        __builtin_prefetch(static_cast<const char*>(p.v_pages) + rows[i] * esz + off);
      }
    for (int i = 0; i < n; ++i) {
      detail::load_row(p.k_pages, p.dtype, rows[i], hd, w.k.data() + i * hd);
      detail::load_row(p.v_pages, p.dtype, rows[i], hd, w.v.data() + i * hd);
    }
    for (int g = 0; g < group; ++g) {
      const float* q = w.q.data() + g * hd;
      float* s = w.s.data() + g * kTile;
      float mx = w.m[g];
      for (int i = 0; i < n; ++i) {
        s[i] = detail::dot_f32(q, w.k.data() + i * hd, hd);
        mx = std::max(mx, s[i]);
      }
      const float corr = detail::exp_f32(w.m[g] - mx);  // exp(-inf) = 0 on the first tile
      float* a = w.acc.data() + g * hd;
      for (int d = 0; d < hd; ++d) a[d] *= corr;
      float sum = w.l[g] * corr;
      for (int i = 0; i < n; ++i) s[i] = detail::exp_f32(s[i] - mx);  // a loop of its own: vectorises
      for (int i = 0; i < n; ++i) sum += s[i];
      detail::accumulate_rows(a, s, w.v.data(), n, hd, hd);
      w.m[g] = mx;
      w.l[g] = sum;
    }
  }
  for (int g = 0; g < group; ++g) {
    const float inv = w.l[g] > 0.f ? 1.f / w.l[g] : 0.f;
    for (int d = 0; d < hd; ++d) w.acc[g * hd + d] *= inv;
  }
  detail::store_row(p.o, p.dtype, qo_off, static_cast<int64_t>(group) * hd, w.acc.data());
}

}  // namespace

void decode_attention_cpu(const DecodeAttentionParams& p) {
  int64_t total = 0;
  for (int b = 0; b < p.batch_size; ++b) total += decode_scan_len(p, b);
  const int64_t items = static_cast<int64_t>(p.batch_size) * p.num_kv_heads;
  const bool parallel = total * p.num_qo_heads * p.head_dim > (1 << 18);
#pragma omp parallel if (parallel)
  {
    Scratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it)
      attend_item(p, static_cast<int>(it / p.num_kv_heads), static_cast<int>(it % p.num_kv_heads),
                  w);
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
