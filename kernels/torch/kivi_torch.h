#pragma once
// LibTorch adapter of the KIVI store kernels (kvb/kernels/kivi_cache.h): quantize-and-append and
// decode attention over the paged KIVI layout, plus a tensor-op dequantizer of one sequence (for
// steps the decode kernel does not serve: chunked prefill over a history, probes, truncation).
// Picks the version for the tensors' device:
//   CPU   kivi_append_cpu / kivi_decode_cpu (fp16 / bf16 rings, any head_dim multiple of 8);
//   CUDA  kivi_append_cuda / kivi_decode_cuda (head_dim 64 or 128, equal key/value bits 2/4/8,
//         GQA groups 1..8), split-K planned per call, on the legacy default stream; only in a build
//         with the CUDA kernels (KVB_HAVE_CUDA).
//
// Shapes (one layer; kivi_cache.h has the byte layout):
//   pools   KiviPools: k_codes [pages, kv_heads, k_page_bytes] uint8, k_scales / k_mins
//           [pages, kv_heads, head_dim] int16 (fp16 bits), v_codes [pages, kv_heads, v_page_bytes]
//           uint8, v_scales / v_mins [pages, kv_heads, page_size, head_dim / v_group_size] int16
//   rings   k_ring, v_ring [batch, U, kv_heads, head_dim], fp16 or bf16: row b is the step's
//           sequence b (U = kivi_residual_capacity)
//   q       [batch, num_qo_heads, head_dim], the rings' dtype; one query token per sequence
//   k_new   [tokens, kv_heads, head_dim], the rings' dtype, sequences packed by tables.new_indptr

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvb/kernels/kivi_cache.h"

namespace kvb::kernels {

struct KiviPools {
  at::Tensor k_codes, k_scales, k_mins;
  at::Tensor v_codes, v_scales, v_mins;
};

// Zero-filled pools of `num_pages` pages on `device`.
KiviPools kivi_pools_empty(const KiviLayout& l, int64_t num_pages, const c10::Device& device);
// Bytes of one page over all kv heads: codes (k_codes + v_codes) and metadata (scales + mins).
int64_t kivi_page_code_bytes(const KiviLayout& l);
int64_t kivi_page_meta_bytes(const KiviLayout& l);

// The per-step tables of a batch. Host vectors always; `device` is them concatenated on the pools'
// device (page_indptr | page_indices | kv_lens_before | kv_lens_after | new_indptr, int32), made by
// upload(). Pages cover each sequence AFTER the step's tokens are appended.
struct KiviStepTables {
  std::vector<int32_t> page_indptr;     // [batch + 1]
  std::vector<int32_t> page_indices;    // [page_indptr[batch]]
  std::vector<int32_t> kv_lens_before;  // [batch]: tokens stored before the append
  std::vector<int32_t> kv_lens_after;   // [batch]: after it (what decode attends)
  std::vector<int32_t> new_indptr;      // [batch + 1]: rows of k_new / v_new per sequence
  at::Tensor device;                    // undefined until upload(); CPU needs none
  void upload(const c10::Device& dev);
};

// Which CUDA decode kernel serves a CUDA device (kvb_cuda.cuh's KiviDecodeKernel): CUDA cores,
// tensor cores for whole quantized pages (page_size and v_group_size multiples of 16), or tensor
// cores where the layout allows. The CPU has one kernel and ignores it.
enum class KiviCudaKernel { kCudaCores, kTensorCores, kAuto };

// Empty when the adapter can run this store configuration on `device`, else why not.
std::string kivi_kernel_supported(const c10::Device& device, c10::ScalarType ring_dtype,
                                  const KiviLayout& l, int64_t num_qo_heads,
                                  KiviCudaKernel cuda_kernel = KiviCudaKernel::kCudaCores);

// Appends k_new / v_new (the rings' dtype) into the rings and pools, quantizing what becomes due.
void kivi_append(const KiviLayout& l, KiviPools& pools, at::Tensor& k_ring, at::Tensor& v_ring,
                 const at::Tensor& k_new, const at::Tensor& v_new, const KiviStepTables& t);

// Decode attention of each sequence's one query over its kv_lens_after tokens. Returns
// [batch, num_qo_heads, head_dim] in q's dtype (the rings' dtype).
at::Tensor kivi_decode_attention(const at::Tensor& q, const KiviLayout& l, const KiviPools& pools,
                                 const at::Tensor& k_ring, const at::Tensor& v_ring,
                                 const KiviStepTables& t, float sm_scale,
                                 KiviCudaKernel cuda_kernel = KiviCudaKernel::kCudaCores);

// One sequence's first n tokens as attention reads them: dequantized keys / values of the
// quantized part (x^ = code * scale + min in fp32, as the kernels) followed by the residual rows.
// pages: the sequence's page ids in order; k_ring_row / v_ring_row: [U, kv_heads, head_dim].
// Returns (K, V), each [n, kv_heads, head_dim] fp32 on the pools' device. Tensor ops only, so it
// runs on any device.
std::pair<at::Tensor, at::Tensor> kivi_dequantize(const KiviLayout& l, const KiviPools& pools,
                                                  const at::Tensor& k_ring_row,
                                                  const at::Tensor& v_ring_row,
                                                  const std::vector<int32_t>& pages, int64_t n);

}  // namespace kvb::kernels
