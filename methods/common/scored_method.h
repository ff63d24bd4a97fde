#pragma once
// A scoring eviction method in one declaration: its scorer, protection, schedule and (when it is
// not the allocator parameter) its budget allocator, plus what `kvbench methods` lists. The schema
// is always budget + budget_unit, the method's own parameters, position_mode, codec +
// codec_residual and, for methods that take any allocator, allocator + floor_alpha + beta; the
// store is EvictingKvCache. A new scorer is one file: the TokenScorer, a ScoredMethod function and
// one KVB_REGISTER_SCORED_METHOD line (a plugin calls register_scored_method from its entry point).

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/params.h"
#include "harness/kv/method.h"
#include "harness/kv/method_registry.h"
#include "methods/common/composed_policy.h"
#include "methods/common/eviction_select.h"

namespace kvb {

struct ScoredMethod {
  ScoredMethod(std::string name, std::string summary, std::string paper);
  // name, summary, paper and caps as listed (evicts is set); params: the method's own (listed after
  // the budget).
  MethodInfo info;
  double default_budget = 0.5;
  std::string default_position_mode = "absolute";
  // The policy from the resolved parameters (errors name `method`); a null allocator is taken
  // from `allocator` below, else from the allocator parameter.
  std::function<PolicyParts(const nlohmann::json& p, const std::string& method, const Budget& b)>
      parts;
  // Set for a method that is an allocator itself (pyramidkv, adakv): no allocator parameter.
  std::function<std::unique_ptr<BudgetAllocator>(const nlohmann::json& p, const Budget& b)>
      allocator;
  // Adds allocator / floor_alpha / beta (the budget allocator is the user's choice); false for a
  // method whose allocator is fixed (`allocator` or PolicyParts::allocator).
  bool any_allocator = true;
};

// allocator (uniform | pyramid | ada | ada_pyramid), floor_alpha, beta.
std::vector<ParamSpec> allocator_params();
std::unique_ptr<BudgetAllocator> parse_allocator(const nlohmann::json& p, Budget budget);
// Whether the allocator parameter pools a layer's budget over its heads (ada, ada_pyramid).
bool allocator_pools_heads(const nlohmann::json& p);

// A method scored once the prompt is in: `scorer`, nothing protected, run at the end of prefill
// and every compress_every decode steps (the parameter, read from p).
PolicyParts prompt_scored(std::unique_ptr<TokenScorer> scorer, const nlohmann::json& p);

// A method whose scorer has no parameters of its own (knorm, keydiff): a Scorer scored once the
// prompt is in (prompt_scored), compress_every its one parameter.
template <typename Scorer>
ScoredMethod prompt_scored_method(std::string name, std::string summary, std::string paper) {
  ScoredMethod m(std::move(name), std::move(summary), std::move(paper));
  m.info.params = {compress_every_param()};
  m.parts = [](const nlohmann::json& p, const std::string&, const Budget&) {
    return prompt_scored(std::make_unique<Scorer>(), p);
  };
  return m;
}

MethodInfo scored_method_info(const ScoredMethod& m);
CacheFactory scored_method_factory(ScoredMethod m);
void register_scored_method(MethodRegistry& registry, const ScoredMethod& m);

namespace detail {
struct ScoredMethodRegistration {
  explicit ScoredMethodRegistration(ScoredMethod (*spec)());
};
}  // namespace detail

}  // namespace kvb

// One line at the end of a scorer's .cpp: KVB_REGISTER_SCORED_METHOD(name, spec_fn).
#define KVB_REGISTER_SCORED_METHOD(name, spec_fn)                                             \
  static const ::kvb::detail::ScoredMethodRegistration kvb_scored_method_registration_##name( \
      spec_fn)
