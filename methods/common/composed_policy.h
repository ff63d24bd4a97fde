#pragma once
// An eviction policy composed of parts: a TokenScorer (what an entry is worth), a Protect (what is
// kept whatever the score), a BudgetAllocator (how many entries each KV head keeps) and a Schedule
// (when: end of prefill, every k decode steps, before / after every step). Every eviction method of
// methods/ is one of these; the store (EvictingKvCache) and the codec it stores through stay as
// they are. Torch-free.

#include <map>
#include <memory>
#include <string>

#include "methods/common/budget_allocator.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/protect.h"
#include "methods/common/token_scorer.h"

namespace kvb {

struct PolicyParts {
  std::unique_ptr<TokenScorer> scorer;
  Protect protect;
  std::unique_ptr<BudgetAllocator> allocator;
  EvictionPolicy::Schedule schedule;
  // Settings of the method itself reported with the counters (e.g. H2O's recent share), besides
  // the scorer's and the allocator's.
  std::map<std::string, double> settings;
};

std::unique_ptr<EvictionPolicy> make_composed_policy(PolicyParts parts);

}  // namespace kvb
