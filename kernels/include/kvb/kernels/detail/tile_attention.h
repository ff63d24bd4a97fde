#pragma once
// The two products of decode attention over a tile of fp32 K/V rows, register-blocked for a query
// group: the scores of every (query head, row) pair and the weighted value sums. The rows come
// through an accessor (fp32 rows, or the decode kernel's fp16/bf16 pages widened in registers).
// A tile's rows are read from L1 a few times instead of once per query head, and each loaded K/V
// vector serves up to four heads (or each query vector up to eight rows), so that the loops are
// bound by the arithmetic, not by loads. Internal: not part of the kernel API; the functions are
// always inlined into the caller's work item, so they run as its clone (cpu_clones.h) does.
//
// Arithmetic (the same in every clone, so the same bits): a score is dot_f32's, bit for bit (lane
// c % 8 sums channels c, c + 8, ... in order, the channels past the last multiple of 8 go on into
// lane 0, the lanes are added as a pairwise tree); the softmax sum of a tile is eight lanes (lane
// i % 8 adds rows i, i + 8, ... in order) added as the same tree, then the rows past the last
// multiple of 8 in order; a value sum adds its rows in order onto the running output, as
// accumulate_rows does.

#include <cstdint>

#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/simd8.h"

namespace kvb::kernels::detail {

// One head's online-softmax step over a tile of n scores s[] (in place: they become the weights
// exp(s_i - m_new)), with the running max *m, sum *l and unnormalised output a[hd] (rescaled by
// exp(m_old - m_new)).
KVB_SIMD_INLINE void tile_softmax(float* s, int64_t n, float* m, float* l, float* a, int64_t hd) {
  float lane[8];
  for (int k = 0; k < 8; ++k) lane[k] = *m;
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] = lane[k] < s[i + k] ? s[i + k] : lane[k];
  float mx = lane[0];
  for (int k = 1; k < 8; ++k) mx = mx < lane[k] ? lane[k] : mx;
  for (int64_t i = n8; i < n; ++i) mx = mx < s[i] ? s[i] : mx;
  const float corr = exp_f32(*m - mx);  // exp(-inf) = 0 on the first tile
  // Once the running max has settled most tiles leave it alone: exp_f32(0) is exactly 1 and a
  // product by 1 changes no float, so those tiles skip the rescale.
  if (corr != 1.f)
    for (int64_t d = 0; d < hd; ++d) a[d] *= corr;
  for (int64_t i = 0; i < n; ++i) s[i] = exp_f32(s[i] - mx);  // a loop of its own: vectorises
  for (int k = 0; k < 8; ++k) lane[k] = 0.f;
  for (int64_t i = 0; i < n8; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += s[i + k];
  float sum =
      ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (int64_t i = n8; i < n; ++i) sum += s[i];
  *l = *l * corr + sum;
  *m = mx;
}

// Where the products read their K/V rows: row(i) points at row i's first channel, and load8 /
// load1 read channels from such a pointer as fp32. FloatRows: fp32 rows ld apart (a widened
// tile, or the fp32 pages of paged_attention); the decode kernel reads its fp16 / bf16 pages
// through an accessor of its own that widens in registers (pool_rows.h, same interface).
struct FloatRows {
  const float* p;
  int64_t ld;
  KVB_SIMD_INLINE const float* row(int64_t i) const { return p + i * ld; }
  static KVB_SIMD_INLINE f32x8 load8(const float* r) { return detail::load8(r); }
  static KVB_SIMD_INLINE float load1(const float* r) { return *r; }
  KVB_SIMD_INLINE FloatRows from(int64_t i) const { return {p + i * ld, ld}; }
};

// Called once per block of score rows (the decode kernel spreads its prefetches of the next tile
// over these calls); the fp32 entry points pass this one, which does nothing.
struct NoStep {
  KVB_SIMD_INLINE void operator()() {}
};

// Rows r < NR against heads g < NG (NG * NR <= 8): s[g * lds + r] = q_g . k_r.
template <int NG, int NR, class Rows>
KVB_SIMD_INLINE void tile_scores_block(const float* q, int64_t hd, const Rows& k, float* s,
                                       int64_t lds) {
  static_assert(NG * NR <= 8, "eight accumulators");
  f32x8 acc[8] = {};  // acc[r * NG + g]; the unused ones stay zero
  const int64_t hd8 = hd & ~int64_t{7};
  decltype(k.row(0)) kr[NR];
  for (int r = 0; r < NR; ++r) kr[r] = k.row(r);
  for (int64_t c = 0; c < hd8; c += 8) {
    f32x8 kv[NR];
    for (int r = 0; r < NR; ++r) kv[r] = Rows::load8(kr[r] + c);
    for (int g = 0; g < NG; ++g) {
      const f32x8 qv = load8(q + g * hd + c);
      for (int r = 0; r < NR; ++r) acc[r * NG + g] += qv * kv[r];
    }
  }
  // dot_f32 adds the channels past the last multiple of 8 into lane 0, in order; the other lanes
  // add -0, which changes no float.
  for (int64_t c = hd8; c < hd; ++c)
    for (int r = 0; r < NR; ++r)
      for (int g = 0; g < NG; ++g)
        acc[r * NG + g] +=
            f32x8{q[g * hd + c] * Rows::load1(kr[r] + c), -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f};
  float sums[8];
  store8(sums, lane_sums8(acc));
  for (int r = 0; r < NR; ++r)
    for (int g = 0; g < NG; ++g) s[g * lds + r] = sums[r * NG + g];
}

template <int NG, int NR, class Rows, class Step>
KVB_SIMD_INLINE void tile_scores_heads(const float* q, int64_t hd, const Rows& k, int64_t n,
                                       float* s, int64_t lds, Step& step) {
  int64_t i = 0;
  for (; i + NR <= n; i += NR) {
    step();
    tile_scores_block<NG, NR>(q, hd, k.from(i), s + i, lds);
  }
  for (; i < n; ++i) {
    step();
    tile_scores_block<NG, 1>(q, hd, k.from(i), s + i, lds);
  }
}

// s[g * lds + i] = q[g * hd ..] . (row i of k) for heads g < group and rows i < n.
//   q: [group, hd] fp32; k: n rows of hd channels (Rows); s: [group, lds] fp32.
template <class Rows, class Step>
KVB_SIMD_INLINE void tile_scores(const float* q, int group, int64_t hd, const Rows& k, int64_t n,
                                 float* s, int64_t lds, Step& step) {
  int g = 0;
  for (; g + 4 <= group; g += 4)
    tile_scores_heads<4, 2>(q + g * hd, hd, k, n, s + g * lds, lds, step);
  if (group - g >= 2) {
    tile_scores_heads<2, 4>(q + g * hd, hd, k, n, s + g * lds, lds, step);
    g += 2;
  }
  if (group - g == 1) tile_scores_heads<1, 8>(q + g * hd, hd, k, n, s + g * lds, lds, step);
}

// How many times tile_scores calls its step for a group and n rows: once per row block.
inline int64_t tile_scores_steps(int group, int64_t n) {
  int64_t steps = (group / 4) * (n / 2 + n % 2);
  if (group % 4 >= 2) steps += n / 4 + n % 4;
  if (group % 2 == 1) steps += n / 8 + n % 8;
  return steps;
}

// The same over fp32 rows ldk apart.
KVB_SIMD_INLINE void tile_scores(const float* q, int group, int64_t hd, const float* k, int64_t ldk,
                                 int64_t n, float* s, int64_t lds) {
  NoStep none;
  tile_scores(q, group, hd, FloatRows{k, ldk}, n, s, lds, none);
}

// Channels [d0, d0 + 8 NV) of heads g < NG: o[g * hd + d] += sum_i w[g * n + i][d] v[i][d], the
// weights w broadcast over the lanes beforehand (so that each is one operand of the multiplies).
template <int NG, int NV, class Rows>
KVB_SIMD_INLINE void tile_values_block(float* o, int64_t hd, const f32x8* w, const Rows& v,
                                       int64_t n, int64_t d0) {
  f32x8 acc[NG][NV];
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = load8(o + g * hd + d0 + 8 * j);
  for (int64_t i = 0; i < n; ++i) {
    const auto* r = v.row(i) + d0;
    f32x8 vv[NV];
    for (int j = 0; j < NV; ++j) vv[j] = Rows::load8(r + 8 * j);
    for (int g = 0; g < NG; ++g)
      for (int j = 0; j < NV; ++j) acc[g][j] += w[g * n + i] * vv[j];
  }
  // Unrolled by hand: as a loop, GCC copies the sums out through the stack.
#pragma GCC unroll 8
  for (int g = 0; g < NG; ++g)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) store8(o + g * hd + d0 + 8 * j, acc[g][j]);
}

