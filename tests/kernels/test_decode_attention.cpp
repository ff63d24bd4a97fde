// CPU twins of the CUDA decode kernels against their oracles (decode_attention.h, kivi_cache.h,
// kv_append.h) on odd sizes: lengths 1/54/97/2048, partial last pages (page sizes 16 and 7), GQA
// groups 1/4/8, head_dim 64/128, fp16 and bf16, shuffled page ids with spare pages, poisoned
// outputs, fresh random inputs per case. Also checks the oracles themselves: the fp16/bf16 decode
// oracle against the fp32 paged_attention_ref, the merge of partial states against one softmax over
// the union, and the KIVI store against the quantizer's error bound.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "decode_test_util.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/kv_append.h"
#include "kvb/kernels/paged_attention.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {
namespace {

using testing::from_bits;
using testing::nan_bits;
using testing::rel_err;

const std::vector<int32_t> kLens = {1, 54, 97, 2048};

double tolerance(KvDtype d) { return d == KvDtype::kF16 ? 1e-3 : 1e-2; }

std::vector<uint16_t> run_decode(const testing::PagedCache& c,
                                 void (*fn)(const DecodeAttentionParams&)) {
  std::vector<uint16_t> o(c.out_elems(), nan_bits(c.dtype));  // poisoned
  const DecodeAttentionParams p = c.params(o.data());
  EXPECT_EQ(decode_attention_check(p), "");
  fn(p);
  return o;
}

TEST(PagedDecodeCpu, MatchesOracleOnOddSizes) {
  uint32_t seed = 1;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
    for (int hd : {64, 128})
      for (int group : {1, 4, 8})
        for (int ps : {16, 7}) {
          std::mt19937 rng(seed++);
          auto c = testing::make_paged_cache(dt, kLens, 2, group, hd, ps, rng);
          const auto ref = run_decode(c, decode_attention_ref);
          const auto cpu = run_decode(c, decode_attention_cpu);
          ASSERT_TRUE(testing::all_finite(ref, dt));
          EXPECT_LE(rel_err(cpu, ref, dt), tolerance(dt))
              << kv_dtype_name(dt) << " hd " << hd << " group " << group << " page " << ps;
        }
}

// The register blocks of tile_attention.h on groups that are not a multiple of 4 (3 = 2 + 1,
// 5 = 4 + 1, 7 = 4 + 2 + 1) and head dims with channel tails (20, 40, 72), split into ranges.
TEST(PagedDecodeCpu, MatchesOracleOnOddGroupsAndHeadDims) {
  uint32_t seed = 40;
  for (int group : {2, 3, 5, 7})
    for (int hd : {20, 40, 72}) {
      std::mt19937 rng(seed++);
      auto c = testing::make_paged_cache(KvDtype::kF16, {1, 33, 1500}, 2, group, hd, 16, rng);
      const auto ref = run_decode(c, decode_attention_ref);
      const auto cpu = run_decode(c, decode_attention_cpu);
      EXPECT_LE(rel_err(cpu, ref, KvDtype::kF16), tolerance(KvDtype::kF16))
          << "hd " << hd << " group " << group;
    }
}

// The fp16/bf16 oracle is the fp32 paged_attention_ref on the same (exactly converted) values.
TEST(PagedDecodeCpu, OracleAgreesWithFp32PagedAttention) {
  std::mt19937 rng(7);
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
    auto c = testing::make_paged_cache(dt, {5, 54, 97}, 2, 4, 64, 16, rng);
    const auto ref = run_decode(c, decode_attention_ref);
    auto widen = [&](const std::vector<uint16_t>& v) {
      std::vector<float> f(v.size());
      for (size_t i = 0; i < v.size(); ++i) f[i] = from_bits(v[i], dt);
      return f;
    };
    std::vector<float> q = widen(c.q), k = widen(c.k), v = widen(c.v), o(q.size(), NAN);
    std::vector<int64_t> q_indptr = {0, 1, 2, 3}, past;
    for (int32_t n : c.kv_lens) past.push_back(n - 1);
    PagedAttentionParams p;
    p.q = q.data();
    p.o = o.data();
    p.k_pages = k.data();
    p.v_pages = v.data();
    p.page_indptr = c.page_indptr.data();
    p.page_indices = c.page_indices.data();
    p.q_indptr = q_indptr.data();
    p.past_lens = past.data();
    p.batch_size = c.batch();
    p.num_qo_heads = c.qo_heads();
    p.num_kv_heads = c.kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.sm_scale = 1.0f / std::sqrt(64.0f);
    ASSERT_EQ(paged_attention_check(p), "");
    paged_attention_ref(p);
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_NEAR(from_bits(ref[i], dt), o[i], dt == KvDtype::kF16 ? 2e-3 : 1.6e-2) << i;
  }
}

