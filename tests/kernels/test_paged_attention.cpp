// paged_attention_cpu against the scalar oracle on odd sizes: lengths 1/54/97/2048, partial last pages,
// GQA groups 1/3/4/8, head_dim 64/128, shuffled page ids, multi-token chunks with history (the tiled
// prefill path), poisoned output.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kvb/kernels/paged_attention.h"

namespace kvb::kernels {
namespace {

struct Case {
  std::vector<int64_t> past;   // per sequence
  std::vector<int64_t> n_new;  // per sequence
  int kv_heads, group, head_dim, page_size;
};

void run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int B = static_cast<int>(c.past.size());
  const int H = c.kv_heads * c.group, D = c.head_dim, P = c.page_size;
  std::vector<int64_t> q_indptr(B + 1, 0);
  std::vector<int32_t> page_indptr(B + 1, 0);
  int total_pages = 0;
  for (int b = 0; b < B; ++b) {
    q_indptr[b + 1] = q_indptr[b] + c.n_new[b];
    const int64_t len = c.past[b] + c.n_new[b];
    total_pages += static_cast<int>((len + P - 1) / P);
    page_indptr[b + 1] = total_pages;
  }
  // Pages handed out in a shuffled order, with spare pages in the pool, as a real allocator would.
  const int pool = total_pages + 3;
  std::vector<int32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(total_pages);
  const int64_t T = q_indptr[B];
  std::vector<float> q(T * H * D), k(static_cast<size_t>(pool) * P * c.kv_heads * D),
      v(k.size());
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  std::vector<float> o_ref(q.size(), NAN), o_cpu(q.size(), NAN);  // poisoned
  PagedAttentionParams p;
  p.q = q.data();
  p.k_pages = k.data();
  p.v_pages = v.data();
  p.page_indptr = page_indptr.data();
  p.page_indices = ids.data();
  p.q_indptr = q_indptr.data();
  p.past_lens = c.past.data();
  p.batch_size = B;
  p.num_qo_heads = H;
  p.num_kv_heads = c.kv_heads;
  p.head_dim = D;
  p.page_size = P;
  p.sm_scale = 1.f / std::sqrt(static_cast<float>(D));
  p.o = o_ref.data();
  ASSERT_EQ(paged_attention_check(p), "");
  paged_attention_ref(p);
  p.o = o_cpu.data();
  paged_attention_cpu(p);
  double max_rel = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_TRUE(std::isfinite(o_cpu[i])) << "unwritten or non-finite output at " << i;
    max_rel = std::max(max_rel, std::abs(o_cpu[i] - o_ref[i]) / (std::abs(o_ref[i]) + 1e-2));
  }
  EXPECT_LT(max_rel, 1e-3);
}

TEST(PagedAttention, DecodeLengthsAndGroups) {
  for (int64_t len : {1, 54, 97, 2048})
    for (int group : {1, 4, 8})
      for (int hd : {64, 128}) {
        SCOPED_TRACE(testing::Message() << "len " << len << " group " << group << " hd " << hd);
        run_case({{len - 1, len / 2}, {1, 1}, 2, group, hd, 16}, 17u + len + group + hd);
      }
}

TEST(PagedAttention, PrefillChunksWithHistoryAndPartialPages) {
  run_case({{0, 37, 5}, {54, 13, 1}, 2, 4, 64, 16}, 3);
  run_case({{100}, {97}, 1, 8, 128, 7}, 4);  // page size 7: every page boundary is odd
  run_case({{0}, {33}, 4, 2, 64, 1}, 5);     // page size 1: token-level pages
}

// Prefill chunks long enough for the tiled path: query blocks of 32 tokens, key blocks of 256 (so
// several key blocks, causal skips and a partial last block), gathered from small pages or read in
// place from one page (the dense caches' layout), groups of 3 (SmolLM2's 9/3), short chunks beside
// long ones in one batch.
TEST(PagedAttention, LongPrefillThroughTheTiledPath) {
  run_case({{0}, {700}, 3, 3, 64, 16}, 6);
  run_case({{300}, {301}, 2, 3, 64, 1024}, 7);       // one page holds the sequence
  run_case({{0, 513, 7}, {260, 9, 1}, 2, 4, 64, 32}, 8);
  run_case({{1}, {8}, 1, 1, 128, 5}, 9);              // the shortest tiled chunk
}

TEST(PagedAttention, RejectsTooFewPages) {
  std::vector<int64_t> q_indptr = {0, 1}, past = {16};
  std::vector<int32_t> page_indptr = {0, 1}, pages = {0};
  std::vector<float> buf(64 * 16 * 2);
  PagedAttentionParams p;
  p.q = p.k_pages = p.v_pages = buf.data();
  p.o = buf.data();
  p.q_indptr = q_indptr.data();
  p.past_lens = past.data();
  p.page_indptr = page_indptr.data();
  p.page_indices = pages.data();
  p.batch_size = 1;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim = 8;
  p.page_size = 16;
  EXPECT_NE(paged_attention_check(p).find("too few pages"), std::string::npos);
}

}  // namespace
}  // namespace kvb::kernels

namespace kvb::kernels {
namespace {

// One kv head's query group read in place from wider rows (qo_token_stride), against that head's
// keys alone: the same bits as the packed call over all heads, decode and tiled prefill alike.
TEST(PagedAttention, OneKvHeadThroughTheTokenStrideMatchesThePackedCall) {
  const int kv_heads = 3, group = 3, hd = 64, H = kv_heads * group;
  for (int64_t n_new : {1, 40}) {
    const int64_t past = 290, len = past + n_new;
    std::mt19937 rng(21 + n_new);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(n_new * H * hd), k(len * kv_heads * hd), v(k.size());
    for (auto* vec : {&q, &k, &v})
      for (auto& x : *vec) x = nd(rng);
    const int32_t page_indptr[2] = {0, 1}, page = 0;
    const int64_t q_indptr[2] = {0, n_new};
    PagedAttentionParams p;
    p.q = q.data();
    p.k_pages = k.data();
    p.v_pages = v.data();
    p.page_indptr = page_indptr;
    p.page_indices = &page;
    p.q_indptr = q_indptr;
    p.past_lens = &past;
    p.batch_size = 1;
    p.num_qo_heads = H;
    p.num_kv_heads = kv_heads;
    p.head_dim = hd;
    p.page_size = static_cast<int32_t>(len);
    p.sm_scale = 0.125f;
    std::vector<float> packed(q.size(), NAN), strided(q.size(), NAN);
    p.o = packed.data();
    paged_attention_cpu(p);
    for (int h = 0; h < kv_heads; ++h) {
      std::vector<float> kh(len * hd), vh(len * hd);
      for (int64_t j = 0; j < len; ++j)
        for (int d = 0; d < hd; ++d) {
          kh[j * hd + d] = k[(j * kv_heads + h) * hd + d];
          vh[j * hd + d] = v[(j * kv_heads + h) * hd + d];
        }
      PagedAttentionParams ph = p;
      ph.q = q.data() + h * group * hd;
      ph.o = strided.data() + h * group * hd;
      ph.qo_token_stride = H * hd;
      ph.k_pages = kh.data();
      ph.v_pages = vh.data();
      ph.num_qo_heads = group;
      ph.num_kv_heads = 1;
      ASSERT_EQ(paged_attention_check(ph), "");
      paged_attention_cpu(ph);
    }
    for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(packed[i], strided[i]) << "n_new " << n_new << " at " << i;
  }
}

}  // namespace
}  // namespace kvb::kernels
