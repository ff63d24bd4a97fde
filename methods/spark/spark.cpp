// spark: SparK (AAAI 2026): query-aware unstructured key-channel pruning with average-based
// recovery, on the tokens a SnapKV selection keeps (budget 1 = on all tokens). Per KV head, at the
// end of prefill: SnapKV evicts (when budget < 1), then each kept prompt key keeps its own top
// D - floor(rho D) channels by k_c^2 * n_c (n_c: the observation window's query energy), and a
// pruned channel reads back as sign * sqrt(m_t / n_c). Storage is physical (methods/common/
// channel_prune_codec.h): kept values, a D-bit mask, m_t and the sign bits per token, all counted.
// `codec` stacks a quantizer under the pruning (codec=kivi-2: the kept channels and the decode-time
// keys and values are stored KIVI-2); codec=none is the paper's setting.

#include "harness/kv/method_registry.h"
#include "methods/common/channel_prune_codec.h"
#include "methods/common/eviction_select.h"
#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

const EnumName<ChannelRecovery> kRecoveries[] = {{ChannelRecovery::kAverage, "average"},
                                                 {ChannelRecovery::kZero, "zero"}};

MethodInfo spark_info() {
  return pruned_snap_info(
      "spark",
      "SparK: per-token unstructured key-channel pruning (top channels by k^2 x window query "
      "energy) with average-based recovery, on SnapKV-kept tokens",
      "Liao et al., SparK: Query-Aware Unstructured Sparsity with Recoverable KV Cache Channel "
      "Pruning, AAAI 2026 (arXiv 2508.15212); code Xnhyacinth/SparK spark_press.py",
      "rho: fraction of each prompt key's channels pruned (paper: 0.5, 0.8)",
      {enum_param("recovery", kRecoveries, ChannelRecovery::kAverage,
                  "pruned channels read back as sign x sqrt(m_t / n_c) (average, "
                  "the code's pooling_ratio 0.65 path; 1 sign bit per pruned "
                  "entry stored) or 0 (zero)")});
}

std::unique_ptr<KvCache> make_spark(const CacheContext& ctx, const nlohmann::json& p) {
  ChannelPruneSpec cs;
  cs.mode = ChannelPruneMode::kSpark;
  cs.recovery = param_enum(p, "recovery", kRecoveries);
  return make_pruned_snap_cache(ctx, p, "spark", cs);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(spark, kvb::spark_info, kvb::make_spark);