// The branch-free fp16 conversion of the CPU kernels equals half.h's on every bit pattern.
TEST(PagedDecodeCpu, FastHalfConversionIsExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = detail::half_to_float_fast(static_cast<uint16_t>(h));
    const float b = half_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(a), float_bits(b)) << std::hex << h;
  }
}

TEST(PagedDecodeCpu, EmptySequenceGivesZeros) {
  std::mt19937 rng(3);
  auto c = testing::make_paged_cache(KvDtype::kF16, {0, 9}, 1, 1, 64, 16, rng);
  for (auto fn : {decode_attention_ref, decode_attention_cpu}) {
    const auto o = run_decode(c, fn);
    for (int d = 0; d < 64; ++d) ASSERT_EQ(from_bits(o[d], KvDtype::kF16), 0.f);
    EXPECT_TRUE(testing::all_finite(o, KvDtype::kF16));
  }
}

TEST(PagedDecodeCpu, CheckNamesBadInputs) {
  std::mt19937 rng(4);
  auto c = testing::make_paged_cache(KvDtype::kF16, {40}, 2, 4, 64, 16, rng);
  std::vector<uint16_t> o(c.out_elems());
  DecodeAttentionParams p = c.params(o.data());
  p.kv_lens = nullptr;
  EXPECT_EQ(decode_attention_check(p), "null pointer");
  std::vector<int32_t> too_long = {49};
  p = c.params(o.data());
  p.kv_lens = too_long.data();
  EXPECT_NE(decode_attention_check(p).find("too few pages"), std::string::npos);
  p = c.params(o.data());
  p.dtype = KvDtype::kF32;
  EXPECT_NE(decode_attention_check(p).find("fp32"), std::string::npos);
  testing::set_token_gather(c, 0.5, rng);
  c.gather_indices[0] = 40;  // == kv_len: out of range
  p = c.params(o.data());
  EXPECT_NE(decode_attention_check(p).find("gather index 40"), std::string::npos);
}

TEST(GatheredDecodeCpu, TokensMatchOracle) {
  uint32_t seed = 100;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
    for (int hd : {64, 128})
      for (int group : {1, 4, 8}) {
        std::mt19937 rng(seed++);
        auto c = testing::make_paged_cache(dt, kLens, 2, group, hd, 16, rng);
        testing::set_token_gather(c, 0.3, rng, /*empty_seq=*/group == 4 ? 2 : -1);
        const auto ref = run_decode(c, decode_attention_ref);
        const auto cpu = run_decode(c, decode_attention_cpu);
        EXPECT_LE(rel_err(cpu, ref, dt), tolerance(dt))
            << kv_dtype_name(dt) << " hd " << hd << " g " << group;
      }
}

TEST(GatheredDecodeCpu, PagesMatchOracle) {
  uint32_t seed = 200;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
    for (int hd : {64, 128})
      for (int ps : {16, 7}) {
        std::mt19937 rng(seed++);
        auto c = testing::make_paged_cache(dt, kLens, 2, 4, hd, ps, rng);
        testing::set_page_gather(c, 0.4, rng);
        const auto ref = run_decode(c, decode_attention_ref);
        const auto cpu = run_decode(c, decode_attention_cpu);
        EXPECT_LE(rel_err(cpu, ref, dt), tolerance(dt))
            << kv_dtype_name(dt) << " hd " << hd << " ps " << ps;
      }
}

