// think: ThinK (ICLR 2025), the structured baseline SparK compares against: per KV head, at the end
// of prefill, channel c scores mean_window(q_c^2) x mean_tokens(k_c^2) over the prompt's kept
// keys, and the lowest floor(rho D) channels are dropped for all of them (zero fill). SnapKV
// selection first when budget < 1. Physical storage: kept values + one D-bit mask per head
// (methods/common/channel_prune_codec.h). `codec` stacks a quantizer under the pruning (e.g.
// kivi-2).

#include "harness/kv/method_registry.h"
#include "methods/common/channel_prune_codec.h"
#include "methods/common/eviction_select.h"
#include "methods/common/snap_scorer.h"

namespace kvb {
namespace {

const EnumName<QueryEnergy> kQueryEnergies[] = {{QueryEnergy::kGroupMean, "group_mean"},
                                                {QueryEnergy::kMeanSquare, "mean_square"}};

// One channel mask per head, zero fill; the group's query energy as `query_energy` says.
ChannelPruneSpec think_spec(const nlohmann::json& p) {
  ChannelPruneSpec cs;
  cs.mode = ChannelPruneMode::kThink;
  cs.recovery = ChannelRecovery::kZero;
  cs.energy = param_enum(p, "query_energy", kQueryEnergies);
  return cs;
}

ParamSpec query_energy_param() {
  return enum_param("query_energy", kQueryEnergies, QueryEnergy::kGroupMean,
                    "how a GQA group's window queries make one energy per channel: the square of "
                    "their mean (SparK's statistic) or the mean of their squares (kvpress's "
                    "ThinKPress)");
}

MethodInfo think_info() {
  return pruned_snap_info(
      "think",
      "ThinK: structured key-channel pruning (one channel mask per KV head by window query x key "
      "energy), on SnapKV-kept tokens",
      "Xu et al., ThinK: Thinner Key Cache by Query-Driven Pruning, ICLR 2025 (arXiv 2407.21018); "
      "as run in Xnhyacinth/SparK",
      "rho: fraction of each head's key channels dropped", {query_energy_param()});
}

std::unique_ptr<KvCache> make_think(const CacheContext& ctx, const nlohmann::json& p) {
  return make_pruned_snap_cache(ctx, p, "think", think_spec(p));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(think, kvb::think_info, kvb::make_think);
