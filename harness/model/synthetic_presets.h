#pragma once
// synthetic:<preset>: real architecture shapes with deterministic seeded weights, for memory and speed
// work where accuracy does not matter.

#include <string>
#include <vector>

#include "harness/formats/model_config.h"

namespace kvb {

// Throws kvb::Error listing the presets (with a nearest-name hint) when `preset` is unknown.
ModelConfig synthetic_preset(const std::string& preset);
std::vector<std::string> synthetic_preset_names();

}  // namespace kvb
