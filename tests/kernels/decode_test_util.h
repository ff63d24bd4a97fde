#pragma once
// Host-side fixtures shared by the CPU kernel tests (tests/kernels) and the CUDA tests
// (tests/cuda): random paged fp16/bf16 caches with shuffled page ids and spare pages, gathered
// index lists, KIVI stores filled through the append path, and error measures. Torch-free and
// GoogleTest-free.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/half.h"
#include "kvb/kernels/kivi_cache.h"

namespace kvb::kernels::testing {

inline uint16_t to_bits(float x, KvDtype d) {
  return d == KvDtype::kBF16 ? float_to_bf16(x) : float_to_half(x);
}
inline float from_bits(uint16_t b, KvDtype d) {
  return d == KvDtype::kBF16 ? bf16_to_float(b) : half_to_float(b);
}
inline uint16_t nan_bits(KvDtype d) { return d == KvDtype::kBF16 ? 0x7fc0 : 0x7e00; }

inline std::vector<uint16_t> random_bits(size_t n, KvDtype d, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bits(nd(rng), d);
  return v;
}

// ||a - b|| / ||b|| over two dtype buffers; NaN when a holds a non-finite value.
inline double rel_err(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, KvDtype d) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = from_bits(a[i], d), y = from_bits(b[i], d);
    if (!std::isfinite(x)) return NAN;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool all_finite(const std::vector<uint16_t>& a, KvDtype d) {
  for (uint16_t x : a)
    if (!std::isfinite(from_bits(x, d))) return false;
  return true;
}

// Page ids for `total` pages, shuffled, drawn from a pool with `spare` unused pages.
inline std::vector<int32_t> shuffled_pages(int total, int spare, std::mt19937& rng) {
  std::vector<int32_t> ids(total + spare);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(total);
  return ids;
}

// A paged fp16/bf16 cache with one decode query per sequence.
struct PagedCache {
  KvDtype dtype = KvDtype::kF16;
  int kv_heads = 0, group = 1, head_dim = 0, page_size = 0, num_pages = 0;
  std::vector<int32_t> kv_lens, page_indptr, page_indices;
  std::vector<uint16_t> q, k, v;  // q: [B, H, D]; k, v: [num_pages, page_size, kv_heads, D]
  GatherMode gather = GatherMode::kNone;
  std::vector<int32_t> gather_indptr, gather_indices;

  int batch() const { return static_cast<int>(kv_lens.size()); }
  int qo_heads() const { return kv_heads * group; }
  size_t out_elems() const { return static_cast<size_t>(batch()) * qo_heads() * head_dim; }

