#include "methods/common/composed_policy.h"

#include "harness/common/error.h"

namespace kvb {

namespace {

class ComposedPolicy : public EvictionPolicy {
 public:
  explicit ComposedPolicy(PolicyParts p) : p_(std::move(p)) {
    KVB_CHECK(p_.scorer != nullptr && p_.allocator != nullptr,
              "eviction policy: a scorer and an allocator are required");
  }
  Needs needs() const override { return p_.scorer->needs(); }
  Schedule schedule() const override { return p_.schedule; }
  bool select(const LayerView& v, std::vector<std::vector<int64_t>>* keep) const override {
    // Within budget: nothing to score (scoring every head of every step would cost for nothing).
    if (!p_.allocator->over_budget(v)) return false;
    std::vector<std::vector<float>> scores(static_cast<size_t>(v.n_kv_heads));
    if (!p_.scorer->score(v, &scores)) return false;
    return p_.allocator->keep(v, p_.protect, scores, keep);
  }
  std::map<std::string, double> settings() const override {
    std::map<std::string, double> s = p_.scorer->settings();
    for (const auto& [k, x] : p_.allocator->settings()) s[k] = x;
    for (const auto& [k, x] : p_.settings) s[k] = x;
    return s;
  }

 private:
  PolicyParts p_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_composed_policy(PolicyParts parts) {
  return std::make_unique<ComposedPolicy>(std::move(parts));
}

}  // namespace kvb
