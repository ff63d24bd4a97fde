#pragma once
// CUDA launchers of kvbench's attention and cache kernels. Torch-free; host code may include this
// header from a .cpp (it needs only the CUDA runtime API headers). The parameter structs are the
// torch-free ones of kvb/kernels/*.h, so the reference, CPU and CUDA versions share one
// description; here every pointer in them is a DEVICE pointer.
//
// Every launcher returns cudaError_t (cudaSuccess, cudaErrorInvalidValue for parameters that its
// *_supported() rejects, or the launch error) and never synchronizes. *_supported() looks only at
// scalar fields and pointer alignment (it never reads device memory); the full consistency checks
// (decode_attention_check, ...) read the index arrays and are meant for host copies in tests.
//
// Compiled variants (to keep nvcc time low): head_dim 64 or 128; fp16 or bf16; GQA group sizes 1..8
// (served by kernels for groups 1, 4 and 8: a group of 2 or 3 runs the 4-wide kernel with idle
// lanes); KIVI bits (2,2), (4,4) and (8,8) for (k_bits, v_bits).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvb/kernels/decode_attention.h"
#include "kvb/kernels/kivi_cache.h"
#include "kvb/kernels/kv_append.h"

namespace kvb::kernels::cuda {

// Split-K plan of a decode launch: the scanned positions of each sequence are cut into num_splits
// chunks of `chunk` positions; each (chunk, kv head, sequence) is one thread block that writes a
// partial softmax state to the workspace, and a merge kernel combines them. num_splits == 1 writes
// the output directly and needs no workspace.
struct DecodePlan {
  int32_t num_splits = 1;
  int32_t chunk = 0;           // positions per split (a multiple of page_size for KIVI)
  size_t workspace_bytes = 0;  // device bytes the launch needs in `workspace` (0 when no split)
};

// requested_splits: 0 = choose from the SM count (num_sms; 0 = ask the current device) so that
// batch * kv_heads * splits fills the chip about twice, with chunks of at least 256 positions;
// >= 1 = use that many (clamped to the positions available). Uses max_scan_len / max_kv_len: when
// that is 0 the plan is one split.
DecodePlan decode_attention_plan(const DecodeAttentionParams& p, int32_t requested_splits = 0,
                                 int num_sms = 0);
DecodePlan kivi_decode_plan(const KiviDecodeParams& p, int32_t requested_splits = 0,
                            int num_sms = 0);

// Dense or gathered decode attention over paged fp16/bf16 KV (decode_attention.h). Two kernels:
// kCudaCores and kTensorCores (decode_tc.cuh: the group's heads times K^T and V^T times the weights
// on tensor cores); kAuto takes tensor cores for GQA groups of 4 or more. Both agree with
// decode_attention_ref to fp32-level rounding.
enum class DecodeKernel { kCudaCores, kTensorCores, kAuto };
bool decode_attention_supported(const DecodeAttentionParams& p, std::string* why);
cudaError_t decode_attention_cuda(const DecodeAttentionParams& p, const DecodePlan& plan,
                                  void* workspace,  // [plan.workspace_bytes] device, or null
                                  cudaStream_t stream,
                                  DecodeKernel kernel = DecodeKernel::kCudaCores);

// Decode attention over the KIVI store (kivi_cache.h), dequantizing inside the kernel. Two
// kernels: kCudaCores (codes dequantized and multiplied on CUDA cores) and kTensorCores (whole
// quantized pages on tensor cores, raw codes times scale-folded operands; kivi_decode_tc.cuh),
// which also needs page_size and v_group_size multiples of 16. kAuto takes tensor cores where
// supported. Both agree with kivi_decode_ref to fp32 rounding.
enum class KiviDecodeKernel { kCudaCores, kTensorCores, kAuto };
bool kivi_decode_supported(const KiviDecodeParams& p, std::string* why);
bool kivi_decode_tc_supported(const KiviDecodeParams& p, std::string* why);
cudaError_t kivi_decode_cuda(const KiviDecodeParams& p, const DecodePlan& plan,
                             void* workspace,  // [plan.workspace_bytes] device, or null
                             cudaStream_t stream,
                             KiviDecodeKernel kernel = KiviDecodeKernel::kCudaCores);

// Merge of partial softmax states (decode_attention.h). o_dtype fp16, bf16 or fp32.
bool attention_merge_supported(const AttentionMergeParams& p, std::string* why);
cudaError_t attention_merge_cuda(const AttentionMergeParams& p, cudaStream_t stream);

// Quantize-and-append into the KIVI store (kivi_cache.h): one thread block per (kv head, sequence),
// tokens in order; made for decode steps (a few tokens per sequence). Bit-identical to the oracle.
bool kivi_append_supported(const KiviAppendParams& p, std::string* why);
cudaError_t kivi_append_cuda(const KiviAppendParams& p, cudaStream_t stream);

// Append into paged fp16/bf16/fp32 pools with conversion (kv_append.h); one block per new token.
// num_new_tokens: new_indptr[batch_size], known to the host.
bool paged_append_supported(const PagedAppendParams& p, std::string* why);
cudaError_t paged_append_cuda(const PagedAppendParams& p, int32_t num_new_tokens,
                              cudaStream_t stream);

// Number of SMs of the current device (cached per device); 0 when there is no device.
int device_sm_count();

}  // namespace kvb::kernels::cuda
