// kivi_cache.h: the store's shape helpers and checks, and the oracles for decode attention over it
// (dequantize with group_dequantize_ref, then fp64 attention) and for quantize-and-append (token by
// token, group_quantize_ref on each value row and key page).

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/kivi_detail.h"
#include "kvb/kernels/kivi_cache.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels {

namespace {
bool kivi_bits_ok(int32_t b) { return b == 2 || b == 4 || b == 8; }
}  // namespace

std::string kivi_layout_check(const KiviLayout& l) {
  if (l.num_kv_heads <= 0 || l.head_dim <= 0 || l.page_size <= 0) return "non-positive size";
  if (l.head_dim % 8 != 0) return "head_dim " + std::to_string(l.head_dim) + " not a multiple of 8";
  if (!kivi_bits_ok(l.k_bits) || !kivi_bits_ok(l.v_bits))
    return "bits " + std::to_string(l.k_bits) + "/" + std::to_string(l.v_bits) +
           " not supported by the KIVI store (2, 4 or 8)";
  if (l.v_group_size <= 0 || (l.v_group_size & (l.v_group_size - 1)) != 0 ||
      l.head_dim % l.v_group_size != 0)
    return "v_group_size " + std::to_string(l.v_group_size) +
           " must be a power of two dividing head_dim " + std::to_string(l.head_dim);
  if (l.residual_length < 0 || l.residual_length % l.page_size != 0)
    return "residual_length " + std::to_string(l.residual_length) +
           " must be a non-negative multiple of page_size " + std::to_string(l.page_size);
  return "";
}

int64_t kivi_k_page_bytes(const KiviLayout& l) {
  return static_cast<int64_t>(l.page_size) * l.head_dim * l.k_bits / 8;
}
int64_t kivi_v_page_bytes(const KiviLayout& l) {
  return static_cast<int64_t>(l.page_size) * l.head_dim * l.v_bits / 8;
}
int64_t kivi_v_groups_per_row(const KiviLayout& l) { return l.head_dim / l.v_group_size; }
int64_t kivi_residual_capacity(const KiviLayout& l) {
  return l.residual_length > 0 ? l.residual_length : l.page_size;
}
int64_t kivi_k_quant_len(const KiviLayout& l, int64_t n) {
  const int64_t U = kivi_residual_capacity(l);
  return n / U * U;
}
int64_t kivi_v_quant_len(const KiviLayout& l, int64_t n) {
  return std::max<int64_t>(0, n - l.residual_length);
}
int64_t kivi_pages_needed(const KiviLayout& l, int64_t n) {
  const int64_t q = std::max(kivi_k_quant_len(l, n), kivi_v_quant_len(l, n));
  return (q + l.page_size - 1) / l.page_size;
}

int64_t kivi_decode_kv_bytes(const KiviLayout& l, KvDtype dtype, int64_t n) {
  const int64_t kq = kivi_k_quant_len(l, n), vq = kivi_v_quant_len(l, n);
  const int64_t hd = l.head_dim;
  const int64_t k_bytes = kq * hd * l.k_bits / 8 + (kq / l.page_size) * hd * 4;
  const int64_t v_bytes = vq * hd * l.v_bits / 8 + vq * kivi_v_groups_per_row(l) * 4;
  const int64_t res = ((n - kq) + (n - vq)) * hd * kv_dtype_bytes(dtype);
  return k_bytes + v_bytes + res;
}

std::string kivi_decode_check(const KiviDecodeParams& p) {
  if (auto e = kivi_layout_check(p.layout); !e.empty()) return e;
  if (p.dtype != KvDtype::kF16 && p.dtype != KvDtype::kBF16)
    return std::string("dtype ") + kv_dtype_name(p.dtype) + " not supported (fp16 or bf16)";
  if (!p.q || !p.o || !p.k_codes || !p.k_scales || !p.k_mins || !p.v_codes || !p.v_scales ||
      !p.v_mins || !p.k_residual || !p.v_residual || !p.page_indptr || !p.page_indices ||
      !p.kv_lens)
    return "null pointer";
  if (p.batch_size < 0 || p.num_qo_heads <= 0) return "non-positive size";
  if (p.num_qo_heads % p.layout.num_kv_heads != 0)
    return "num_qo_heads not a multiple of num_kv_heads";
  if (p.page_indptr[0] != 0) return "page_indptr[0] != 0";
  for (int b = 0; b < p.batch_size; ++b) {
    const std::string seq = " (sequence " + std::to_string(b) + ")";
    if (p.kv_lens[b] < 0) return "negative kv_len" + seq;
    if (p.page_indptr[b + 1] - p.page_indptr[b] < kivi_pages_needed(p.layout, p.kv_lens[b]))
      return "too few pages" + seq;
    if (p.max_kv_len > 0 && p.kv_lens[b] > p.max_kv_len) return "kv_len above max_kv_len" + seq;
  }
  return "";
}

