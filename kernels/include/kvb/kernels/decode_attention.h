#pragma once
// Decode attention (one query token per sequence) over a paged fp16/bf16 KV cache, over a gathered
// subset of its tokens or pages, and the merge of partial softmax states. Torch-free and CUDA-free:
// raw pointers, explicit shapes; the CUDA launchers are in kernels/cuda/kvb_cuda.cuh and take these
// same structs, so the reference (ref/), CPU (cpu/) and CUDA versions are interchangeable in tests.
//
// Layouts (NHD, FlashInfer's vocabulary; the same pool layout as paged_attention.h):
//   k_pages, v_pages: [num_pages, page_size, num_kv_heads, head_dim]
//   page_indices[page_indptr[b] .. page_indptr[b+1]) are sequence b's pages, in order (CSR);
//   logical token j of sequence b sits in page page_indices[page_indptr[b] + j / page_size], slot
//   j % page_size. Only the first kv_lens[b] tokens exist: the last page may be partial.
//
// What is attended (GatherMode), per sequence b:
//   kNone    every token j in [0, kv_lens[b])                                      (dense decode)
//   kTokens  the tokens gather_indices[gather_indptr[b] .. gather_indptr[b+1]), each a position in
//            [0, kv_lens[b]), in any order, repeats allowed (SnapKV-style kept-token lists)
//   kPages   every existing token of the logical pages gather_indices[gather_indptr[b] ..
//            gather_indptr[b+1]), each in [0, ceil(kv_lens[b] / page_size)) (Quest: top pages);
//            a selected last page contributes only its kv_lens[b] % page_size live tokens
// A sequence with nothing to attend gets an all-zero output row.
//
// Softmax: scores s_j = sm_scale * q . k_j; out = sum_j softmax(s)_j v_j, with fp32 (CUDA, CPU) or
// fp64 (ref) accumulation; the output is rounded once to the I/O dtype.
//
// Partial softmax states (split-K over the KV length, streamed or estimated parts): a state over a
// token subset S is (m, l, o) with m = max_{j in S} s_j, l = sum_{j in S} exp(s_j - m) and
// o = sum_{j in S} exp(s_j - m) v_j / l. Merging states i: M = max_i m_i, w_i = l_i exp(m_i - M),
// out = sum_i w_i o_i / sum_i w_i, lse = M + log(sum_i w_i). An empty state is (-inf, 0, 0).

#include <cstdint>
#include <string>

namespace kvb::kernels {

// Element type of activations and full-precision cache rows.
enum class KvDtype : int32_t { kF16 = 0, kBF16 = 1, kF32 = 2 };
int64_t kv_dtype_bytes(KvDtype d);
const char* kv_dtype_name(KvDtype d);  // "fp16" | "bf16" | "fp32"

enum class GatherMode : int32_t { kNone = 0, kTokens = 1, kPages = 2 };

struct DecodeAttentionParams {
  KvDtype dtype = KvDtype::kF16;          // of q, o, k_pages, v_pages: kF16 or kBF16
  const void* q = nullptr;                // [batch_size, num_qo_heads, head_dim], dtype
  void* o = nullptr;                      // [batch_size, num_qo_heads, head_dim], dtype
  const void* k_pages = nullptr;          // [num_pages, page_size, num_kv_heads, head_dim], dtype
  const void* v_pages = nullptr;          // [num_pages, page_size, num_kv_heads, head_dim], dtype
  const int32_t* page_indptr = nullptr;   // [batch_size + 1]
  const int32_t* page_indices = nullptr;  // [page_indptr[batch_size]], page ids into the pools
  const int32_t* kv_lens = nullptr;  // [batch_size], tokens in the cache (current one included)
  GatherMode gather = GatherMode::kNone;
  const int32_t* gather_indptr = nullptr;   // [batch_size + 1] (kTokens, kPages), else unused
  const int32_t* gather_indices = nullptr;  // [gather_indptr[batch_size]]: token positions
                                            // (kTokens) or logical page numbers (kPages)
  int32_t batch_size = 0;
  int32_t num_qo_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  // Host-side upper bound of the positions scanned per sequence: kv_lens (kNone), the index count
  // (kTokens), index count * page_size (kPages). Only the CUDA planner reads it (split-K sizing);
  // 0 means "unknown": no split.
  int32_t max_scan_len = 0;
  float sm_scale = 1.0f;
};

// Empty string when the parameters are consistent, else the reason. Reads the host-side arrays
// (page_indptr, kv_lens, gather lists): call it on host copies.
std::string decode_attention_check(const DecodeAttentionParams& p);

// Positions scanned for sequence b (host arrays): kv_lens[b] / index count / index count *
// page_size.
int64_t decode_scan_len(const DecodeAttentionParams& p, int b);

// Scalar oracle: fp64 accumulation, two-pass softmax, host pointers.
void decode_attention_ref(const DecodeAttentionParams& p);
// Optimised CPU version: fp32, online softmax, one K/V read per (sequence, kv head) serving the
// whole query group; OpenMP over (sequence, kv head) when the work is large enough. Host pointers.
void decode_attention_cpu(const DecodeAttentionParams& p);

struct AttentionMergeParams {
  const float* partial_o = nullptr;  // [num_rows, num_partials, head_dim] fp32, each state's o
  const float* partial_m = nullptr;  // [num_rows, num_partials] fp32, max score (-inf: empty)
  const float* partial_l = nullptr;  // [num_rows, num_partials] fp32, sum of exp(s - m)
  void* o = nullptr;                 // [num_rows, head_dim], o_dtype
  KvDtype o_dtype = KvDtype::kF32;
  float* lse = nullptr;  // [num_rows] fp32 or null: log-sum-exp of the merged state
  int32_t num_rows = 0;
  int32_t num_partials = 0;
  int32_t head_dim = 0;
};

std::string attention_merge_check(const AttentionMergeParams& p);
void attention_merge_ref(const AttentionMergeParams& p);  // fp64
void attention_merge_cpu(const AttentionMergeParams& p);  // fp32

}  // namespace kvb::kernels
