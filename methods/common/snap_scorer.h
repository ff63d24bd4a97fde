#pragma once
// The SnapKV scorer (observation-window attention of the last `window` queries, pooled along the
// keys, the query heads of a GQA group aggregated into their KV head) and its presets, shared by
// snapkv and the methods that build on it (pyramidkv, adakv, spark, think).

#include <map>
#include <memory>
#include <string>

#include "methods/common/channel_prune_codec.h"
#include "methods/common/composed_policy.h"
#include "methods/common/eviction_select.h"
#include "methods/common/scored_method.h"
#include "methods/common/token_scorer.h"

namespace kvb {

// The presets of snapkv, pyramidkv or adakv (each names its official code's settings and kvpress's
// where they differ; snap_scorer.cpp has the sources). snapkv: official (FasterDecoding/SnapKV:
// window 32, avg-pool 5), longbench (window 32, max-pool 7), kvpress (window 64, avg-pool 5).
const std::map<std::string, SnapSettings>& snap_presets(const std::string& method);
const std::map<std::string, SnapSettings>& snapkv_presets();

std::unique_ptr<TokenScorer> make_snap_scorer(SnapSettings s);

// A SnapKV-family method: the snap scorer with `name`'s presets (snap_presets), the SnapKV settings
// as parameters, query-aware; the allocator is the parameter unless the caller fixes it.
ScoredMethod snap_family_method(std::string name, std::string summary, std::string paper);
// One that is a budget allocator itself (pyramidkv, adakv): `allocator` built from its own
// parameters `allocator_params` (listed after the SnapKV settings), no allocator parameter.
ScoredMethod snap_family_method(std::string name, std::string summary, std::string paper,
                                std::vector<ParamSpec> allocator_params,
                                decltype(ScoredMethod::allocator) allocator);

// SnapKV's policy without its allocator: the snap scorer, the observation window protected, run at
// the end of prefill and, with every > 0, every k decode steps.
PolicyParts snap_parts(SnapSettings s, int64_t every);

// The schema of a SnapKV selection stored through a channel-pruning codec (spark, think): budget
// (default 1: every token), the SnapKV settings, pruning_ratio (documented by `ratio_doc`), the
// method's `own` parameters, codec + codec_residual; caps evicts, quantizes, query-aware.
MethodInfo pruned_snap_info(std::string name, std::string summary, std::string paper,
                            const std::string& ratio_doc, const std::vector<ParamSpec>& own);

// SnapKV selection with prompt keys stored through a channel-pruning codec (spark, think): reads
// the budget, SnapKV settings, `pruning_ratio` and the codec that stores what pruning keeps
// (`codec`, `codec_residual`) from `p`; spec.mode and spec.recovery come from the caller, the
// window from the SnapKV settings. CPU fp32 only (errors name `method`).
std::unique_ptr<KvCache> make_pruned_snap_cache(const CacheContext& ctx, const nlohmann::json& p,
                                                const std::string& method, ChannelPruneSpec spec);

}  // namespace kvb
