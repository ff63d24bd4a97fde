// Optimised CPU decode attention over the KIVI store and its quantize-and-append (kivi_cache.h).
// Decode: one work item per (sequence, kv head); a quantized key page is scored without
// dequantizing it: with per-channel scale s_c and min m_c, q . k_r = sum_c (q_c s_c) code_rc +
// sum_c q_c m_c, so the scale is folded into q once per page and the page's codes, as floats, are
// scored like an fp32 tile (tile_attention.h: every head of the query group in register blocks).
// Value rows are dequantized one row at a time into a tile that the group's value sums read the
// same way. The item is compiled for AVX2 as well as the baseline (cpu_clones.h) and its softmax
// uses the vectorisable exp of fast_exp.h.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/kivi_detail.h"
#include "kvb/kernels/detail/tile_attention.h"
#include "kvb/kernels/detail/widen_rows.h"
#include "kvb/kernels/half.h"
#include "kvb/kernels/kivi_cache.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {

namespace {

constexpr int64_t kResidualTile = 64;

// Eight codes of BITS bits (2, 4 or 8) from the stream at src as int32 lanes: one load, spread
// over the lanes by per-lane shifts, masked.
template <int BITS>
KVB_SIMD_INLINE detail::i32x8 eight_codes(const uint8_t* src) {
  using detail::i32x8;
  constexpr int32_t kMask = (1 << BITS) - 1;
  const i32x8 mask = i32x8{kMask, kMask, kMask, kMask, kMask, kMask, kMask, kMask};
  if constexpr (BITS == 8) {
    uint32_t w[2];
    std::memcpy(w, src, 8);
    const int32_t a = static_cast<int32_t>(w[0]), b = static_cast<int32_t>(w[1]);
    return (i32x8{a, a, a, a, b, b, b, b} >> i32x8{0, 8, 16, 24, 0, 8, 16, 24}) & mask;
  } else {
    using Word = std::conditional_t<BITS == 2, uint16_t, uint32_t>;  // the 8 codes' bytes
    Word w;
    std::memcpy(&w, src, sizeof w);
    const int32_t x = static_cast<int32_t>(w);
    return (i32x8{x, x, x, x, x, x, x, x} >> (i32x8{0, 1, 2, 3, 4, 5, 6, 7} * BITS)) & mask;
  }
}

template <int BITS>
KVB_SIMD_INLINE void codes_to_float_bits(const uint8_t* packed, int64_t n8, float* out) {
  for (int64_t o = 0; o < n8; o += 8)
    detail::store8(
        out + o, __builtin_convertvector(eight_codes<BITS>(packed + o * BITS / 8), detail::f32x8));
}

// A value row of hd codes at BITS, groups of vg channels (a multiple of 8) with fp16 scale and min
// each: out[c] = code_c * scale + min, eight channels at a time.
template <int BITS>
KVB_SIMD_INLINE void dequant_row(const uint8_t* codes, const uint16_t* scales, const uint16_t* mins,
                                 int64_t vg, int64_t hd, float* out) {
  for (int64_t g0 = 0; g0 < hd; g0 += vg) {
    const detail::f32x8 sc = detail::splat8(half_to_float(scales[g0 / vg]));
    const detail::f32x8 mn = detail::splat8(half_to_float(mins[g0 / vg]));
    for (int64_t c = g0; c < g0 + vg; c += 8) {
      const detail::f32x8 f =
          __builtin_convertvector(eight_codes<BITS>(codes + c * BITS / 8), detail::f32x8);
      detail::store8(out + c, f * sc + mn);
    }
  }
}

// The n codes packed at `bits` in `packed` (quantize.h's stream: low bits first) as floats in
// out[n], without unpacking to bytes first (eight_codes); a tail of fewer than eight codes goes
// through unpack_codes_cpu.
KVB_SIMD_INLINE void codes_to_float(const uint8_t* packed, int64_t n, int32_t bits, float* out,
                                    std::vector<uint8_t>& tmp) {
  const int64_t n8 = n & ~int64_t{7};
  if (bits == 2) codes_to_float_bits<2>(packed, n8, out);
  if (bits == 4) codes_to_float_bits<4>(packed, n8, out);
  if (bits == 8) codes_to_float_bits<8>(packed, n8, out);
  if (n8 < n) {
    tmp.resize(static_cast<size_t>(n - n8));
    unpack_codes_cpu(packed + n8 * bits / 8, n - n8, bits, tmp.data());
    for (int64_t i = n8; i < n; ++i) out[i] = static_cast<float>(tmp[i - n8]);
  }
}

struct KiviScratch {
  std::vector<float> q, qs, bias, acc, m, l, s, k, v, sc, mn;
  std::vector<uint8_t> codes, vcodes;
  std::vector<int64_t> rows;
};

KVB_CPU_CLONES void kivi_item(const KiviDecodeParams& p, int b, int kvh, KiviScratch& w) {
  const KiviLayout& L = p.layout;
  const int group = p.num_qo_heads / L.num_kv_heads;
  const int64_t hd = L.head_dim, ps = L.page_size, H = L.num_kv_heads;
  const int64_t n = p.kv_lens[b];
  const int64_t kq = kivi_k_quant_len(L, n), vq = kivi_v_quant_len(L, n);
  const int64_t U = kivi_residual_capacity(L), G = kivi_v_groups_per_row(L);
  const int64_t tile_max = std::max(ps, kResidualTile);
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  const int64_t qo = (static_cast<int64_t>(b) * p.num_qo_heads + kvh * group) * hd;
  auto blk = [&](int64_t j) { return static_cast<int64_t>(pages[j / ps]) * H + kvh; };
  auto ring = [&](int64_t j) { return ((b * U + j % U) * H + kvh) * hd; };

  w.q.resize(group * hd);
  w.qs.resize(group * hd);
  w.bias.resize(group);
  w.acc.assign(group * hd, 0.f);
  w.m.assign(group, -INFINITY);
  w.l.assign(group, 0.f);
  w.s.resize(group * tile_max);
  w.v.resize(tile_max * hd);
  w.k.resize(tile_max * hd);
  w.sc.resize(hd);
  w.mn.resize(hd);
  w.rows.resize(kResidualTile);
  detail::load_row(p.q, p.dtype, qo, group * hd, w.q.data());
  for (float& x : w.q) x *= p.sm_scale;

  // Value row j into out[hd]: dequantized (j < vq) or from the ring.
  auto value_row = [&](int64_t j, float* out) KVB_SIMD_INLINE_LAMBDA {
    if (j >= vq) {
      detail::load_row(p.v_residual, p.dtype, ring(j), hd, out);
      return;
    }
    const int64_t row = blk(j) * ps + j % ps;
    const uint8_t* codes = p.v_codes + blk(j) * kivi_v_page_bytes(L) + (j % ps) * hd * L.v_bits / 8;
    if (L.v_group_size % 8 == 0) {  // eight codes at a time, dequantized in registers
      if (L.v_bits == 2)
        dequant_row<2>(codes, p.v_scales + row * G, p.v_mins + row * G, L.v_group_size, hd, out);
      if (L.v_bits == 4)
        dequant_row<4>(codes, p.v_scales + row * G, p.v_mins + row * G, L.v_group_size, hd, out);
      if (L.v_bits == 8)
        dequant_row<8>(codes, p.v_scales + row * G, p.v_mins + row * G, L.v_group_size, hd, out);
      return;
    }
    codes_to_float(codes, hd, L.v_bits, out, w.vcodes);
    for (int64_t g = 0; g < G; ++g) {
      const float sc = half_to_float(p.v_scales[row * G + g]),
                  mn = half_to_float(p.v_mins[row * G + g]);
      for (int64_t c = g * L.v_group_size; c < (g + 1) * L.v_group_size; ++c)
        out[c] = out[c] * sc + mn;
    }
  };
  // Online-softmax update with scores w.s [group, tile_max] and values w.v [cnt, hd].
  auto update = [&](int64_t cnt) KVB_SIMD_INLINE_LAMBDA {
    for (int g = 0; g < group; ++g)
      detail::tile_softmax(w.s.data() + g * tile_max, cnt, &w.m[g], &w.l[g], w.acc.data() + g * hd,
                           hd);
    detail::tile_values(w.acc.data(), group, hd, w.s.data(), tile_max, w.v.data(), hd, cnt);
  };

  // Quantized key pages: the codes as floats, scored against q scaled by the page's channel
  // scales, plus q . mins.
  for (int64_t j0 = 0; j0 < kq; j0 += ps) {
    const int64_t bk = blk(j0);
    codes_to_float(p.k_codes + bk * kivi_k_page_bytes(L), ps * hd, L.k_bits, w.k.data(), w.codes);
    for (int64_t c = 0; c < hd; ++c) {
      w.sc[c] = detail::half_to_float_fast(p.k_scales[bk * hd + c]);
      w.mn[c] = detail::half_to_float_fast(p.k_mins[bk * hd + c]);
    }
    for (int g = 0; g < group; ++g) {
      for (int64_t c = 0; c < hd; ++c) w.qs[g * hd + c] = w.q[g * hd + c] * w.sc[c];
      w.bias[g] = detail::dot_f32(w.q.data() + g * hd, w.mn.data(), hd);
    }
    detail::tile_scores(w.qs.data(), group, hd, w.k.data(), hd, ps, w.s.data(), tile_max);
    for (int g = 0; g < group; ++g)
      for (int64_t r = 0; r < ps; ++r) w.s[g * tile_max + r] += w.bias[g];
    for (int64_t r = 0; r < ps; ++r) value_row(j0 + r, w.v.data() + r * hd);
    update(ps);
  }
  // Keys in the residual ring.
  for (int64_t j0 = kq; j0 < n; j0 += kResidualTile) {
    const int64_t cnt = std::min(kResidualTile, n - j0);
    for (int64_t i = 0; i < cnt; ++i) {
      w.rows[i] = ring(j0 + i);
      value_row(j0 + i, w.v.data() + i * hd);
    }
    detail::widen_rows(p.k_residual, p.dtype, w.rows.data(), cnt, 1, hd, w.k.data());
    detail::tile_scores(w.q.data(), group, hd, w.k.data(), hd, cnt, w.s.data(), tile_max);
    update(cnt);
  }
  for (int g = 0; g < group; ++g) {
    const float inv = w.l[g] > 0.f ? 1.f / w.l[g] : 0.f;
    for (int64_t d = 0; d < hd; ++d) w.acc[g * hd + d] *= inv;
  }
  detail::store_row(p.o, p.dtype, qo, group * hd, w.acc.data());
}

}  // namespace

void kivi_decode_cpu(const KiviDecodeParams& p) {
  int64_t total = 0;
  for (int b = 0; b < p.batch_size; ++b) total += p.kv_lens[b];
  const int64_t items = static_cast<int64_t>(p.batch_size) * p.layout.num_kv_heads;
  const bool parallel = total * p.num_qo_heads * p.layout.head_dim > (1 << 18);
#pragma omp parallel if (parallel)
  {
    KiviScratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it)
      kivi_item(p, static_cast<int>(it / p.layout.num_kv_heads),
                static_cast<int>(it % p.layout.num_kv_heads), w);
  }
}

void kivi_append_cpu(const KiviAppendParams& p) {
  const int64_t items = static_cast<int64_t>(p.batch_size) * p.layout.num_kv_heads;
  const int64_t tokens = p.batch_size > 0 ? p.new_indptr[p.batch_size] : 0;
  const bool parallel = tokens * p.layout.num_kv_heads * p.layout.head_dim > (1 << 16);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t it = 0; it < items; ++it)
    kivi_detail::append_item(p, static_cast<int>(it / p.layout.num_kv_heads),
                             static_cast<int>(it % p.layout.num_kv_heads), group_quantize_cpu);
}

}  // namespace kvb::kernels
