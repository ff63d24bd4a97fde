#pragma once
// The SnapKV eviction policy (observation-window scores, pooled, per-KV-head top-k at the end of
// prefill) and its presets, shared by snapkv and the methods that build on it (spark, think).

#include <map>
#include <memory>
#include <string>

#include "methods/common/channel_prune_codec.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"

namespace kvb {

// official (FasterDecoding/SnapKV: window 32, avg-pool 5), longbench (window 32, max-pool 7),
// kvpress (window 64, avg-pool 5).
const std::map<std::string, SnapSettings>& snapkv_presets();

// every: also re-select every k decode steps (0: only at the end of prefill).
std::unique_ptr<EvictionPolicy> make_snap_policy(Budget budget, SnapSettings s, int64_t every);

// SnapKV selection with prompt keys stored through a channel-pruning codec (spark, think): reads the
// budget, SnapKV settings and `pruning_ratio` from `p`; spec.mode and spec.recovery come from the
// caller, the window from the SnapKV settings. CPU fp32 only (errors name `method`).
std::unique_ptr<KvCache> make_pruned_snap_cache(const CacheContext& ctx, const nlohmann::json& p,
                                                const std::string& method, ChannelPruneSpec spec);

}  // namespace kvb
