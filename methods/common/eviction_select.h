#pragma once
// Selection building blocks shared by the eviction methods (methods/common, so that no method
// includes another's header): top-k, SnapKV-style pooled window scores with GQA aggregation,
// PyramidKV layer budgets, Ada-KV head budgets, and the shared parameter schemas (budget + unit,
// position mode, SnapKV-family settings with presets). Pure functions of host arrays: unit-testable
// on hand-made scores.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/params.h"
#include "harness/kv/method.h"
#include "methods/common/evicting_kv_cache.h"

namespace kvb {

// The slots among `candidates` with the k highest scores (score[slot]); ties go to the lower slot.
// Returned ascending. k >= |candidates| returns all candidates.
std::vector<int64_t> top_k_slots(const float* score, const std::vector<int64_t>& candidates,
                                 int64_t k);

// Merges ascending slot lists into one ascending list (inputs are disjoint).
std::vector<int64_t> merge_slots(std::vector<int64_t> a, const std::vector<int64_t>& b);

enum class Pooling { kNone, kAvg, kMax };
enum class GqaAgg { kMean, kMax };
inline constexpr EnumName<GqaAgg> kGqaAggs[] = {{GqaAgg::kMean, "mean"}, {GqaAgg::kMax, "max"}};
const char* pooling_name(Pooling p);
const char* gqa_agg_name(GqaAgg a);

// 1-D pooling along x[0..n) with stride 1 and "same" padding of kernel / 2 (kernel odd):
// avg divides by `kernel` (PyTorch avg_pool1d's count_include_pad, as the official SnapKV code),
// max ignores the padding. kNone or kernel 1 copies.
std::vector<float> pool1d(const float* x, int64_t n, int64_t kernel, Pooling p);

// SnapKV scoring of one KV head. Window entries are those with token index >= seen - window (the
// observation window's own tokens); the rest are the prefix. Each query head's window-attention row
// restricted to the prefix is pooled, then the group's rows are aggregated (mean | max).
struct SnapScores {
  std::vector<int64_t> prefix;  // slots of prefix entries, ascending
  std::vector<float> score;     // [len] pooled aggregated score by slot (prefix slots only valid)
  std::vector<int64_t> window;  // slots of window entries, ascending
};
SnapScores snap_scores(const LayerView& layer, const HeadView& head, Pooling pooling,
                       int64_t kernel, GqaAgg agg);
// What SnapKV keeps of a head for `budget` entries (window included): the newest
// min(|window|, budget) window entries plus the top (budget - those) prefix entries.
std::vector<int64_t> snap_keep(const SnapScores& s, int64_t budget);

// PyramidKV's per-layer budget (window included) for an average per-layer budget `avg` (window
// included), observation window w, n tokens in the sequence (the prompt length), steepness beta,
// layer l of L (KVCache-Factory's integer arithmetic): min = (avg - w) / beta, max = 2 (avg - w) -
// min; when max >= n - w then max = n - w, min = 2 (avg - w) - max; layer l keeps w + max - l *
// ((max - min) / (L - 1)). Falls back to `avg` (uniform SnapKV) when avg <= w or the pyramid is
// infeasible (min < 0).
int64_t pyramid_layer_budget(int64_t avg, int64_t w, int64_t n, double beta, int layer,
                             int n_layers);

// Ada-KV's head-adaptive allocation of `total` prefix entries over heads: the global top `total` of
// all heads' scores gives n_h selections per head; quota_h = alpha * total / H + (1 - alpha) * n_h,
// integerised by largest remainder to sum to min(total, sum of caps), each capped at the head's
// candidate count. scores[h] are the candidate scores of head h (any order).
std::vector<int64_t> adaptive_head_budgets(const std::vector<std::vector<float>>& scores,
                                           int64_t total, double alpha);

// ---- parameter schemas shared by the eviction methods ----
// budget_doc: what the budget counts, for a method whose budget is not the kept entries (""
// keeps the eviction wording).
std::vector<ParamSpec> budget_params(double default_budget, const std::string& default_unit,
                                     const std::string& budget_doc = "");
ParamSpec position_mode_param(const std::string& default_mode);
// Validates: ratio in (0, 1]; token units integral >= 1. Errors name `method.budget`.
Budget parse_budget(const nlohmann::json& p, const std::string& method);

struct SnapSettings {
  int64_t window = 32;
  int64_t kernel = 5;
  Pooling pooling = Pooling::kAvg;
  GqaAgg agg = GqaAgg::kMean;
};
// preset (choices: "none" + the keys of `presets`), window, kernel_size, pooling, gqa_agg (each
// defaulting to "take it from the preset"), compress_every.
std::vector<ParamSpec> snap_params(const std::map<std::string, SnapSettings>& presets,
                                   const std::string& default_preset);
SnapSettings parse_snap(const nlohmann::json& p, const std::string& method,
                        const std::map<std::string, SnapSettings>& presets);
// compress_every (shared by the prefill-scored methods): 0 = only at the end of prefill.
ParamSpec compress_every_param();
// For the methods that evict as they go (StreamingLLM, H2O, TOVA): schedule = continuous (before
// and/or after every step, prefill chunks and decode steps: the papers) | prefill (once at the end
// of the prompt, as kvpress applies every press; with compress_every k > 0 also every k decode
// steps, kvpress's DecodingPress), plus compress_every.
std::vector<ParamSpec> eviction_schedule_params();
// `continuous` is the method's own schedule; returns it or the prefill one `p` asks for.
// compress_every without schedule=prefill is refused (errors name `method`).
EvictionPolicy::Schedule parse_eviction_schedule(const nlohmann::json& p, const std::string& method,
                                                 EvictionPolicy::Schedule continuous);
std::map<std::string, double> snap_settings_counters(const SnapSettings& s);

// How an eviction method stores what it keeps (eviction x quantization, physically):
//   codec: none (the model dtype) | fp16 | bf16 | kivi-2 | kivi-4 | kivi-8 (KIVI layout: keys per
//          channel in groups of 32 tokens, values per token in groups of min(32, head_dim)
//          channels) | pertoken-2 | pertoken-4 | pertoken-8 (K and V per token, one group per
//          head);
//   codec_residual: full-precision newest kept entries per head (KIVI's R; a multiple of 32 for
//          kivi-*).
std::vector<ParamSpec> codec_params();
// Where `codec` runs (a TargetCheck for every method with codec_params): anywhere for codec none;
// otherwise on CPU fp32 only, because the codec store keeps its rows on the host.
std::string codec_target_check(const nlohmann::json& p, const RunTarget& target);
// Null for codec "none". Errors name `method.codec_residual`.
std::shared_ptr<const KvCodec> parse_codec(const nlohmann::json& p, const std::string& method,
                                           int64_t head_dim);

// The store options every eviction method reads the same way: name, position_mode and codec.
EvictingKvCache::Options evicting_options(const nlohmann::json& p, const std::string& method,
                                          int64_t head_dim);

}  // namespace kvb
