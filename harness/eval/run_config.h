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

struct ProtocolSpec {
  std::string name;
  std::string summary;
  std::vector<ParamSpec> params;
};

// The protocols `kvbench run` knows, with their parameter schemas.
const std::vector<ProtocolSpec>& protocol_specs();
const ProtocolSpec& protocol_spec(const std::string& name);  // throws with a hint

// Parses a config file. Throws kvb::Error naming the file (and line/column for bad JSON).
nlohmann::json load_config_file(const std::string& path);

// Validates every key (unknown keys are errors with a nearest-name hint), the method (against the
// registry and its schema) and the protocol; returns the config with all defaults filled in.
nlohmann::json resolve_run_config(const nlohmann::json& raw);

// Hash of the resolved config minus fields that do not change results ("label").
// The dataset a run is filed under in the results store (leaderboards group by it): the qa task
// and length, recall:<corpus>, longbench:<file>, trace:<name> for serve, else the corpus.
std::string run_dataset_label(const nlohmann::json& resolved);

std::string run_config_hash(const nlohmann::json& resolved);

}  // namespace kvb
