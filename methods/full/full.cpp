// full: the dense per-sequence KV cache, nothing compressed — the reference every method is
// measured against.

#include "harness/kv/baseline_method.h"
#include "harness/kv/method_registry.h"
#include "methods/common/contiguous_kv_cache.h"
#include "methods/common/method_listing.h"

namespace kvb {
namespace {

MethodInfo full_info() {
  return method_listing(
      "full",
      "dense per-sequence KV cache (contiguous, grows by doubling); the uncompressed baseline");
}

std::unique_ptr<KvCache> make_full(const CacheContext& ctx, const nlohmann::json&) {
  return std::make_unique<ContiguousKvCache>(ctx, ContiguousKvCache::Mode::kGrow, 0, "full");
}

}  // namespace

const std::string& baseline_method() {
  static const std::string name = full_info().name;
  return name;
}

}  // namespace kvb

KVB_REGISTER_METHOD(full, kvb::full_info, kvb::make_full);