namespace {

// Dequantized K or V rows [n, head_dim] of one (sequence, kv head) of a KIVI store, via the
// oracles.
struct KiviView {
  const KiviLayout& L;
  KvDtype dtype;
  const uint8_t *k_codes, *v_codes;
  const uint16_t *k_scales, *k_mins, *v_scales, *v_mins;
  const void *k_res, *v_res;
  const int32_t* pages;  // the sequence's page list
  int b;

  int64_t block(int64_t logical_page, int kvh) const {
    return static_cast<int64_t>(pages[logical_page]) * L.num_kv_heads + kvh;
  }
  // Keys of tokens [0, n) into out [n, hd].
  void keys(int kvh, int64_t n, float* out) const {
    const int64_t hd = L.head_dim, ps = L.page_size, kq = kivi_k_quant_len(L, n);
    const int64_t U = kivi_residual_capacity(L);
    for (int64_t pg = 0; pg < kq / ps; ++pg) {
      GroupDequantizeParams d;
      d.shape = {L.k_bits, ps, hd, ps, QuantAxis::kColumn};
      d.codes = k_codes + block(pg, kvh) * kivi_k_page_bytes(L);
      d.scales = k_scales + block(pg, kvh) * hd;
      d.mins = k_mins + block(pg, kvh) * hd;
      d.out = out + pg * ps * hd;
      group_dequantize_ref(d);
    }
    for (int64_t j = kq; j < n; ++j)
      detail::load_row(k_res, dtype, ((b * U + j % U) * L.num_kv_heads + kvh) * hd, hd,
                       out + j * hd);
  }
  void values(int kvh, int64_t n, float* out) const {
    const int64_t hd = L.head_dim, ps = L.page_size, vq = kivi_v_quant_len(L, n);
    const int64_t U = kivi_residual_capacity(L), G = kivi_v_groups_per_row(L);
    for (int64_t j = 0; j < vq; ++j) {
      GroupDequantizeParams d;
      d.shape = {L.v_bits, 1, hd, L.v_group_size, QuantAxis::kRow};
      const int64_t blk = block(j / ps, kvh);
      d.codes = v_codes + blk * kivi_v_page_bytes(L) + (j % ps) * hd * L.v_bits / 8;
      d.scales = v_scales + (blk * ps + j % ps) * G;
      d.mins = v_mins + (blk * ps + j % ps) * G;
      d.out = out + j * hd;
      group_dequantize_ref(d);
    }
    for (int64_t j = vq; j < n; ++j)
      detail::load_row(v_res, dtype, ((b * U + j % U) * L.num_kv_heads + kvh) * hd, hd,
                       out + j * hd);
  }
};

}  // namespace

void kivi_decode_ref(const KiviDecodeParams& p) {
  const KiviLayout& L = p.layout;
  const int group = p.num_qo_heads / L.num_kv_heads;
  const int64_t hd = L.head_dim;
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t n = p.kv_lens[b];
    KiviView view{L,
                  p.dtype,
                  p.k_codes,
                  p.v_codes,
                  p.k_scales,
                  p.k_mins,
                  p.v_scales,
                  p.v_mins,
                  p.k_residual,
                  p.v_residual,
                  p.page_indices + p.page_indptr[b],
                  b};
    std::vector<float> K(static_cast<size_t>(n * hd)), V(K.size());
    for (int kvh = 0; kvh < L.num_kv_heads; ++kvh) {
      view.keys(kvh, n, K.data());
      view.values(kvh, n, V.data());
      for (int g = 0; g < group; ++g) {
        const int64_t qo = (static_cast<int64_t>(b) * p.num_qo_heads + kvh * group + g) * hd;
        if (n == 0) {
          for (int64_t d = 0; d < hd; ++d) detail::store_elem(p.o, p.dtype, qo + d, 0.f);
          continue;
        }
        std::vector<double> s(static_cast<size_t>(n));
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d)
            dot += static_cast<double>(detail::load_elem(p.q, p.dtype, qo + d)) * K[j * hd + d];
          s[j] = dot * p.sm_scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += s[j] * V[j * hd + d];
          detail::store_elem(p.o, p.dtype, qo + d, static_cast<float>(acc / sum));
        }
      }
    }
  }
}

