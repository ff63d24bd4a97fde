#pragma once
// The probe view of a store that holds a layer's tokens densely, in order (contiguous, vAttention's
// arena, Quest's full cache): one snapshot per KV head, entry i = token i.

#include <vector>

#include "harness/kv/probe_view.h"

namespace kvb {

// k, v: [n, n_kv_heads, head_dim] fp32 rows the caller owns (copies: a snapshot must not alias a
// store's memory that a later step reuses). Index: arange(n) on k's device, shared by the heads.
std::vector<HeadSnapshot> dense_head_snapshots(const at::Tensor& k, const at::Tensor& v);

}  // namespace kvb
