#pragma once
// The reference method: the uncompressed cache every other method is measured against (the full-cache
// logits of stream, the full-cache answers of qa, the leaderboard's deltas). The method that is the
// reference defines this (methods/full/full.cpp), so the harness never spells its name.

#include <string>

namespace kvb {

const std::string& baseline_method();

}  // namespace kvb
