#pragma once
// Shared by the KIVI oracle and the CPU version (kivi_cache.h). Internal: not part of the kernel
// API.

#include "kvb/kernels/kivi_cache.h"
#include "kvb/kernels/quantize.h"

namespace kvb::kernels::kivi_detail {

// Appends sequence b's new tokens for kv head kvh, token by token, quantizing with `quantize`
// (group_quantize_ref or group_quantize_cpu: bit-identical).
void append_item(const KiviAppendParams& p, int b, int kvh,
                 void (*quantize)(const GroupQuantizeParams&));

}  // namespace kvb::kernels::kivi_detail
