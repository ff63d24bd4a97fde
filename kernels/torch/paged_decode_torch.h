#pragma once
// LibTorch adapter of the paged decode-attention kernels (kvb/kernels/decode_attention.h): the one
// place where those kernels meet tensors. Picks the version for the tensors' device:
//   CPU   decode_attention_cpu (fp16 / bf16 / fp32 I/O, fp32 accumulation);
//   CUDA  decode_attention_cuda (fp16 / bf16, head_dim 64 or 128, GQA groups 1..8), split-K planned
//         per call, on the legacy default stream (LibTorch's default current stream); only in a
//         build with the CUDA kernels (KVB_HAVE_CUDA), else refused by supported().
//
// Shapes (the paged KV cache's pools, NHD):
//   q               [batch, num_qo_heads, head_dim]       one query token per sequence
//   k_pool, v_pool  [num_pages, page_size, num_kv_heads, head_dim], q's dtype and device
//   tables          PagedDecodeTables: CSR page lists and lengths, host int32 (and their device
//   copy)
// Returns o [batch, num_qo_heads, head_dim] in q's dtype.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvb::kernels {

// The per-step page tables of a decode batch. Host vectors always; `device` is the same three
// arrays concatenated on the pools' device (indptr | indices | kv_lens, int32), made by upload().
struct PagedDecodeTables {
  std::vector<int32_t> page_indptr;   // [batch + 1]
  std::vector<int32_t> page_indices;  // [page_indptr[batch]]
  std::vector<int32_t> kv_lens;       // [batch], the current token included
  at::Tensor device;                  // undefined until upload(); CPU tensors need none
  void upload(const c10::Device& dev);
};

// Empty when the adapter can run this configuration, else why not.
std::string paged_decode_supported(const c10::Device& device, c10::ScalarType dtype,
                                   int64_t head_dim, int64_t num_qo_heads, int64_t num_kv_heads);

// Which CUDA kernel serves a CUDA device (kvb_cuda.cuh's DecodeKernel): CUDA cores, tensor cores,
// or tensor cores at GQA >= 4. The CPU has one kernel and ignores it.
enum class PagedCudaKernel { kCudaCores, kTensorCores, kAuto };

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                  const at::Tensor& v_pool, const PagedDecodeTables& tables,
                                  float sm_scale,
                                  PagedCudaKernel cuda_kernel = PagedCudaKernel::kCudaCores);

}  // namespace kvb::kernels
