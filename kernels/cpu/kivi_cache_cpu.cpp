// Optimised CPU decode attention over the KIVI store and its quantize-and-append (kivi_cache.h).
// Decode: one work item per (sequence, kv head); a quantized key page is scored without
// dequantizing it: with per-channel scale s_c and min m_c, q . k_r = sum_c (q_c s_c) code_rc +
// sum_c q_c m_c, so the scale is folded into q once per page. Value rows are dequantized one row at
// a time. The item is compiled for AVX2 as well as the baseline (cpu_clones.h) and its softmax uses
// the vectorisable exp of fast_exp.h.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/kivi_detail.h"
#include "kvb/kernels/half.h"
#include "kvb/kernels/kivi_cache.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {

namespace {

constexpr int64_t kResidualTile = 64;

// Byte -> its 4 two-bit codes as floats (low bits first, as pack_codes lays them).
struct CodeTables {
  float b2[256][4];
  CodeTables() {
    for (int x = 0; x < 256; ++x)
      for (int k = 0; k < 4; ++k) b2[x][k] = static_cast<float>((x >> (2 * k)) & 3);
  }
};
const CodeTables& code_tables() {
  static const CodeTables t;
  return t;
}

// The n codes packed at `bits` in `packed` as floats in out[n] (n a multiple of 8 / bits), without
// unpacking to bytes first (that was a quarter of KIVI-2's decode time): at 2 bits one table read
// per byte, at 4 bits a loop that vectorises.
inline void codes_to_float(const uint8_t* packed, int64_t n, int32_t bits, float* out,
                           const CodeTables& t, std::vector<uint8_t>& tmp) {
  if (bits == 2) {
    for (int64_t o = 0; o < n / 4; ++o) std::memcpy(out + 4 * o, t.b2[packed[o]], 16);
  } else if (bits == 4) {
    for (int64_t o = 0; o < n / 2; ++o) {  // (vectorises; the table is slower at 4 bits)
      out[2 * o] = static_cast<float>(packed[o] & 15);
      out[2 * o + 1] = static_cast<float>(packed[o] >> 4);
    }
  } else {
    tmp.resize(static_cast<size_t>(n));
    unpack_codes_cpu(packed, n, bits, tmp.data());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(tmp[i]);
  }
}

struct KiviScratch {
  std::vector<float> q, qs, bias, acc, m, l, s, e, k, v;
  std::vector<uint8_t> codes, vcodes;
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
  w.e.resize(tile_max);
  w.v.resize(tile_max * hd);
  w.k.resize(tile_max * hd);
  const CodeTables& tables = code_tables();
  detail::load_row(p.q, p.dtype, qo, group * hd, w.q.data());
  for (float& x : w.q) x *= p.sm_scale;

  // Value row j into out[hd]: dequantized (j < vq) or from the ring.
  auto value_row = [&](int64_t j, float* out) {
    if (j >= vq) {
      detail::load_row(p.v_residual, p.dtype, ring(j), hd, out);
      return;
    }
    const int64_t row = blk(j) * ps + j % ps;
    codes_to_float(p.v_codes + blk(j) * kivi_v_page_bytes(L) + (j % ps) * hd * L.v_bits / 8, hd,
                   L.v_bits, out, tables, w.vcodes);
    for (int64_t g = 0; g < G; ++g) {
      const float sc = half_to_float(p.v_scales[row * G + g]),
                  mn = half_to_float(p.v_mins[row * G + g]);
      for (int64_t c = g * L.v_group_size; c < (g + 1) * L.v_group_size; ++c)
        out[c] = out[c] * sc + mn;
    }
  };
  // Online-softmax update with scores w.s [group, tile_max] and values w.v [cnt, hd].
  auto update = [&](int64_t cnt) {
    for (int g = 0; g < group; ++g) {
      const float* s = w.s.data() + g * tile_max;
      float mx = w.m[g];
      for (int64_t i = 0; i < cnt; ++i) mx = std::max(mx, s[i]);
      const float corr = detail::exp_f32(w.m[g] - mx);
      float* a = w.acc.data() + g * hd;
      for (int64_t d = 0; d < hd; ++d) a[d] *= corr;
      float sum = w.l[g] * corr;
      float* e_row = w.e.data();
      for (int64_t i = 0; i < cnt; ++i) e_row[i] = detail::exp_f32(s[i] - mx);  // vectorises
      for (int64_t i = 0; i < cnt; ++i) sum += e_row[i];
      detail::accumulate_rows(a, e_row, w.v.data(), cnt, hd, hd);
      w.m[g] = mx;
      w.l[g] = sum;
    }
  };

  // Quantized key pages.
  for (int64_t j0 = 0; j0 < kq; j0 += ps) {
    const int64_t bk = blk(j0);
    codes_to_float(p.k_codes + bk * kivi_k_page_bytes(L), ps * hd, L.k_bits, w.k.data(), tables,
                   w.codes);  // codes as floats
    const uint16_t* sc = p.k_scales + bk * hd;
    const uint16_t* mn = p.k_mins + bk * hd;
    for (int g = 0; g < group; ++g) {
      float bias = 0.f;
      for (int64_t c = 0; c < hd; ++c) {
        w.qs[g * hd + c] = w.q[g * hd + c] * half_to_float(sc[c]);
        bias += w.q[g * hd + c] * half_to_float(mn[c]);
      }
      w.bias[g] = bias;
    }
    for (int64_t r = 0; r < ps; ++r) {
      for (int g = 0; g < group; ++g)
        w.s[g * tile_max + r] =
            w.bias[g] + detail::dot_f32(w.qs.data() + g * hd, w.k.data() + r * hd, hd);
      value_row(j0 + r, w.v.data() + r * hd);
    }
    update(ps);
  }
  // Keys in the residual ring.
  for (int64_t j0 = kq; j0 < n; j0 += kResidualTile) {
    const int64_t cnt = std::min(kResidualTile, n - j0);
    for (int64_t i = 0; i < cnt; ++i) {
      detail::load_row(p.k_residual, p.dtype, ring(j0 + i), hd, w.k.data() + i * hd);
      value_row(j0 + i, w.v.data() + i * hd);
    }
    for (int g = 0; g < group; ++g)
      for (int64_t i = 0; i < cnt; ++i)
        w.s[g * tile_max + i] = detail::dot_f32(w.q.data() + g * hd, w.k.data() + i * hd, hd);
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