// The rows in chunks of kValueChunk, each chunk's weights broadcast once for all its channel
// blocks. Each output channel still adds its rows in order.
constexpr int64_t kValueChunk = 32;
template <int NG, int NV, class Rows>
KVB_SIMD_INLINE void tile_values_heads(float* o, int64_t hd, const float* e, int64_t lde,
                                       const Rows& v, int64_t n) {
  f32x8 w[NG * kValueChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kValueChunk) {
    const int64_t cnt = n - i0 < kValueChunk ? n - i0 : kValueChunk;
    for (int g = 0; g < NG; ++g)
#pragma GCC unroll 8
      for (int64_t i = 0; i < cnt; ++i) w[g * cnt + i] = splat8(e[g * lde + i0 + i]);
    const Rows vc = v.from(i0);
    int64_t d0 = 0;
    for (; d0 + 8 * NV <= hd; d0 += 8 * NV) tile_values_block<NG, NV>(o, hd, w, vc, cnt, d0);
    for (; d0 + 8 <= hd; d0 += 8) tile_values_block<NG, 1>(o, hd, w, vc, cnt, d0);
    for (; d0 < hd; ++d0)
      for (int g = 0; g < NG; ++g) {
        float t = o[g * hd + d0];
        for (int64_t i = 0; i < cnt; ++i) t += e[g * lde + i0 + i] * Rows::load1(vc.row(i) + d0);
        o[g * hd + d0] = t;
      }
  }
}

// o[g * hd + d] += sum_{i < n} e[g * lde + i] * (row i of v)[d] for heads g < group, d < hd.
//   o: [group, hd] fp32 (running sums); e: [group, lde] softmax weights; v: n rows (Rows).
template <class Rows>
KVB_SIMD_INLINE void tile_values(float* o, int group, int64_t hd, const float* e, int64_t lde,
                                 const Rows& v, int64_t n) {
  int g = 0;
  for (; g + 4 <= group; g += 4) tile_values_heads<4, 2>(o + g * hd, hd, e + g * lde, lde, v, n);
  if (group - g >= 2) {
    tile_values_heads<2, 4>(o + g * hd, hd, e + g * lde, lde, v, n);
    g += 2;
  }
  if (group - g == 1) tile_values_heads<1, 8>(o + g * hd, hd, e + g * lde, lde, v, n);
}

// The same over fp32 rows ldv apart.
KVB_SIMD_INLINE void tile_values(float* o, int group, int64_t hd, const float* e, int64_t lde,
                                 const float* v, int64_t ldv, int64_t n) {
  tile_values(o, group, hd, e, lde, FloatRows{v, ldv}, n);
}

}  // namespace kvb::kernels::detail
