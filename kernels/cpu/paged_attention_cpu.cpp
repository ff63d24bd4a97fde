#include <algorithm>
#include <cmath>
#include <vector>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/fast_exp.h"
#include "kvb/kernels/detail/gemm.h"
#include "kvb/kernels/detail/tile_attention.h"
#include "kvb/kernels/paged_attention.h"
#include "kvb/kernels/threads.h"

namespace kvb::kernels {

namespace {

// ---- Decode-shaped work: one (token, kv head) ----
// The query group's heads share each K/V row read. The keys go in tiles of kKeyTile (across page
// boundaries, so that small pages do not cost a softmax step each): the whole group's scores
// against a tile (tile_attention.h: register blocks, rows read in place with their token stride),
// one online-softmax step per head, then the group's value sums. Compiled for AVX2 as well
// (cpu_clones.h), with the same bits either way. Arithmetic: q scaled by sm_scale first (as the
// tiled path below does), dot_f32's order, tile_softmax, value rows added in order.
constexpr int64_t kKeyTile = 256;

KVB_CPU_CLONES void attend_group(const PagedAttentionParams& p, int b, int64_t t, int kvh,
                                 float* scratch) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t page_stride = p.page_size * tok_stride;
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  const int64_t n_keys = p.past_lens[b] + (t - p.q_indptr[b]) + 1;

  float* acc = scratch;         // [group, hd]
  float* q = acc + group * hd;  // [group, hd], scaled
  float* m = q + group * hd;    // [group]
  float* l = m + group;         // [group]
  float* s = l + group;         // [group, kKeyTile]
  const float* qsrc = p.q + t * p.qo_stride() + kvh * group * hd;
  for (int i = 0; i < group * hd; ++i) q[i] = qsrc[i] * p.sm_scale;
  for (int g = 0; g < group; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + group * hd, 0.f);

  // Calls fn(first key, key count, its page's rows from that key) for each page's share of the
  // keys [j0, j1).
  auto for_segments = [&](int64_t j0, int64_t j1, auto&& fn) KVB_SIMD_INLINE_LAMBDA {
    for (int64_t j = j0; j < j1;) {
      const int64_t off = j % p.page_size, cnt = std::min(p.page_size - off, j1 - j);
      fn(j, cnt, pages[j / p.page_size] * page_stride + off * tok_stride + kvh * hd);
      j += cnt;
    }
  };
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyTile) {
    const int64_t j1 = std::min(n_keys, j0 + kKeyTile);
    for_segments(j0, j1, [&](int64_t j, int64_t cnt, int64_t row) KVB_SIMD_INLINE_LAMBDA {
      detail::tile_scores(q, group, hd, p.k_pages + row, tok_stride, cnt, s + (j - j0), kKeyTile);
    });
    for (int g = 0; g < group; ++g)
      detail::tile_softmax(s + g * kKeyTile, j1 - j0, m + g, l + g, acc + g * hd, hd);
    for_segments(j0, j1, [&](int64_t j, int64_t cnt, int64_t row) KVB_SIMD_INLINE_LAMBDA {
      detail::tile_values(acc, group, hd, s + (j - j0), kKeyTile, p.v_pages + row, tok_stride, cnt);
    });
  }
  float* obase = p.o + t * p.qo_stride() + kvh * group * hd;
  for (int g = 0; g < group; ++g) {
    const float inv = 1.f / l[g];
    for (int d = 0; d < hd; ++d) obase[g * hd + d] = acc[g * hd + d] * inv;
  }
}

// ---- Prefill-shaped work: a block of query tokens of one sequence, one kv head ----
// FlashAttention's tiling on the CPU: the block's rows (token, group head) against key blocks of
// kKeyBlock, scores and value sums as BLAS GEMMs, an online softmax between them, and key blocks past
// the block's last query skipped (causal). A key block is gathered from its pages into contiguous
// rows unless the sequence sits in one page (the dense caches), where the GEMMs read the page with
// its token stride.
constexpr int64_t kQueryBlock = 32;   // tokens per work item (x group rows)
constexpr int64_t kKeyBlock = 256;    // keys per GEMM pair
constexpr int64_t kMinTiledTokens = 8;  // fewer new tokens than this: the decode-shaped path