// A page list attends exactly the tokens of those pages: the same result as the equivalent token
// list.
TEST(GatheredDecodeCpu, PageListEqualsItsTokenList) {
  std::mt19937 rng(300);
  auto c = testing::make_paged_cache(KvDtype::kF16, {97, 54}, 2, 4, 64, 16, rng);
  testing::set_page_gather(c, 0.5, rng);
  const auto by_pages = run_decode(c, decode_attention_ref);
  std::vector<int32_t> indptr(1, 0), idx;
  for (int b = 0; b < c.batch(); ++b) {
    for (int i = c.gather_indptr[b]; i < c.gather_indptr[b + 1]; ++i)
      for (int s = 0; s < c.page_size; ++s)
        if (c.gather_indices[i] * c.page_size + s < c.kv_lens[b])
          idx.push_back(c.gather_indices[i] * c.page_size + s);
    indptr.push_back(static_cast<int32_t>(idx.size()));
  }
  c.gather = GatherMode::kTokens;
  c.gather_indptr = indptr;
  c.gather_indices = idx;
  const auto by_tokens = run_decode(c, decode_attention_ref);
  EXPECT_EQ(by_pages, by_tokens);
}

// Partial states over a split of the tokens merge into the softmax over all of them.
TEST(PagedDecodeMerge, PartialStatesMergeToTheWhole) {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 2.0);
  const int rows = 5, S = 6, D = 24;
  std::vector<float> po(rows * S * D), pm(rows * S), pl(rows * S);
  std::vector<double> want(rows * D);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> all_s;
    std::vector<std::vector<double>> all_v;
    for (int s = 0; s < S; ++s) {
      const int n = (r + s) % 4 == 0 ? 0 : 1 + (s * 7 + r) % 9;  // some states are empty
      std::vector<double> sc(n);
      std::vector<std::vector<double>> vv(n, std::vector<double>(D));
      double m = -INFINITY;
      for (int i = 0; i < n; ++i) {
        sc[i] = nd(rng);
        for (auto& x : vv[i]) x = nd(rng);
        m = std::max(m, sc[i]);
        all_s.push_back(sc[i]);
        all_v.push_back(vv[i]);
      }
      double l = 0;
      std::vector<double> o(D, 0.0);
      for (int i = 0; i < n; ++i) {
        const double w = std::exp(sc[i] - m);
        l += w;
        for (int d = 0; d < D; ++d) o[d] += w * vv[i][d];
      }
      pm[r * S + s] = n ? static_cast<float>(m) : -INFINITY;
      pl[r * S + s] = static_cast<float>(l);
      for (int d = 0; d < D; ++d) po[(r * S + s) * D + d] = n ? static_cast<float>(o[d] / l) : 0.f;
    }
    const double M = *std::max_element(all_s.begin(), all_s.end());
    double L = 0;
    std::vector<double> o(D, 0.0);
    for (size_t i = 0; i < all_s.size(); ++i) {
      const double w = std::exp(all_s[i] - M);
      L += w;
      for (int d = 0; d < D; ++d) o[d] += w * all_v[i][d];
    }
    for (int d = 0; d < D; ++d) want[r * D + d] = o[d] / L;
  }
  for (auto fn : {attention_merge_ref, attention_merge_cpu}) {
    std::vector<float> out(rows * D, NAN), lse(rows, NAN);
    AttentionMergeParams p{po.data(),  pm.data(), pl.data(), out.data(), KvDtype::kF32,
                           lse.data(), rows,      S,         D};
    ASSERT_EQ(attention_merge_check(p), "");
    fn(p);
    for (int i = 0; i < rows * D; ++i) ASSERT_NEAR(out[i], want[i], 2e-5) << i;
    for (float x : lse) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(PagedDecodeMerge, AllEmptyGivesZeros) {
  std::vector<float> po(2 * 8, 1.f), pm(2, -INFINITY), pl(2, 0.f), out(8, NAN), lse(1, 0.f);
  AttentionMergeParams p{po.data(),  pm.data(), pl.data(), out.data(), KvDtype::kF32,
                         lse.data(), 1,         2,         8};
  attention_merge_cpu(p);
  for (float x : out) EXPECT_EQ(x, 0.f);
  EXPECT_EQ(lse[0], -INFINITY);
}

TEST(PagedAppendCpu, MatchesOracleWithConversion) {
  std::mt19937 rng(21);
  for (const auto& dtypes :
       {std::pair{KvDtype::kF16, KvDtype::kF16}, std::pair{KvDtype::kF32, KvDtype::kBF16},
        std::pair{KvDtype::kBF16, KvDtype::kF32}}) {
    const KvDtype src = dtypes.first, dst = dtypes.second;
    const int H = 2, D = 64, ps = 7;
    std::vector<int32_t> before = {0, 5, 13}, add = {3, 1, 9}, indptr = {0}, pages_indptr = {0};
    int total = 0;
    for (int b = 0; b < 3; ++b) {
      indptr.push_back(indptr.back() + add[b]);
      total += (before[b] + add[b] + ps - 1) / ps;
      pages_indptr.push_back(total);
    }
    const auto pages = testing::shuffled_pages(total, 2, rng);
    const size_t n = static_cast<size_t>(indptr.back()) * H * D,
                 pool = static_cast<size_t>(total + 2) * ps * H * D;
    std::normal_distribution<float> nd;
    std::vector<float> kf(n), vf(n);
    for (auto* v : {&kf, &vf})
      for (auto& x : *v) x = nd(rng);
    auto as_src = [&](const std::vector<float>& f) {
      std::vector<uint8_t> out(n * kv_dtype_bytes(src));
      for (size_t i = 0; i < n; ++i) {
        if (src == KvDtype::kF32)
          std::memcpy(out.data() + 4 * i, &f[i], 4);
        else {
          const uint16_t b = testing::to_bits(f[i], src);
          std::memcpy(out.data() + 2 * i, &b, 2);
        }
      }
      return out;
    };
    const auto ks = as_src(kf), vs = as_src(vf);
    std::vector<uint8_t> kp_ref(pool * kv_dtype_bytes(dst)), vp_ref(kp_ref.size());
    for (auto& x : kp_ref) x = static_cast<uint8_t>(rng());
    for (auto& x : vp_ref) x = static_cast<uint8_t>(rng());
    auto kp_cpu = kp_ref, vp_cpu = vp_ref;
    PagedAppendParams p{src,
                        dst,
                        ks.data(),
                        vs.data(),
                        indptr.data(),
                        before.data(),
                        kp_ref.data(),
                        vp_ref.data(),
                        pages_indptr.data(),
                        pages.data(),
                        3,
                        H,
                        D,
                        ps};
    ASSERT_EQ(paged_append_check(p), "");
    paged_append_ref(p);
    p.k_pages = kp_cpu.data();
    p.v_pages = vp_cpu.data();
    paged_append_cpu(p);
    EXPECT_EQ(kp_cpu, kp_ref);
    EXPECT_EQ(vp_cpu, vp_ref);
  }
}

// ---------------------------------------------------------------------------------------------
// KIVI store

struct KiviCase {
  int bits, hd, group, ps, R, vg;
};

std::vector<KiviCase> kivi_cases() {
  return {{2, 128, 4, 32, 128, 32}, {4, 64, 1, 16, 0, 32},   {8, 128, 8, 32, 64, 32},
          {2, 64, 8, 16, 32, 8},    {4, 128, 4, 16, 48, 16}, {8, 64, 4, 32, 0, 64},
          {4, 72, 3, 16, 32, 8},    {2, 64, 2, 32, 64, 4}};
}

KiviLayout layout_of(const KiviCase& k, int kv_heads = 2) {
  KiviLayout L;
  L.num_kv_heads = kv_heads;
  L.head_dim = k.hd;
  L.page_size = k.ps;
  L.k_bits = L.v_bits = k.bits;
  L.v_group_size = k.vg;
  L.residual_length = k.R;
  return L;
}

TEST(QuantKiviAppendCpu, BitIdenticalToOracleAcrossChunkBoundaries) {
  uint32_t seed = 500;
  for (const KiviCase& kc : kivi_cases())
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
      std::mt19937 rng(seed), rng2(seed);
      ++seed;
      const KiviLayout L = layout_of(kc);
      ASSERT_EQ(kivi_layout_check(L), "");
      auto a = testing::make_kivi_store(dt, L, kc.group, 3, 400, rng);
      auto b = testing::make_kivi_store(dt, L, kc.group, 3, 400, rng2);
      // Prefill-sized chunks, then decode steps: lengths cross every chunk and page boundary.
      for (const std::vector<int32_t>& add :
           {std::vector<int32_t>{1, 54, 97}, {1, 1, 1}, {130, 2, 64}, {1, 1, 1}, {33, 77, 0}}) {
        std::mt19937 r1(seed * 7 + add[0]), r2(seed * 7 + add[0]);
        testing::kivi_append_random(a, add, r1, kivi_append_ref);
        testing::kivi_append_random(b, add, r2, kivi_append_cpu);
        ASSERT_EQ(a.k_codes, b.k_codes);
        ASSERT_EQ(a.v_codes, b.v_codes);
        ASSERT_EQ(a.k_scales, b.k_scales);
        ASSERT_EQ(a.k_mins, b.k_mins);
        ASSERT_EQ(a.v_scales, b.v_scales);
        ASSERT_EQ(a.v_mins, b.v_mins);
        ASSERT_EQ(a.k_res, b.k_res);
        ASSERT_EQ(a.v_res, b.v_res);
      }
    }
}

