#pragma once
// An optional capability of a KvCache (found with dynamic_cast; a store that lacks it is never
// handed them): the hidden states a layer starts from, for methods whose decisions read them (DMS's
// eviction adapters). The forward hands them over right before the layer's attend.

#include <ATen/core/Tensor.h>

namespace kvb {

class HiddenStateCache {
 public:
  virtual ~HiddenStateCache() = default;
  // hidden: [T, dim], model dtype: the residual stream entering layer `layer` (before its attention
  // norm) for the step's tokens; valid until that layer's attend returns.
  virtual void layer_hidden(int layer, const at::Tensor& hidden) = 0;
};

}  // namespace kvb
