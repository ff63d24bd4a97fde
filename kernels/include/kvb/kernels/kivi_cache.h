#pragma once
// A paged KIVI store: keys quantized per channel, values per token, both asymmetric b-bit groups
// with fp16 scale and min exactly as quantize.h defines them, plus a full-precision residual ring.
// Decode attention over it dequantizes inside the kernel; quantize-and-append writes into it.
// Torch-free, CUDA-free (the CUDA launchers in kernels/cuda/kvb_cuda.cuh take these structs).
//
// Pages hold page_size tokens; page_size is KIVI's key group G. For each (page, kv head):
//   keys    the quantize.h matrix [page_size, head_dim] (rows = tokens), QuantAxis::kColumn with
//           group_size = page_size: page_size*head_dim*k_bits/8 code bytes in quantize.h's bit
//           stream (row-major, little-endian) and one (scale, min) per channel. Written once, when
//           all of the page's keys are due.
//   values  the quantize.h matrix [page_size, head_dim], QuantAxis::kRow with group_size =
//           v_group_size: row r owns code bytes [r*head_dim*v_bits/8, (r+1)*head_dim*v_bits/8) and
//           head_dim/v_group_size (scale, min) pairs; rows are written one at a time.
// So a (page, head) key block is byte for byte what group_quantize_ref writes for
// {k_bits, page_size, head_dim, page_size, kColumn} on those keys, and a value row what it writes
// for {v_bits, 1, head_dim, v_group_size, kRow}.
//
// Pools (page ids come from the same CSR page table as decode_attention.h):
//   k_codes   [num_pages, num_kv_heads, page_size * head_dim * k_bits / 8]  uint8
//   k_scales  [num_pages, num_kv_heads, head_dim]                           fp16 bits (k_mins
//   alike) v_codes   [num_pages, num_kv_heads, page_size * head_dim * v_bits / 8]  uint8 v_scales
//   [num_pages, num_kv_heads, page_size, head_dim / v_group_size] fp16 bits (v_mins alike)
//   k_residual, v_residual  [batch_size, residual_capacity, num_kv_heads, head_dim], dtype (fp16 or
//             bf16): token j of sequence b sits in row b, slot j % residual_capacity (a ring).
//
// Which tokens are quantized, for n tokens, R = residual_length (a multiple of page_size) and
// U = residual_capacity = (R > 0 ? R : page_size); the same policy as QuantCodec::kivi
// (methods/common/kv_codec.h) with one stream per head:
//   keys    the first k_quant_len = floor(n / U) * U tokens: the residual collects U keys, then all
//           U are quantized as U / page_size pages (a chunked residual of 0..U-1 keys)
//   values  the first v_quant_len = max(0, n - R) tokens: the newest R values stay full precision
//           (a sliding window; R = 0: quantized on arrival)
// Every other token is in the residual ring. Pages must exist for ceil(max(k_quant_len,
// v_quant_len) / page_size) logical pages (more are allowed: an allocator may hand out a page
// early).
//
// Quantized values are encoded from the residual's stored (dtype-rounded) rows, as the codec does.

#include <cstdint>
#include <string>

#include "kvb/kernels/decode_attention.h"