// What the store holds: residual tokens exactly, quantized tokens within half a step of the input,
// and byte for byte what group_quantize_ref writes for each key page / value row.
TEST(QuantKiviAppendCpu, StoreHoldsTheKiviLayout) {
  std::mt19937 rng(600);
  for (const KiviCase& kc : kivi_cases()) {
    const KiviLayout L = layout_of(kc, 1);
    auto s = testing::make_kivi_store(KvDtype::kF16, L, 1, 1, 300, rng);
    const int n = 203;
    std::vector<int32_t> indptr = {0, n};
    const auto k_new =
        testing::random_bits(static_cast<size_t>(n) * L.head_dim, KvDtype::kF16, rng);
    const auto v_new = testing::random_bits(k_new.size(), KvDtype::kF16, rng);
    s.grow_pages({n});
    kivi_append_cpu(s.append_params(k_new, v_new, indptr));
    s.kv_lens[0] = n;
    const int64_t hd = L.head_dim, ps = L.page_size, U = kivi_residual_capacity(L);
    const int64_t kq = kivi_k_quant_len(L, n), vq = kivi_v_quant_len(L, n);
    EXPECT_EQ(kq % ps, 0);
    EXPECT_EQ(n - kq, n % U);
    // Keys: page blocks as group_quantize_ref writes them; the rest in the ring.
    std::vector<float> page(ps * hd);
    std::vector<uint8_t> codes(kivi_k_page_bytes(L));
    std::vector<uint16_t> sc(hd), mn(hd);
    for (int64_t pg = 0; pg < kq / ps; ++pg) {
      for (int64_t i = 0; i < ps * hd; ++i) page[i] = half_to_float(k_new[pg * ps * hd + i]);
      GroupQuantizeParams q{{L.k_bits, ps, hd, ps, QuantAxis::kColumn},
                            page.data(),
                            0,
                            codes.data(),
                            sc.data(),
                            mn.data()};
      group_quantize_ref(q);
      const int64_t blk = s.page_indices[pg];
      ASSERT_TRUE(std::equal(codes.begin(), codes.end(), s.k_codes.begin() + blk * codes.size()))
          << pg;
      ASSERT_TRUE(std::equal(sc.begin(), sc.end(), s.k_scales.begin() + blk * hd));
      ASSERT_TRUE(std::equal(mn.begin(), mn.end(), s.k_mins.begin() + blk * hd));
    }
    for (int64_t j = kq; j < n; ++j)
      for (int64_t c = 0; c < hd; ++c) ASSERT_EQ(s.k_res[(j % U) * hd + c], k_new[j * hd + c]);
    // Values: each quantized row within half a step of its input.
    const int64_t G = kivi_v_groups_per_row(L);
    std::vector<float> row(hd);
    for (int64_t j = 0; j < vq; ++j) {
      const int64_t blk = s.page_indices[j / ps];
      GroupDequantizeParams d{
          {L.v_bits, 1, hd, L.v_group_size, QuantAxis::kRow},
          s.v_codes.data() + blk * kivi_v_page_bytes(L) + (j % ps) * hd * L.v_bits / 8,
          s.v_scales.data() + (blk * ps + j % ps) * G,
          s.v_mins.data() + (blk * ps + j % ps) * G,
          row.data(),
          0};
      group_dequantize_ref(d);
      for (int64_t c = 0; c < hd; ++c) {
        const float step = half_to_float(s.v_scales[(blk * ps + j % ps) * G + c / L.v_group_size]);
        ASSERT_LE(std::fabs(row[c] - half_to_float(v_new[j * hd + c])),
                  0.5f * step * 1.0001f + 1e-6f);
      }
    }
    for (int64_t j = vq; j < n; ++j)
      for (int64_t c = 0; c < hd; ++c) ASSERT_EQ(s.v_res[(j % U) * hd + c], v_new[j * hd + c]);
  }
}

