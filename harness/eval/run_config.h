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

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/common/config_overrides.h"  // apply_overrides, with the config loaders
#include "harness/common/params.h"
#include "harness/eval/protocol.h"
#include "harness/formats/model_config.h"

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

// What RunConfigChecker looks at beside the config.
struct ConfigCheckOptions {
  std::string models_dir, data_dir;
  // Look for the model's files and the protocol's data. False (grid --schema-only, a reproduce
  // claim for another machine): the config alone is checked, and a method's store is built only
  // for a synthetic model (whose shapes need no file).
  bool check_inputs = true;
};

// The one validation pass of `kvbench run`, `grid` and `reproduce`, made on resolved configs before
// anything is written (no database is opened): the model resolves; the protocol's inputs load and
// its settings fit the model's declared context (Protocol::check_inputs, check_model_inputs); the
// method's store is built for the model's shapes, read from its config without weights, and
// dropped, so that what the method's factory checks (a kept ratio above 1, a budget in the wrong
// unit, a group that does not divide head_dim, an adapter trained for other shapes) fails here as
// the run's own build would. A calibrating method's store needs the model's weights: its schema is
// checked at resolution, the rest by the run before its row. Each input and each distinct store
// (method, parameters, model, device, dtype) is checked once per checker, so a grid of hundreds of
// cells costs one store build per distinct method config.
class RunConfigChecker {
 public:
  explicit RunConfigChecker(ConfigCheckOptions options) : options_(std::move(options)) {}
  // Throws kvb::Error naming the input or parameter; the same error again for every config that
  // shares the input.
  void check(const nlohmann::json& resolved);

 private:
  void once(const std::string& what, const std::function<void()>& fn);
  ConfigCheckOptions options_;
  std::map<std::string, std::string> checked_;  // what -> error ("" when it passed)
  std::map<std::string, ModelFacts> facts_;     // by model spec
  std::map<std::string, ModelConfig> configs_;  // by model spec
};

}  // namespace kvb
