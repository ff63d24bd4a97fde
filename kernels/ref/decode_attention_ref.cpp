// decode_attention.h: parameter checks, shape helpers and the scalar oracles (fp64 accumulation,
// two-pass softmax) for dense and gathered decode attention and for the merge of partial states.

#include <cmath>
#include <vector>

#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/detail/dtype_io.h"

namespace kvb::kernels {

int64_t kv_dtype_bytes(KvDtype d) { return d == KvDtype::kF32 ? 4 : 2; }

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::kF16:
      return "fp16";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kF32:
      return "fp32";
  }
  return "?";
}

int64_t decode_scan_len(const DecodeAttentionParams& p, int b) {
  switch (p.gather) {
    case GatherMode::kNone:
      return p.kv_lens[b];
    case GatherMode::kTokens:
      return p.gather_indptr[b + 1] - p.gather_indptr[b];
    case GatherMode::kPages:
      return static_cast<int64_t>(p.gather_indptr[b + 1] - p.gather_indptr[b]) * p.page_size;
  }
  return 0;
}

std::string decode_attention_check(const DecodeAttentionParams& p) {
  if (p.dtype != KvDtype::kF16 && p.dtype != KvDtype::kBF16)
    return std::string("dtype ") + kv_dtype_name(p.dtype) + " not supported (fp16 or bf16)";
  if (!p.q || !p.o || !p.k_pages || !p.v_pages || !p.page_indptr || !p.page_indices || !p.kv_lens)
    return "null pointer";
  if (p.batch_size < 0 || p.num_qo_heads <= 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 ||
      p.page_size <= 0)
    return "non-positive size";
  if (p.num_qo_heads % p.num_kv_heads != 0) return "num_qo_heads not a multiple of num_kv_heads";
  if (p.gather != GatherMode::kNone && p.gather != GatherMode::kTokens &&
      p.gather != GatherMode::kPages)
    return "unknown gather mode";
  if (p.gather != GatherMode::kNone && (!p.gather_indptr || !p.gather_indices))
    return "gather mode without gather_indptr / gather_indices";
  if (p.page_indptr[0] != 0) return "page_indptr[0] != 0";
  if (p.gather != GatherMode::kNone && p.gather_indptr[0] != 0) return "gather_indptr[0] != 0";
  for (int b = 0; b < p.batch_size; ++b) {
    const std::string seq = " (sequence " + std::to_string(b) + ")";
    const int64_t len = p.kv_lens[b];
    const int64_t pages = p.page_indptr[b + 1] - p.page_indptr[b];
    if (len < 0) return "negative kv_len" + seq;
    if (pages < 0) return "page_indptr not ascending" + seq;
    if (pages * p.page_size < len) return "too few pages" + seq;
    if (p.gather != GatherMode::kNone) {
      const int64_t n = p.gather_indptr[b + 1] - p.gather_indptr[b];
      if (n < 0) return "gather_indptr not ascending" + seq;
      const int64_t limit =
          p.gather == GatherMode::kTokens ? len : (len + p.page_size - 1) / p.page_size;
      for (int64_t i = p.gather_indptr[b]; i < p.gather_indptr[b + 1]; ++i)
        if (p.gather_indices[i] < 0 || p.gather_indices[i] >= limit)
          return "gather index " + std::to_string(p.gather_indices[i]) + " outside [0, " +
                 std::to_string(limit) + ")" + seq;
    }
    if (p.max_scan_len > 0 && decode_scan_len(p, b) > p.max_scan_len)
      return "max_scan_len " + std::to_string(p.max_scan_len) + " below the scan length " +
             std::to_string(decode_scan_len(p, b)) + seq;
  }
  return "";
}

namespace {

// The cache positions sequence b attends, in scan order.
std::vector<int64_t> attended_positions(const DecodeAttentionParams& p, int b) {
  std::vector<int64_t> pos;
  const int64_t len = p.kv_lens[b];
  switch (p.gather) {
    case GatherMode::kNone:
      for (int64_t j = 0; j < len; ++j) pos.push_back(j);
      break;
    case GatherMode::kTokens:
      for (int64_t i = p.gather_indptr[b]; i < p.gather_indptr[b + 1]; ++i)
        pos.push_back(p.gather_indices[i]);
      break;
    case GatherMode::kPages:
      for (int64_t i = p.gather_indptr[b]; i < p.gather_indptr[b + 1]; ++i)
        for (int64_t s = 0; s < p.page_size; ++s) {
          const int64_t j = static_cast<int64_t>(p.gather_indices[i]) * p.page_size + s;
          if (j < len) pos.push_back(j);
        }
      break;
  }
  return pos;
}

}  // namespace

void decode_attention_ref(const DecodeAttentionParams& p) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t hd = p.head_dim;
  const int64_t tok_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t page_stride = p.page_size * tok_stride;
  for (int b = 0; b < p.batch_size; ++b) {
    const int32_t* pages = p.page_indices + p.page_indptr[b];
    const std::vector<int64_t> pos = attended_positions(p, b);
    for (int h = 0; h < p.num_qo_heads; ++h) {
      const int kvh = h / group;
      const int64_t qo_off = (static_cast<int64_t>(b) * p.num_qo_heads + h) * hd;
      if (pos.empty()) {
        for (int64_t d = 0; d < hd; ++d) detail::store_elem(p.o, p.dtype, qo_off + d, 0.f);
        continue;
      }
      auto row = [&](int64_t j) {
        return pages[j / p.page_size] * page_stride + (j % p.page_size) * tok_stride + kvh * hd;
      };
      std::vector<double> s(pos.size());
      double mx = -INFINITY;
      for (size_t i = 0; i < pos.size(); ++i) {
        const int64_t r = row(pos[i]);
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d)
          dot += static_cast<double>(detail::load_elem(p.q, p.dtype, qo_off + d)) *
                 detail::load_elem(p.k_pages, p.dtype, r + d);
        s[i] = dot * p.sm_scale;
        mx = std::max(mx, s[i]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t i = 0; i < pos.size(); ++i)
          acc += s[i] * detail::load_elem(p.v_pages, p.dtype, row(pos[i]) + d);
        detail::store_elem(p.o, p.dtype, qo_off + d, static_cast<float>(acc / sum));
      }
    }
  }
}

std::string attention_merge_check(const AttentionMergeParams& p) {
  if (!p.partial_o || !p.partial_m || !p.partial_l || !p.o) return "null pointer";
  if (p.num_rows < 0 || p.num_partials <= 0 || p.head_dim <= 0) return "non-positive size";
  return "";
}

void attention_merge_ref(const AttentionMergeParams& p) {
  const int64_t S = p.num_partials, D = p.head_dim;
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* m = p.partial_m + r * S;
    const float* l = p.partial_l + r * S;
    double M = -INFINITY;
    for (int64_t s = 0; s < S; ++s)
      if (l[s] > 0) M = std::max<double>(M, m[s]);
    std::vector<double> w(S, 0.0);
    double W = 0;
    if (M > -INFINITY)
      for (int64_t s = 0; s < S; ++s)
        if (l[s] > 0) W += (w[s] = l[s] * std::exp(static_cast<double>(m[s]) - M));
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t s = 0; s < S; ++s)
        if (w[s] > 0) acc += w[s] * p.partial_o[(r * S + s) * D + d];
      detail::store_elem(p.o, p.o_dtype, r * D + d, W > 0 ? static_cast<float>(acc / W) : 0.f);
    }
    if (p.lse) p.lse[r] = W > 0 ? static_cast<float>(M + std::log(W)) : -INFINITY;
  }
}

}  // namespace kvb::kernels