TEST(QuantKiviDecodeCpu, MatchesOracle) {
  uint32_t seed = 700;
  for (const KiviCase& kc : kivi_cases())
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
      std::mt19937 rng(seed++);
      const KiviLayout L = layout_of(kc);
      auto s = testing::make_kivi_store(dt, L, kc.group, 4, 2048, rng);
      testing::kivi_append_random(s, kLens, rng, kivi_append_cpu);
      s.q = testing::random_bits(s.out_elems(), dt, rng);
      std::vector<uint16_t> ref(s.out_elems(), nan_bits(dt)), cpu = ref;
      ASSERT_EQ(kivi_decode_check(s.decode_params(ref.data())), "");
      kivi_decode_ref(s.decode_params(ref.data()));
      kivi_decode_cpu(s.decode_params(cpu.data()));
      ASSERT_TRUE(testing::all_finite(ref, dt));
      EXPECT_LE(rel_err(cpu, ref, dt), tolerance(dt))
          << "bits " << kc.bits << " hd " << kc.hd << " g " << kc.group;
    }
}

// Semantics: decode over the KIVI store approximates exact attention over the unquantized tokens,
// closer with more bits.
TEST(QuantKiviDecodeCpu, ApproachesExactAttentionWithMoreBits) {
  std::vector<double> errs;
  for (int bits : {2, 4, 8}) {
    std::mt19937 rng(800);
    KiviLayout L = layout_of({bits, 64, 4, 16, 32, 32}, 2);
    auto s = testing::make_kivi_store(KvDtype::kF16, L, 4, 1, 600, rng);
    const int n = 600;
    std::vector<int32_t> indptr = {0, n};
    const auto k_new = testing::random_bits(static_cast<size_t>(n) * 2 * 64, KvDtype::kF16, rng);
    const auto v_new = testing::random_bits(k_new.size(), KvDtype::kF16, rng);
    s.grow_pages({n});
    kivi_append_cpu(s.append_params(k_new, v_new, indptr));
    s.kv_lens[0] = n;
    s.q = testing::random_bits(s.out_elems(), KvDtype::kF16, rng);
    std::vector<uint16_t> o(s.out_elems());
    kivi_decode_ref(s.decode_params(o.data()));
    // The same tokens in a plain paged cache (one page holding all of them).
    testing::PagedCache c;
    c.dtype = KvDtype::kF16;
    c.kv_heads = 2;
    c.group = 4;
    c.head_dim = 64;
    c.page_size = n;
    c.kv_lens = {n};
    c.page_indptr = {0, 1};
    c.page_indices = {0};
    c.q = s.q;
    c.k = k_new;
    c.v = v_new;
    const auto exact = run_decode(c, decode_attention_ref);
    errs.push_back(rel_err(o, exact, KvDtype::kF16));
  }
  EXPECT_LT(errs[2], 0.02);
  EXPECT_LT(errs[2], errs[1]);
  EXPECT_LT(errs[1], errs[0]);
  EXPECT_LT(errs[0], 0.6);
}

}  // namespace
}  // namespace kvb::kernels
