#include "methods/common/budget_allocator.h"

#include <algorithm>

#include "methods/common/eviction_select.h"

namespace kvb {

namespace {

// Every head of a layer gets the same budget: uniform, or the layer's step of the pyramid.
class EqualHeadsAllocator : public BudgetAllocator {
 public:
  EqualHeadsAllocator(Budget budget, bool pyramid, double beta)
      : budget_(budget), pyramid_(pyramid), beta_(beta) {}

  bool over_budget(const LayerView& v) const override {
    const int64_t B = head_budget(v);
    for (const HeadView& hv : v.heads)
      if (hv.len > B) return true;
    return false;
  }

  bool keep(const LayerView& v, const Protect& protect,
            const std::vector<std::vector<float>>& scores,
            std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t B = head_budget(v);
    bool changed = false;
    for (int64_t h = 0; h < v.n_kv_heads; ++h) {
      const HeadView& hv = v.heads[h];
      auto& k = (*keep)[h];
      if (hv.len <= B) {
        k.resize(static_cast<size_t>(hv.len));
        for (int64_t j = 0; j < hv.len; ++j) k[j] = j;
        continue;
      }
      HeadSplit s = split_head(protect, v, hv, B);
      k = merge_slots(top_k_slots(scores[h].data(), s.candidates, s.room), s.kept);
      changed = changed || static_cast<int64_t>(k.size()) < hv.len;
    }
    return changed;
  }

  std::map<std::string, double> settings() const override {
    if (!pyramid_) return {};
    return {{"setting.beta", beta_}};
  }

 private:
  int64_t head_budget(const LayerView& v) const {
    const int64_t avg = budget_.per_head(v.total(), v.n_kv_heads) - v.incoming;
    if (!pyramid_) return avg;
    // n is the sequence length (the prompt at the end of prefill) for every layer, so that periodic
    // re-compression keeps one consistent pyramid (layers hold min(their budget, what they have)).
    return pyramid_layer_budget(avg, v.window, v.total(), beta_, v.layer, v.n_layers);
  }

  Budget budget_;
  bool pyramid_;
  double beta_;
};

class HeadAdaptiveAllocator : public BudgetAllocator {
 public:
  HeadAdaptiveAllocator(Budget budget, double alpha, bool pyramid, double beta)
      : budget_(budget), alpha_(alpha), pyramid_(pyramid), beta_(beta) {}

  bool over_budget(const LayerView& v) const override {
    int64_t held = 0;
    for (const HeadView& hv : v.heads) held += hv.len;
    return held > layer_budget(v);
  }

  bool keep(const LayerView& v, const Protect& protect,
            const std::vector<std::vector<float>>& scores,
            std::vector<std::vector<int64_t>>* keep) const override {
    const int64_t H = v.n_kv_heads;
    const int64_t total = layer_budget(v);
    if (!over_budget(v)) return false;
    // Each head's protected entries come out of its average share; the pool is what is left of
    // the layer's total.
    std::vector<HeadSplit> split(static_cast<size_t>(H));
    std::vector<std::vector<float>> cand_scores(static_cast<size_t>(H));
    int64_t pool = total;
    for (int64_t h = 0; h < H; ++h) {
      split[h] = split_head(protect, v, v.heads[h], total / H);
      pool -= static_cast<int64_t>(split[h].kept.size());
      for (int64_t j : split[h].candidates) cand_scores[h].push_back(scores[h][j]);
    }
    const std::vector<int64_t> b = adaptive_head_budgets(cand_scores, pool, alpha_);
    for (int64_t h = 0; h < H; ++h)
      (*keep)[h] =
          merge_slots(top_k_slots(scores[h].data(), split[h].candidates, b[h]), split[h].kept);
    return true;
  }

  bool pools_heads() const override { return true; }

  std::map<std::string, double> settings() const override {
    return {{"setting.floor_alpha", alpha_}, {"setting.pyramid", pyramid_ ? 1.0 : 0.0}};
  }

 private:
  int64_t layer_budget(const LayerView& v) const {
    const int64_t H = v.n_kv_heads;
    const int64_t total = budget_.per_layer(v.total(), H) - H * v.incoming;
    if (!pyramid_) return total;
    return H * pyramid_layer_budget(total / H, v.window, v.total(), beta_, v.layer, v.n_layers);
  }

  Budget budget_;
  double alpha_;
  bool pyramid_;
  double beta_;
};

}  // namespace

std::unique_ptr<BudgetAllocator> make_uniform_allocator(Budget budget) {
  return std::make_unique<EqualHeadsAllocator>(budget, false, 0.0);
}

std::unique_ptr<BudgetAllocator> make_pyramid_allocator(Budget budget, double beta) {
  return std::make_unique<EqualHeadsAllocator>(budget, true, beta);
}

std::unique_ptr<BudgetAllocator> make_head_adaptive_allocator(Budget budget, double floor_alpha,
                                                              bool pyramid, double beta) {
  return std::make_unique<HeadAdaptiveAllocator>(budget, floor_alpha, pyramid, beta);
}

}  // namespace kvb
