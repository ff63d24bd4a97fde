#include "methods/common/scored_method.h"

#include "harness/common/error.h"
#include "methods/common/eviction_select.h"

namespace kvb {

ScoredMethod::ScoredMethod(std::string name, std::string summary, std::string paper) {
  info.name = std::move(name);
  info.summary = std::move(summary);
  info.paper = std::move(paper);
  info.caps.evicts = true;
}

std::vector<ParamSpec> allocator_params() {
  return {string_param("allocator", "uniform", {"uniform", "pyramid", "ada", "ada_pyramid"},
                       "how the budget is spread: uniform = every KV head of every layer keeps the "
                       "same; pyramid = PyramidKV's linearly decreasing per-layer budgets; ada = "
                       "Ada-KV's head-adaptive split of each layer's budget; ada_pyramid = both"),
          float_param("floor_alpha", 0.2, 0.0, 1.0,
                      "ada: share of the average head budget every head is guaranteed"),
          float_param("beta", 20.0, 1.0, 1e6,
                      "pyramid: steepness (the top layer keeps 1 / beta of the bottom's scored "
                      "share)")};
}

std::unique_ptr<BudgetAllocator> parse_allocator(const nlohmann::json& p, Budget budget) {
  const std::string a = p.at("allocator").get<std::string>();
  const double alpha = p.at("floor_alpha").get<double>(), beta = p.at("beta").get<double>();
  if (a == "pyramid") return make_pyramid_allocator(budget, beta);
  if (a == "ada") return make_head_adaptive_allocator(budget, alpha, false, beta);
  if (a == "ada_pyramid") return make_head_adaptive_allocator(budget, alpha, true, beta);
  return make_uniform_allocator(budget);
}

bool allocator_pools_heads(const nlohmann::json& p) {
  return p.at("allocator").get<std::string>().rfind("ada", 0) == 0;
}

PolicyParts prompt_scored(std::unique_ptr<TokenScorer> scorer, const nlohmann::json& p) {
  PolicyParts parts;
  parts.scorer = std::move(scorer);
  parts.schedule.end_prefill = true;
  parts.schedule.every_decode_steps = p.at("compress_every").get<int64_t>();
  return parts;
}

MethodInfo scored_method_info(const ScoredMethod& m) {
  MethodInfo info = m.info;
  info.params = budget_params(m.default_budget, "ratio");
  for (const auto& s : m.info.params) info.params.push_back(s);
  info.params.push_back(position_mode_param(m.default_position_mode));
  for (auto& s : codec_params()) info.params.push_back(s);
  if (!info.target_check) info.target_check = codec_target_check;
  if (m.any_allocator && !m.allocator)
    for (auto& s : allocator_params()) info.params.push_back(s);
  return info;
}

CacheFactory scored_method_factory(ScoredMethod m) {
  return [m = std::move(m)](const CacheContext& ctx, const nlohmann::json& p) {
    const std::string& name = m.info.name;
    const Budget budget = parse_budget(p, name);
    PolicyParts parts = m.parts(p, name, budget);
    if (!parts.allocator && m.allocator) parts.allocator = m.allocator(p, budget);
    if (!parts.allocator) {
      KVB_CHECK(m.any_allocator, "method ", name, ": its definition names no budget allocator");
      parts.allocator = parse_allocator(p, budget);
    }
    return std::unique_ptr<KvCache>(
        std::make_unique<EvictingKvCache>(ctx, evicting_options(p, name, ctx.config.head_dim),
                                          make_composed_policy(std::move(parts))));
  };
}

void register_scored_method(MethodRegistry& registry, const ScoredMethod& m) {
  registry.add(scored_method_info(m), scored_method_factory(m));
}

detail::ScoredMethodRegistration::ScoredMethodRegistration(ScoredMethod (*spec)()) {
  register_scored_method(MethodRegistry::instance(), spec());
}

}  // namespace kvb
