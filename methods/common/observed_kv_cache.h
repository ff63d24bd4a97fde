#pragma once
// A store wrapped so that something sees every layer's inputs (the queries, keys before and after
// RoPE, values, positions) before the wrapped store attends: how calibration collects its
// statistics from the model (calibration_text.h, KVTC's key/value capture) and how tests capture
// what the engine hands a store. It changes nothing the wrapped store computes.

#include <functional>
#include <memory>
#include <utility>

#include "harness/kv/forwarding_kv_cache.h"

namespace kvb {

class ObservedKvCache : public ForwardingKvCache {
 public:
  using Observer = std::function<void(const LayerInput& in)>;
  ObservedKvCache(std::unique_ptr<KvCache> inner, Observer observe)
      : ForwardingKvCache(std::move(inner)), observe_(std::move(observe)) {}

  at::Tensor attend(const LayerInput& in) override {
    observe_(in);
    return ForwardingKvCache::attend(in);
  }

 private:
  Observer observe_;
};

}  // namespace kvb
