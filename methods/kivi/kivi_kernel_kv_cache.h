#pragma once
// KIVI on its kernels: the paged KIVI layout of kvb/kernels/kivi_cache.h (per-channel key pages,
// per-token value rows, fp16 scale/min, an fp16/bf16 residual ring per sequence) held in tensors on
// the model's device, written by the quantize-and-append kernel and read by the decode-attention
// kernel that dequantizes inside its loop (kernels/torch/kivi_torch.h). CPU and CUDA.
//
// Same quantization policy as the codec store (codec_kv_cache.h with QuantCodec::kivi): keys
// quantized R at a time when the residual fills, values when they leave the window of R; fp16
// metadata rounded as quantize.h. What differs, and why:
//   - decode steps (one token per sequence) append first and then attend through the kernel, which
//     reads the current token from the store: at the step where the key residual fills (one step in
//     R) that token's key is attended quantized (KIVI's code, and the codec store, attend it at
//     full precision and quantize after). The kernel has no log-sum-exp output to merge a separate
//     current-token term with.
//   - q is cast to the residual's dtype (fp16 by default) for the kernel; the output back.
//   - steps with several tokens per sequence attend exactly (attend_dense): a fresh sequence over
//     its own tokens at the model's precision, a sequence with history over its dequantized store
//     (kivi_dequantize: tensor ops) followed by the new rows; the rows are appended afterwards.
//   - truncate() back across a quantization boundary restores those rows into the residual as
//     their dequantized values (their full precision is gone); the codec store keeps the codes
//     with a live mask.
//
// Memory, all physical: pages (codes + metadata) allocated per sequence as the quantized part
// grows (a page is counted whole once allocated; fork() shares pages, copied on write), one ring
// row [U, kv_heads, head_dim] per live sequence (live residual rows are payload, the rest of the
// ring reserved), page tables as index bytes, free pages and free ring rows reserved. Pools grow by
// doubling.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "harness/kv/probe_view.h"
#include "kernels/torch/kivi_torch.h"
#include "methods/common/seq_store.h"

namespace kvb {

// One sequence: its page table and residual ring row.
struct KiviKernelSeq {
  std::vector<int32_t> pages;
  int32_t ring_row = -1;
  int64_t len = 0;
};

class KiviKernelKvCache : public SeqStore<KiviKernelSeq>, public ProbedCache {
 public:
  // ring_dtype: fp16 or bf16. Throws (naming the reason) when the kernels cannot serve the layout
  // on ctx.device.
  // cuda_kernel: which CUDA decode kernel serves a CUDA device (kernels/torch/kivi_torch.h).
  KiviKernelKvCache(const CacheContext& ctx, const kernels::KiviLayout& layout,
                    c10::ScalarType ring_dtype, std::string name,
                    std::map<std::string, double> extra_counters = {},
                    kernels::KiviCudaKernel cuda_kernel = kernels::KiviCudaKernel::kCudaCores);

  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void release(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  std::map<std::string, double> counters() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;

  const kernels::KiviLayout& layout() const { return layout_; }
  // Whether the latest step's attention ran through the decode kernel (tests, A/B runs).
  bool last_step_used_decode_kernel() const { return step_decode_; }
  // One sequence's stored keys / values at `layer` as attention reads them: [len, kv_heads,
  // head_dim] fp32 (kivi_dequantize).
  std::pair<at::Tensor, at::Tensor> dequantized(int layer, int64_t seq_id) const;

 private:
  using Seq = KiviKernelSeq;
  Seq new_seq(int64_t seq_id) override;  // a ring row of its own
  int32_t alloc_page();
  void unref_page(int32_t id);
  // Copies the pages of `s` that appending tokens [before, after) writes into and that a fork
  // shares.
  void own_touched_pages(Seq& s, int64_t before, int64_t after);
  int32_t alloc_ring_row();
  void ensure_pages(Seq& s, int64_t n);
  void free_pages_beyond(Seq& s, int64_t n);
  // The step's rings [batch, U, H, D]: a view when the batch's ring rows are consecutive, else a
  // gathered copy (written back by put_rings).
  std::pair<at::Tensor, at::Tensor> step_rings(int layer);
  void put_rings(int layer, const at::Tensor& k, const at::Tensor& v);

  CacheContext ctx_;
  kernels::KiviLayout layout_;
  c10::ScalarType ring_dtype_;
  std::map<std::string, double> extra_counters_;
  kernels::KiviCudaKernel cuda_kernel_;
  int64_t U_;  // ring capacity

  std::vector<kernels::KiviPools> pools_;    // per layer
  std::vector<at::Tensor> k_ring_, v_ring_;  // per layer: [ring_capacity, U, H, D]
  int64_t page_capacity_ = 0, ring_capacity_ = 0;
  std::vector<int32_t> free_pages_, free_rings_;
  std::vector<int32_t> refcount_;  // [page_capacity_] sequences holding each page

  // Per step.
  kernels::KiviStepTables step_tables_;
  bool step_decode_ = false;
  std::vector<int64_t> step_ring_rows_;  // [batch] ring row of each sequence
  bool step_rings_consecutive_ = true;
  at::Tensor step_ring_index_;  // [batch] int64 ring rows, device (when not consecutive)
  int64_t decode_kernel_steps_ = 0, exact_steps_ = 0, dequantized_history_steps_ = 0;
  int64_t cow_copies_ = 0;
};

}  // namespace kvb
