#pragma once
// The engine's own KV store: vLLM-style fixed-size blocks in one pool per layer, block tables
// shared by all layers, reference-counted blocks so that fork() shares a prefix and copies a block
// only when a branch writes into it (copy-on-write). Attention: CPU fp32 through the CPU
// paged-attention kernel; decode steps in fp16/bf16 (CPU or CUDA) through the decode-attention
// kernels (kernels/torch/paged_decode_torch.h) unless `decode_kernel` is off; everything else
// (prefill on other dtypes or devices) through LibTorch over the gathered rows.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <unordered_map>
#include <vector>

#include "harness/formats/model_config.h"
#include "harness/kv/kv_cache.h"
#include "harness/kv/probe_view.h"
#include "kernels/torch/paged_decode_torch.h"

namespace kvb {

class PagedKvCache : public KvCache, public ProbedCache {
 public:
  struct Options {
    int64_t block_size = 16;
    int64_t initial_blocks = 64;
    bool decode_kernel = true;  // decode steps through the decode-attention kernel when supported
    // which CUDA decode kernel (kernels/torch/paged_decode_torch.h)
    kernels::PagedCudaKernel cuda_kernel = kernels::PagedCudaKernel::kCudaCores;
  };
  PagedKvCache(const ModelConfig& config, c10::Device device, c10::ScalarType dtype, Options opts);

  std::string name() const override { return "paged"; }
  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void end_step(const StepBatch& batch) override;
  void release(int64_t seq_id) override;
  void fork(int64_t src_id, int64_t dst_id) override;
  void truncate(int64_t seq_id, int64_t new_len) override;
  int64_t seq_len(int64_t seq_id) const override;
  Footprint footprint() const override;
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override;

  int64_t block_size() const { return block_size_; }
  int64_t blocks_in_use() const;
  int64_t capacity_blocks() const { return capacity_; }
  const std::vector<int32_t>& block_table(int64_t seq_id) const;
  // Whether the latest step ran through the decode-attention kernel (tests, A/B runs).
  bool last_step_used_decode_kernel() const { return step_kernel_decode_; }

  // Gathers a sequence's keys or values for one layer: [len, num_kv_heads, head_dim] (tests,
  // probes). Between begin_step and end_step the step's tokens are included once attend has written
  // them (len + the step's new tokens), so a probe sees what the step's queries attended.
  at::Tensor gather(int layer, int64_t seq_id, bool keys) const;

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    int64_t len = 0;
    int64_t in_flight = 0;  // the running step's new tokens (written by attend), 0 outside a step
  };
  int32_t alloc_block();
  void unref_block(int32_t b);
  void grow(int64_t min_capacity);
  void copy_block(int32_t src, int32_t dst);
  Seq& seq(int64_t id);
  const Seq& seq(int64_t id) const;
  at::Tensor attend_torch(const LayerInput& in);
  at::Tensor attend_cpu_kernel(const LayerInput& in);

  ModelConfig config_;
  c10::Device device_;
  c10::ScalarType dtype_;
  int64_t block_size_;
  bool decode_kernel_;
  kernels::PagedCudaKernel opts_cuda_kernel_;
  int64_t capacity_ = 0;
  std::vector<at::Tensor> k_pool_;  // per layer: [capacity, block_size, num_kv_heads, head_dim]
  std::vector<at::Tensor> v_pool_;
  std::vector<int32_t> refcount_;  // [capacity]
  std::vector<int32_t> free_;      // free block ids (LIFO)
  std::unordered_map<int64_t, Seq> seqs_;

  // Per-step state built by begin_step and used by every layer.
  at::Tensor step_slots_;                  // [T] int64 flat slot of each new token, device
  std::vector<int64_t> step_slots_host_;   // the same, host (CPU fp32 path: no tensor ops)
  std::vector<at::Tensor> step_gather_;    // per batch entry: [len_after] int64 slots, device
  std::vector<int32_t> step_page_indptr_;  // [batch + 1] (CPU kernel)
  std::vector<int32_t> step_page_indices_;
  bool step_kernel_decode_ = false;         // this step runs through the decode kernel
  kernels::PagedDecodeTables step_decode_;  // its tables (host + device copy)
};

}  // namespace kvb
