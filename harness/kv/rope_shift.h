#pragma once
// Moving cached keys to other positions without recomputing them. RoPE rotates each channel pair of
// a key at position p by p * freq_i; one more rotation by delta * freq_i puts it at p + delta, exactly
// up to rounding (rotations about the same axis compose). KV Packet places separately prefilled
// document caches one after another this way; any position-shifting store can use the same.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "harness/formats/model_config.h"

namespace kvb {

// k: [n, heads, head_dim], post-RoPE keys of any dtype and device. Returns the keys as they would be
// at positions + delta (delta may be negative), in k's dtype; computed in fp32 with the angles in
// fp64. delta == 0 returns k itself.
at::Tensor rope_shift(const at::Tensor& k, const ModelConfig& c, int64_t delta);

}  // namespace kvb
