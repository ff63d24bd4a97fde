#pragma once
// The shapes a store that indexes raw K/V rows works in, read once from its CacheContext: a base
// of those stores (the eviction store, KVReviver, Quest), so that every one of them names them the
// same way and none re-derives or re-checks them.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

#include "harness/common/internal_error.h"
#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"

namespace kvb {

class HeadGeometry {
 protected:
  // force_generic: take the LibTorch path even where the raw-pointer one could run (tests).
  explicit HeadGeometry(const CacheContext& ctx, bool force_generic = false)
      : L_(ctx.config.n_layers),
        Hkv_(ctx.config.n_kv_heads),
        Hq_(ctx.config.n_heads),
        G_(ctx.config.n_kv_heads > 0 ? ctx.config.n_heads / ctx.config.n_kv_heads : 0),
        D_(ctx.config.head_dim),
        elem_(static_cast<int64_t>(c10::elementSize(ctx.dtype))),
        fast_(ctx.device.is_cpu() && ctx.dtype == c10::kFloat && !force_generic) {
    // Model configs are validated when they are read (ModelConfig::validate).
    KVB_ASSERT(Hkv_ >= 1 && Hq_ % Hkv_ == 0, "model config", Hq_, " query heads do not group over ",
               Hkv_, " KV heads");
  }

  // A step's rows as the raw-pointer path reads them, contiguous: q [T, Hq, D], k and v
  // [T, Hkv, D]; k is in.k_pre_rope with pre_rope (a store that re-rotates keys), else in.k.
  struct StepRows {
    at::Tensor q, k, v;
  };
  static StepRows contiguous_rows(const LayerInput& in, bool pre_rope = false) {
    return {in.q->contiguous(), (pre_rope ? *in.k_pre_rope : *in.k).contiguous(),
            in.v->contiguous()};
  }

  int64_t L_;     // layers the store serves
  int64_t Hkv_;   // KV heads
  int64_t Hq_;    // query heads
  int64_t G_;     // query heads per KV head
  int64_t D_;     // head_dim
  int64_t elem_;  // bytes per element of the model dtype
  bool fast_;     // CPU fp32: the raw-pointer path
};

}  // namespace kvb