  // Params over this object's host vectors (the CUDA test swaps in device pointers).
  DecodeAttentionParams params(void* o) const {
    DecodeAttentionParams p;
    p.dtype = dtype;
    p.q = q.data();
    p.o = o;
    p.k_pages = k.data();
    p.v_pages = v.data();
    p.page_indptr = page_indptr.data();
    p.page_indices = page_indices.data();
    p.kv_lens = kv_lens.data();
    p.gather = gather;
    p.gather_indptr = gather == GatherMode::kNone ? nullptr : gather_indptr.data();
    p.gather_indices = gather == GatherMode::kNone ? nullptr : gather_indices.data();
    p.batch_size = batch();
    p.num_qo_heads = qo_heads();
    p.num_kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.page_size = page_size;
    int32_t mx = 0;
    for (int b = 0; b < batch(); ++b)
      mx = std::max<int32_t>(mx, static_cast<int32_t>(decode_scan_len(p, b)));
    p.max_scan_len = mx;
    p.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    return p;
  }
};

inline PagedCache make_paged_cache(KvDtype dtype, const std::vector<int32_t>& lens, int kv_heads,
                                   int group, int head_dim, int page_size, std::mt19937& rng) {
  PagedCache c;
  c.dtype = dtype;
  c.kv_heads = kv_heads;
  c.group = group;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.kv_lens = lens;
  c.page_indptr.assign(1, 0);
  int total = 0;
  for (int32_t n : lens) {
    total += (n + page_size - 1) / page_size;
    c.page_indptr.push_back(total);
  }
  c.num_pages = total + 3;
  c.page_indices = shuffled_pages(total, 3, rng);
  const size_t pool = static_cast<size_t>(c.num_pages) * page_size * kv_heads * head_dim;
  c.q = random_bits(c.out_elems(), dtype, rng);
  c.k = random_bits(pool, dtype, rng);
  c.v = random_bits(pool, dtype, rng);
  return c;
}

// Token lists: random positions (unordered, with repeats) covering about `frac` of each sequence,
// at least one token; sequence `empty_seq` (if >= 0) gets none.
inline void set_token_gather(PagedCache& c, double frac, std::mt19937& rng, int empty_seq = -1) {
  c.gather = GatherMode::kTokens;
  c.gather_indptr.assign(1, 0);
  c.gather_indices.clear();
  for (int b = 0; b < c.batch(); ++b) {
    const int n = c.kv_lens[b];
    int count = b == empty_seq || n == 0 ? 0 : std::max(1, static_cast<int>(n * frac));
    std::uniform_int_distribution<int> pick(0, std::max(0, n - 1));
    for (int i = 0; i < count; ++i) c.gather_indices.push_back(pick(rng));
    c.gather_indptr.push_back(static_cast<int32_t>(c.gather_indices.size()));
  }
}

// Page lists: a random subset (in random order) of each sequence's logical pages, always including
// the partial last page when there is one.
inline void set_page_gather(PagedCache& c, double frac, std::mt19937& rng, int empty_seq = -1) {
  c.gather = GatherMode::kPages;
  c.gather_indptr.assign(1, 0);
  c.gather_indices.clear();
  for (int b = 0; b < c.batch(); ++b) {
    const int pages = (c.kv_lens[b] + c.page_size - 1) / c.page_size;
    std::vector<int32_t> ids(pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    int count = b == empty_seq ? 0 : std::max(std::min(pages, 1), static_cast<int>(pages * frac));
    ids.resize(count);
    if (count > 0 && c.kv_lens[b] % c.page_size != 0 &&
        std::find(ids.begin(), ids.end(), pages - 1) == ids.end())
      ids[0] = pages - 1;
    c.gather_indices.insert(c.gather_indices.end(), ids.begin(), ids.end());
    c.gather_indptr.push_back(static_cast<int32_t>(c.gather_indices.size()));
  }
}

// A KIVI store (kivi_cache.h) on the host, pools pre-filled with random bytes (so that unwritten
// bytes show up) and grown through kivi_append_cpu.
struct KiviStore {
  KvDtype dtype = KvDtype::kF16;
  KiviLayout L;
  int group = 1, num_pages = 0;
  std::vector<int32_t> kv_lens, page_indptr, page_indices;
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<uint16_t> k_scales, k_mins, v_scales, v_mins, k_res, v_res, q;

  int batch() const { return static_cast<int>(kv_lens.size()); }
  int qo_heads() const { return L.num_kv_heads * group; }
  size_t out_elems() const { return static_cast<size_t>(batch()) * qo_heads() * L.head_dim; }

  KiviDecodeParams decode_params(void* o) const {
    KiviDecodeParams p;
    p.dtype = dtype;
    p.layout = L;
    p.q = q.data();
    p.o = o;
    p.k_codes = k_codes.data();
    p.k_scales = k_scales.data();
    p.k_mins = k_mins.data();
    p.v_codes = v_codes.data();
    p.v_scales = v_scales.data();
    p.v_mins = v_mins.data();
    p.k_residual = k_res.data();
    p.v_residual = v_res.data();
    p.page_indptr = page_indptr.data();
    p.page_indices = page_indices.data();
    p.kv_lens = kv_lens.data();
    p.batch_size = batch();
    p.num_qo_heads = qo_heads();
    p.max_kv_len = kv_lens.empty() ? 0 : *std::max_element(kv_lens.begin(), kv_lens.end());
    p.sm_scale = 1.0f / std::sqrt(static_cast<float>(L.head_dim));
    return p;
  }

  // Append params for new tokens k_new/v_new ([sum(add), kv_heads, hd] dtype bits), over this
  // object's host vectors; the page table must already cover the grown lengths (grow_pages).
  KiviAppendParams append_params(const std::vector<uint16_t>& k_new,
                                 const std::vector<uint16_t>& v_new,
                                 const std::vector<int32_t>& new_indptr) {
    KiviAppendParams p;
    p.dtype = dtype;
    p.layout = L;
    p.k_new = k_new.data();
    p.v_new = v_new.data();
    p.new_indptr = new_indptr.data();
    p.kv_lens = kv_lens.data();
    p.k_codes = k_codes.data();
    p.k_scales = k_scales.data();
    p.k_mins = k_mins.data();
    p.v_codes = v_codes.data();
    p.v_scales = v_scales.data();
    p.v_mins = v_mins.data();
    p.k_residual = k_res.data();
    p.v_residual = v_res.data();
    p.page_indptr = page_indptr.data();
    p.page_indices = page_indices.data();
    p.batch_size = batch();
    return p;
  }

  // Page table for the lengths kv_lens[b] + add[b]: each sequence keeps its pages and gets fresh
  // ones from the free pool (ids shuffled once at construction).
  std::vector<int32_t> free_pages;
  std::vector<std::vector<int32_t>> seq_pages;
  void grow_pages(const std::vector<int32_t>& add) {
    page_indptr.assign(1, 0);
    page_indices.clear();
    // Non-null even when no page is needed yet (every token in the residual): the checks reject
    // null arrays, and a GPU run needs a device copy to point at.
    page_indices.reserve(static_cast<size_t>(num_pages) + 1);
    for (int b = 0; b < batch(); ++b) {
      const int64_t need = kivi_pages_needed(L, kv_lens[b] + add[b]);
      while (static_cast<int64_t>(seq_pages[b].size()) < need) {
        seq_pages[b].push_back(free_pages.back());
        free_pages.pop_back();
      }
      page_indices.insert(page_indices.end(), seq_pages[b].begin(), seq_pages[b].end());
      page_indptr.push_back(static_cast<int32_t>(page_indices.size()));
    }
  }
};

inline KiviStore make_kivi_store(KvDtype dtype, const KiviLayout& L, int group, int batch,
                                 int max_len, std::mt19937& rng) {
  KiviStore s;
  s.dtype = dtype;
  s.L = L;
  s.group = group;
  s.kv_lens.assign(batch, 0);
  s.num_pages = batch * static_cast<int>(kivi_pages_needed(L, max_len)) + 5;
  s.free_pages = shuffled_pages(s.num_pages, 0, rng);
  s.seq_pages.assign(batch, {});
  const int64_t H = L.num_kv_heads, hd = L.head_dim, ps = L.page_size,
                U = kivi_residual_capacity(L);
  std::uniform_int_distribution<int> byte(0, 255);
  auto fill8 = [&](std::vector<uint8_t>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = static_cast<uint8_t>(byte(rng));
  };
  fill8(s.k_codes, s.num_pages * H * kivi_k_page_bytes(L));
  fill8(s.v_codes, s.num_pages * H * kivi_v_page_bytes(L));
  s.k_scales = random_bits(s.num_pages * H * hd, KvDtype::kF16, rng);
  s.k_mins = random_bits(s.k_scales.size(), KvDtype::kF16, rng);
  s.v_scales = random_bits(s.num_pages * H * ps * kivi_v_groups_per_row(L), KvDtype::kF16, rng);
  s.v_mins = random_bits(s.v_scales.size(), KvDtype::kF16, rng);
  s.k_res = random_bits(batch * U * H * hd, dtype, rng);
  s.v_res = random_bits(s.k_res.size(), dtype, rng);
  s.grow_pages(std::vector<int32_t>(batch, 0));
  return s;
}

// Appends add[b] random tokens to every sequence with kivi_append_cpu (in one call).
inline void kivi_append_random(KiviStore& s, const std::vector<int32_t>& add, std::mt19937& rng,
                               void (*append)(const KiviAppendParams&)) {
  std::vector<int32_t> indptr(1, 0);
  for (int32_t a : add) indptr.push_back(indptr.back() + a);
  const size_t n = static_cast<size_t>(indptr.back()) * s.L.num_kv_heads * s.L.head_dim;
  const auto k_new = random_bits(n, s.dtype, rng), v_new = random_bits(n, s.dtype, rng);
  s.grow_pages(add);
  append(s.append_params(k_new, v_new, indptr));
  for (int b = 0; b < s.batch(); ++b) s.kv_lens[b] += add[b];
}

}  // namespace kvb::kernels::testing