struct TiledScratch {
  std::vector<float> q, k, v, s, o, m, l;
  void size(int64_t rows, int64_t hd) {
    q.resize(rows * hd);
    o.resize(rows * hd);
    s.resize(rows * kKeyBlock);
    k.resize(kKeyBlock * hd);
    v.resize(kKeyBlock * hd);
    m.resize(rows);
    l.resize(rows);
  }
};

// Row r = (token t0 + r / group, head g = r % group) of the block: exponentiate its scores against
// keys [j0, j0 + nk) in place, masked past its causal limit, and fold them into the running max m,
// sum l and output row o (rescaled by exp(m_old - m_new)).
KVB_CPU_CLONES void softmax_block(float* s, float* o, float* m, float* l, int64_t rows, int group,
                                  int64_t hd, int64_t nk, int64_t j0, int64_t first_limit) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kKeyBlock;
    // Keys j <= limit are visible to this row: limit = past + local token index.
    const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(nk, first_limit + r / group - j0 + 1));
    // Max and sum in eight fixed lanes (a single accumulator is a serial chain the compiler may not
    // reorder); the exps in their own loop, so that it vectorises.
    float lane[8];
    for (int k = 0; k < 8; ++k) lane[k] = m[r];
    int64_t j = 0;
    for (; j + 8 <= valid; j += 8)
      for (int k = 0; k < 8; ++k) lane[k] = std::max(lane[k], sr[j + k]);
    for (; j < valid; ++j) lane[0] = std::max(lane[0], sr[j]);
    const float mx = std::max(std::max(std::max(lane[0], lane[1]), std::max(lane[2], lane[3])),
                              std::max(std::max(lane[4], lane[5]), std::max(lane[6], lane[7])));
    const float corr = detail::exp_f32(m[r] - mx);
    const int nv = static_cast<int>(valid);
    for (int i = 0; i < nv; ++i) sr[i] = detail::exp_f32(sr[i] - mx);
    for (j = valid; j < nk; ++j) sr[j] = 0.f;
    for (int k = 0; k < 8; ++k) lane[k] = 0.f;
    for (j = 0; j + 8 <= valid; j += 8)
      for (int k = 0; k < 8; ++k) lane[k] += sr[j + k];
    for (; j < valid; ++j) lane[0] += sr[j];
    const float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    l[r] = l[r] * corr + sum;
    m[r] = mx;
    float* orow = o + r * hd;
    for (int64_t d = 0; d < hd; ++d) orow[d] *= corr;
  }
}

