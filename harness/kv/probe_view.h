#pragma once
// An optional capability of a KvCache (found with dynamic_cast): what the store holds, per KV head,
// as attention reads it, for the probe protocol's per-layer fidelity. A store without it is probed
// on its attention output only.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "harness/kv/kv_cache.h"

namespace kvb {

// What a store holds for one sequence, layer and KV head: reconstructed or dequantized keys
// (post-RoPE), values, and which token each kept entry came from.
struct HeadSnapshot {
  at::Tensor k;      // [n_kept, head_dim], fp32
  at::Tensor v;      // [n_kept, head_dim], fp32
  at::Tensor index;  // [n_kept], int64: the token's index in the sequence (0 = first token)
};

class ProbedCache {
 public:
  virtual ~ProbedCache() = default;
  // Per KV head, what the store holds for `seq_id` at `layer`; empty: nothing to show (an unknown
  // sequence, or a state the store cannot show).
  virtual std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const = 0;
};

// The store's view, or empty when it has no ProbedCache capability.
inline std::vector<HeadSnapshot> probe_view_of(const KvCache& kv, int layer, int64_t seq_id) {
  const auto* p = dynamic_cast<const ProbedCache*>(&kv);
  return p ? p->probe_view(layer, seq_id) : std::vector<HeadSnapshot>{};
}

}  // namespace kvb