namespace kvb::kernels {

struct KiviLayout {
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;         // 64 or 128 on CUDA; any multiple of 8 on the CPU
  int32_t page_size = 32;       // tokens per page = key group G
  int32_t k_bits = 2;           // 2, 4 or 8
  int32_t v_bits = 2;           // 2, 4 or 8
  int32_t v_group_size = 32;    // channels per value group; a power of two dividing head_dim
  int32_t residual_length = 0;  // R: a multiple of page_size, >= 0
};

std::string kivi_layout_check(const KiviLayout& l);
int64_t kivi_k_page_bytes(const KiviLayout& l);       // page_size * head_dim * k_bits / 8
int64_t kivi_v_page_bytes(const KiviLayout& l);       // page_size * head_dim * v_bits / 8
int64_t kivi_v_groups_per_row(const KiviLayout& l);   // head_dim / v_group_size
int64_t kivi_residual_capacity(const KiviLayout& l);  // U
// k_quant_len / v_quant_len of a sequence of n tokens (see the top of this file).
int64_t kivi_k_quant_len(const KiviLayout& l, int64_t n);
int64_t kivi_v_quant_len(const KiviLayout& l, int64_t n);
int64_t kivi_pages_needed(const KiviLayout& l, int64_t n);  // ceil(max(kq, vq) / page_size)
// Bytes a decode over n tokens of one kv head reads from the store: key and value codes and
// metadata of the quantized part plus residual rows (page tables and q/o not included).
int64_t kivi_decode_kv_bytes(const KiviLayout& l, KvDtype dtype, int64_t n);

struct KiviDecodeParams {
  KvDtype dtype = KvDtype::kF16;  // of q, o and the residual rings: kF16 or kBF16
  KiviLayout layout;
  const void* q = nullptr;             // [batch_size, num_qo_heads, head_dim], dtype
  void* o = nullptr;                   // [batch_size, num_qo_heads, head_dim], dtype
  const uint8_t* k_codes = nullptr;    // [num_pages, num_kv_heads, kivi_k_page_bytes]
  const uint16_t* k_scales = nullptr;  // [num_pages, num_kv_heads, head_dim] fp16 bits
  const uint16_t* k_mins = nullptr;    // [num_pages, num_kv_heads, head_dim] fp16 bits
  const uint8_t* v_codes = nullptr;    // [num_pages, num_kv_heads, kivi_v_page_bytes]
  const uint16_t* v_scales =
      nullptr;  // [num_pages, num_kv_heads, page_size, head_dim / v_group_size]
  const uint16_t* v_mins = nullptr;  // same as v_scales
  const void* k_residual =
      nullptr;  // [batch_size, residual_capacity, num_kv_heads, head_dim], dtype
  const void* v_residual =
      nullptr;  // [batch_size, residual_capacity, num_kv_heads, head_dim], dtype
  const int32_t* page_indptr = nullptr;   // [batch_size + 1]
  const int32_t* page_indices = nullptr;  // [page_indptr[batch_size]]
  const int32_t* kv_lens = nullptr;  // [batch_size], tokens in the store (current one included)
  int32_t batch_size = 0;
  int32_t num_qo_heads = 0;  // a multiple of layout.num_kv_heads
  int32_t max_kv_len = 0;    // host bound on kv_lens for split-K planning (0: no split)
  float sm_scale = 1.0f;
};

// Empty string when consistent, else the reason. Reads the host-side arrays (page_indptr, kv_lens).
std::string kivi_decode_check(const KiviDecodeParams& p);
// Scalar oracle: dequantizes every (page, head) block with group_dequantize_ref, then fp64
// attention.
void kivi_decode_ref(const KiviDecodeParams& p);
// Optimised CPU version: fp32, online softmax, dequantization inside the loop (keys: the
// per-channel scale folded into q once per page), OpenMP over (sequence, kv head).
void kivi_decode_cpu(const KiviDecodeParams& p);

// Appends new tokens to the store in order: each token goes into the residual rings; values leaving
// the window and key chunks that fill the residual are quantized into their pages.
struct KiviAppendParams {
  KvDtype dtype = KvDtype::kF16;  // of k_new, v_new and the residual rings: kF16 or kBF16
  KiviLayout layout;
  const void* k_new = nullptr;          // [num_new_tokens, num_kv_heads, head_dim], dtype
  const void* v_new = nullptr;          // [num_new_tokens, num_kv_heads, head_dim], dtype
  const int32_t* new_indptr = nullptr;  // [batch_size + 1], sequence b's new tokens are rows
                                        // [new_indptr[b], new_indptr[b+1]) of k_new / v_new
  const int32_t* kv_lens = nullptr;     // [batch_size], tokens in the store BEFORE the append
  uint8_t* k_codes = nullptr;           // pools and rings as in KiviDecodeParams, written
  uint16_t* k_scales = nullptr;
  uint16_t* k_mins = nullptr;
  uint8_t* v_codes = nullptr;
  uint16_t* v_scales = nullptr;
  uint16_t* v_mins = nullptr;
  void* k_residual = nullptr;
  void* v_residual = nullptr;
  const int32_t* page_indptr = nullptr;   // [batch_size + 1], covering the store AFTER the append
  const int32_t* page_indices = nullptr;  // [page_indptr[batch_size]]
  int32_t batch_size = 0;
};

std::string kivi_append_check(const KiviAppendParams& p);  // reads host-side arrays
// Oracle: token by token, group_quantize_ref on each value row and each key page.
void kivi_append_ref(const KiviAppendParams& p);
// Optimised CPU version: bit-identical to the oracle; OpenMP over (sequence, kv head).
void kivi_append_cpu(const KiviAppendParams& p);

}  // namespace kvb::kernels