std::string kivi_append_check(const KiviAppendParams& p) {
  if (auto e = kivi_layout_check(p.layout); !e.empty()) return e;
  if (p.dtype != KvDtype::kF16 && p.dtype != KvDtype::kBF16)
    return std::string("dtype ") + kv_dtype_name(p.dtype) + " not supported (fp16 or bf16)";
  if (!p.k_new || !p.v_new || !p.new_indptr || !p.kv_lens || !p.k_codes || !p.k_scales ||
      !p.k_mins || !p.v_codes || !p.v_scales || !p.v_mins || !p.k_residual || !p.v_residual ||
      !p.page_indptr || !p.page_indices)
    return "null pointer";
  if (p.batch_size < 0) return "negative batch_size";
  if (p.page_indptr[0] != 0 || p.new_indptr[0] != 0) return "page_indptr[0] or new_indptr[0] != 0";
  for (int b = 0; b < p.batch_size; ++b) {
    const std::string seq = " (sequence " + std::to_string(b) + ")";
    const int64_t add = p.new_indptr[b + 1] - p.new_indptr[b];
    if (add < 0 || p.kv_lens[b] < 0) return "negative length" + seq;
    if (p.page_indptr[b + 1] - p.page_indptr[b] < kivi_pages_needed(p.layout, p.kv_lens[b] + add))
      return "too few pages for the appended length" + seq;
  }
  return "";
}

namespace kivi_detail {

// One (sequence, kv head) of an append, token by token; `quantize` is group_quantize_ref or _cpu.
void append_item(const KiviAppendParams& p, int b, int kvh,
                 void (*quantize)(const GroupQuantizeParams&)) {
  const KiviLayout& L = p.layout;
  const int64_t hd = L.head_dim, ps = L.page_size, R = L.residual_length;
  const int64_t U = kivi_residual_capacity(L), G = kivi_v_groups_per_row(L), H = L.num_kv_heads;
  const int32_t* pages = p.page_indices + p.page_indptr[b];
  auto blk = [&](int64_t j) { return static_cast<int64_t>(pages[j / ps]) * H + kvh; };
  auto ring = [&](int64_t j) { return ((b * U + j % U) * H + kvh) * hd; };
  std::vector<float> row(static_cast<size_t>(hd)), page(static_cast<size_t>(ps * hd));
  auto quantize_value = [&](int64_t j, const float* x) {
    GroupQuantizeParams q;
    q.shape = {L.v_bits, 1, hd, L.v_group_size, QuantAxis::kRow};
    q.x = x;
    q.codes = p.v_codes + blk(j) * kivi_v_page_bytes(L) + (j % ps) * hd * L.v_bits / 8;
    q.scales = p.v_scales + (blk(j) * ps + j % ps) * G;
    q.mins = p.v_mins + (blk(j) * ps + j % ps) * G;
    quantize(q);
  };
  for (int64_t t = p.new_indptr[b]; t < p.new_indptr[b + 1]; ++t) {
    const int64_t n = p.kv_lens[b] + (t - p.new_indptr[b]);  // the new token's position
    const int64_t src = (t * H + kvh) * hd;
    // Values: the row leaving the window is quantized before its ring slot is reused.
    detail::load_row(p.v_new, p.dtype, src, hd, row.data());
    if (R == 0) {
      quantize_value(n, row.data());
    } else {
      if (n >= R) {
        std::vector<float> old(static_cast<size_t>(hd));
        detail::load_row(p.v_residual, p.dtype, ring(n - R), hd, old.data());
        quantize_value(n - R, old.data());
      }
      detail::store_row(p.v_residual, p.dtype, ring(n), hd, row.data());
    }
    // Keys: into the ring; a full chunk of U keys becomes U / ps quantized pages.
    detail::load_row(p.k_new, p.dtype, src, hd, row.data());
    detail::store_row(p.k_residual, p.dtype, ring(n), hd, row.data());
    if ((n + 1) % U == 0) {
      for (int64_t j0 = n + 1 - U; j0 <= n; j0 += ps) {
        for (int64_t r = 0; r < ps; ++r)
          detail::load_row(p.k_residual, p.dtype, ring(j0 + r), hd, page.data() + r * hd);
        GroupQuantizeParams q;
        q.shape = {L.k_bits, ps, hd, ps, QuantAxis::kColumn};
        q.x = page.data();
        q.codes = p.k_codes + blk(j0) * kivi_k_page_bytes(L);
        q.scales = p.k_scales + blk(j0) * hd;
        q.mins = p.k_mins + blk(j0) * hd;
        quantize(q);
      }
    }
  }
}

}  // namespace kivi_detail

void kivi_append_ref(const KiviAppendParams& p) {
  for (int b = 0; b < p.batch_size; ++b)
    for (int kvh = 0; kvh < p.layout.num_kv_heads; ++kvh)
      kivi_detail::append_item(p, b, kvh, group_quantize_ref);
}

}  // namespace kvb::kernels
