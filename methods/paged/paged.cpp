// paged: vLLM-style fixed-size blocks with block tables and copy-on-write fork. The store itself is
// the engine's own (harness/kv/paged_kv_cache.h); this registers it as a method.

#include "harness/common/error.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/paged_kv_cache.h"
#include "methods/common/cuda_decode_param.h"
#include "methods/common/method_listing.h"

namespace kvb {
namespace {

MethodInfo paged_info() {
  MethodInfo m = method_listing(
      "paged", "vLLM-style paged KV: fixed-size blocks, block tables, copy-on-write fork",
      "Kwon et al., Efficient Memory Management for LLM Serving with PagedAttention, SOSP 2023",
      {int_param("block_size", 16, 1, 4096, "tokens per block"),
       int_param("initial_blocks", 64, 1, 1 << 24,
                 "blocks allocated up front (the pool doubles when full)"),
       bool_param("decode_kernel", true,
                  "decode steps in fp16/bf16 (CPU or CUDA) through kvbench's decode-attention "
                  "kernel (kernels/torch/paged_decode_torch.h) when it supports the shapes; "
                  "false: LibTorch over the gathered rows (an A/B switch)"),
       cuda_decode_param<kernels::PagedCudaKernel>(
           "the CUDA decode kernel: cuda_cores, tensor_cores (mma over the KV as "
           "stored), auto (tensor cores at GQA >= 4); CUDA only")});
  // The CUDA decode kernels are a CUDA choice.
  m.target_check = [](const nlohmann::json& p, const RunTarget& t) -> std::string {
    const std::string cuda_decode = p.at("cuda_decode");
    if (cuda_decode == "cuda_cores" || t.device.is_cuda()) return "";
    return "cuda_decode=" + cuda_decode + ": chooses the CUDA decode kernel; this run is on " +
           t.device.str() + " (leave cuda_decode at cuda_cores)";
  };
  return m;
}

std::unique_ptr<KvCache> make_paged(const CacheContext& ctx, const nlohmann::json& p) {
  PagedKvCache::Options o;
  o.block_size = p["block_size"].get<int64_t>();
  o.initial_blocks = p["initial_blocks"].get<int64_t>();
  o.decode_kernel = p["decode_kernel"].get<bool>();
  o.cuda_kernel = parse_cuda_decode<kernels::PagedCudaKernel>(p);
  return std::make_unique<PagedKvCache>(ctx.config, ctx.device, ctx.dtype, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(paged, kvb::paged_info, kvb::make_paged);
