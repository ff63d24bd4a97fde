// static: Era-1 serving — each sequence reserves max_seq_len tokens of contiguous KV up front. Kept
// to show its waste: the ledger reports the reserved-but-unused bytes.

#include "harness/kv/method_registry.h"
#include "methods/common/contiguous_kv_cache.h"
#include "methods/common/method_listing.h"

namespace kvb {
namespace {

MethodInfo static_info() {
  return method_listing(
      "static",
      "contiguous reservation of max_seq_len tokens per sequence (pre-PagedAttention serving)",
      "Kwon et al., Efficient Memory Management for LLM Serving with PagedAttention, SOSP 2023 "
      "(the baseline it measures)",
      {int_param("max_seq_len", 0, 0, 1 << 24,
                 "tokens reserved per sequence; 0: the model's max_position_embeddings")});
}

std::unique_ptr<KvCache> make_static(const CacheContext& ctx, const nlohmann::json& p) {
  int64_t reserve = p["max_seq_len"].get<int64_t>();
  if (reserve == 0) reserve = ctx.config.max_seq_len;
  return std::make_unique<ContiguousKvCache>(ctx, ContiguousKvCache::Mode::kReserve, reserve,
                                             "static");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(static, kvb::static_info, kvb::make_static);
