// vattention: contiguous virtual memory for the KV cache with physical pages committed on demand
// (Prabhu et al., ASPLOS'25). The store is vattention_kv_cache.h; this file is its parameters and
// registration.

#include <string>

#include "harness/kv/method_registry.h"
#include "kernels/torch/virtual_arena_torch.h"
#include "methods/common/method_listing.h"
#include "methods/vattention/vattention_kv_cache.h"

namespace kvb {
namespace {

const EnumName<kernels::HugePages> kHugePages[] = {{kernels::HugePages::kAuto, "auto"},
                                                   {kernels::HugePages::kOff, "off"}};

MethodInfo vattention_info() {
  MethodInfo m = method_listing(
      "vattention",
      "contiguous virtual KV per sequence slot (reserved up front), physical pages committed as "
      "tokens arrive; dense kernels read it with no block table; the ledger is what the OS reports "
      "resident",
      "Prabhu et al., vAttention: Dynamic Memory Management for Serving LLMs without "
      "PagedAttention, ASPLOS 2025 (arXiv 2405.04437)",
      {int_param("page_kib", 64, 4, 1 << 20,
                 "physical page in KiB (a power of two, a multiple of the OS page; 4, 64 or 2048 "
                 "as in the paper; CUDA maps 2048 KiB and up)"),
       int_param("max_batch", 16, 1, 4096, "sequence slots reserved per layer"),
       int_param("max_context", 0, 0, 1 << 24,
                 "tokens reserved per slot; 0: the model's max_position_embeddings"),
       enum_param("hugepages", kHugePages, kernels::HugePages::kAuto,
                  "host: pages of 2 MiB and up asked of the OS as transparent huge pages (auto) "
                  "or never (off); the counters say what the OS gave"),
       string_param("reclaim", "eager", {"eager", "deferred"},
                    "eager: a released sequence's pages go back to the OS at once; deferred: they "
                    "stay with its slot for the next sequence (counted as reserved)"),
       bool_param("decode_kernel", true,
                  "decode steps through the decode kernel, one contiguous slot per sequence "
                  "(false: attend_dense over the slot's rows, an A/B switch)")});
  m.target_check = [](const nlohmann::json& p, const RunTarget& t) -> std::string {
    const int64_t kib = p.at("page_kib");
    if ((kib & (kib - 1)) != 0)
      return "page_kib=" + std::to_string(kib) + ": must be a power of two";
    std::string error;
    const size_t min_page = kernels::virtual_arena_min_page_bytes(t.device, &error);
    if (min_page == 0) return "vattention on " + t.device.str() + ": " + error;
    if (static_cast<size_t>(kib) * 1024 % min_page != 0)
      return "page_kib=" + std::to_string(kib) + ": " + t.device.str() +
             " maps physical memory in multiples of " + std::to_string(min_page / 1024) + " KiB" +
             (t.device.is_cuda() ? " (smaller pages need vAttention's patched driver)" : "");
    return "";
  };
  return m;
}

std::unique_ptr<KvCache> make_vattention(const CacheContext& ctx, const nlohmann::json& p) {
  VAttentionKvCache::Options o;
  o.page_bytes = static_cast<size_t>(p.at("page_kib").get<int64_t>()) * 1024;
  o.max_batch = p.at("max_batch");
  o.max_context = p.at("max_context");
  o.huge_pages = param_enum(p, "hugepages", kHugePages);
  o.deferred_reclaim = p.at("reclaim") == "deferred";
  o.decode_kernel = p.at("decode_kernel");
  return std::make_unique<VAttentionKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(vattention, kvb::vattention_info, kvb::make_vattention);