void attend_tiled(const PagedAttentionParams& p, int b, int64_t t0, int64_t t1, int kvh,
                  TiledScratch& w) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t hd = p.head_dim;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t page_stride = p.page_size * tok_stride;
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  const int64_t past = p.past_lens[b];
  const int64_t rows = (t1 - t0) * group;
  const int64_t local0 = t0 - p.q_indptr[b];  // the block's first token within its sequence's step
  const int64_t n_keys = past + (t1 - p.q_indptr[b]);  // keys the block's last token sees
  const bool one_page = p.page_indptr[b + 1] - p.page_indptr[b] == 1;
  w.size(rows, hd);
  // The block's query rows, pre-scaled by sm_scale, contiguous: row (t, g) <- q[t, kvh * group + g].
  for (int64_t t = t0; t < t1; ++t)
    for (int g = 0; g < group; ++g) {
      const float* src = p.q + t * p.qo_stride() + (kvh * group + g) * hd;
      float* dst = w.q.data() + ((t - t0) * group + g) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = src[d] * p.sm_scale;
    }
  std::fill(w.o.begin(), w.o.begin() + rows * hd, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rows, -INFINITY);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.f);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, n_keys - j0);
    const float* kb;
    const float* vb;
    int64_t ld;
    if (one_page) {
      kb = p.k_pages + pages[0] * page_stride + j0 * tok_stride + kvh * hd;
      vb = p.v_pages + pages[0] * page_stride + j0 * tok_stride + kvh * hd;
      ld = tok_stride;
    } else {
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t key = j0 + j;
        const int64_t off = pages[key / p.page_size] * page_stride +
                            (key % p.page_size) * tok_stride + kvh * hd;
        std::copy(p.k_pages + off, p.k_pages + off + hd, w.k.data() + j * hd);
        std::copy(p.v_pages + off, p.v_pages + off + hd, w.v.data() + j * hd);
      }
      kb = w.k.data();
      vb = w.v.data();
      ld = hd;
    }
    detail::gemm_nt(rows, nk, hd, w.q.data(), hd, kb, ld, 0.f, w.s.data(), kKeyBlock);
    softmax_block(w.s.data(), w.o.data(), w.m.data(), w.l.data(), rows, group, hd, nk, j0,
                  past + local0);
    detail::gemm_nn(rows, hd, nk, w.s.data(), kKeyBlock, vb, ld, 1.f, w.o.data(), hd);
  }
  for (int64_t t = t0; t < t1; ++t)
    for (int g = 0; g < group; ++g) {
      const int64_t r = (t - t0) * group + g;
      const float inv = 1.f / w.l[r];
      float* dst = p.o + t * p.qo_stride() + (kvh * group + g) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = w.o[r * hd + d] * inv;
    }
}

// A work item: tokens [t0, t1) of sequence b against kv head kvh; tiled when t1 - t0 > 1.
struct Item {
  int32_t b, kvh;
  int64_t t0, t1;
};

// Per-thread buffers, kept between calls: a small model's decode step calls this kernel once per
// layer, and allocating (and zeroing) them each time cost more than its attention.
struct ThreadScratch {
  std::vector<float> decode;  // attend_group's
  TiledScratch tiled;
  std::vector<Item> items;  // the calling thread's work list
};
ThreadScratch& thread_scratch() {
  static thread_local ThreadScratch t;
  return t;
}

}  // namespace

void paged_attention_cpu(const PagedAttentionParams& p) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const size_t scratch_floats = static_cast<size_t>(group) * (2 * p.head_dim + 2 + kKeyTile);
  // Sequences with many new tokens (prefill chunks) go in query blocks through the tiled path; the
  // rest (decode steps, short chunks) token by token.
  std::vector<Item>& items = thread_scratch().items;
  items.clear();
  double macs = 0;
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t q0 = p.q_indptr[b], q1 = p.q_indptr[b + 1];
    const int64_t n_new = q1 - q0;
    macs += static_cast<double>(n_new) * static_cast<double>(p.past_lens[b] + (n_new + 1) / 2) *
            p.num_qo_heads * p.head_dim * 2.0;
    const bool tiled = n_new >= kMinTiledTokens;
    for (int64_t t = q0; t < q1; t += tiled ? kQueryBlock : 1)
      for (int kvh = 0; kvh < p.num_kv_heads; ++kvh)
        items.push_back({b, kvh, t, tiled ? std::min(q1, t + kQueryBlock) : t + 1});
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  auto run = [&](int64_t i) {
    ThreadScratch& w = thread_scratch();
    const Item& it = items[i];
    if (it.t1 - it.t0 > 1 || p.q_indptr[it.b + 1] - p.q_indptr[it.b] >= kMinTiledTokens) {
      attend_tiled(p, it.b, it.t0, it.t1, it.kvh, w.tiled);
    } else {
      if (w.decode.size() < scratch_floats) w.decode.resize(scratch_floats);
      attend_group(p, it.b, it.t0, it.kvh, w.decode.data());
    }
  };
  if (!(macs >= kMinParallelMacs && n_items > 1)) {  // (no OpenMP region at all: cheaper)
    for (int64_t i = 0; i < n_items; ++i) run(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n_items; ++i) run(i);
}

}  // namespace kvb::kernels
