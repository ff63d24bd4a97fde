#pragma once
// A run's configuration: JSON in, strictly validated, defaults filled in, canonical form hashed. The
// resolved config is what the results store records and what identifies a run.
//
//   {
//     "model": "stories260K", "device": "cpu", "dtype": "fp32", "threads": 0, "seed": 0,
//     "method": {"name": "paged", "params": {"block_size": 16}},   // or just "paged"
//     "protocol": {"name": "stream", "dataset": "tinystories-valid-sample", "window": 256, ...},
//     "label": "optional free text (not hashed)"
//   }

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/common/config_overrides.h"  // apply_overrides, with the config loaders
#include "harness/common/params.h"

namespace kvb {

// Parses a config file. Throws kvb::Error naming the file (and line/column for bad JSON).
nlohmann::json load_config_file(const std::string& path);

// Validates every key (unknown keys are errors with a nearest-name hint), the method (against the
// registry and its schema) and the protocol (against the protocol registry); returns the config with all defaults filled in.
nlohmann::json resolve_run_config(const nlohmann::json& raw);

// The dataset a run is filed under in the results store (leaderboards group by it): its protocol's
// dataset_label (protocol.h).
std::string run_dataset_label(const nlohmann::json& resolved);

// Hash of the resolved config minus fields that do not change results ("label").
std::string run_config_hash(const nlohmann::json& resolved);

}  // namespace kvb
