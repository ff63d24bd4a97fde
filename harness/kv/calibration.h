#pragma once
// The calibration contract. A method whose store needs numbers computed from the run's model
// before it can run (Q-Filters' per-head query directions, DuoAttention's retrieval/streaming head
// split, KVTC's PCA bases) registers a Calibrator beside its factory (method_registry.h). Before a
// run's first sample the runner calls it once with the run's model and the method's resolved
// parameters; it returns a CalibrationArtifact, which
//   - is cached on disk by the content hash of everything that decides it (the model's weights and
//     config, the calibration parameters, the calibration text), so a grid calibrates once;
//   - is recorded with the run (the results DB's `artifacts` table holds the file by its sha256,
//   and
//     the run's provenance names the artifact's key and whether it was computed or loaded);
//   - reaches the method's factory through CacheContext::calibration, so a store never loads a
//   model
//     itself.
// The artifact is opaque to the harness: a method derives its own type from CalibrationArtifact and
// casts back in its factory. Torch-free (a method's payload lives in its own derived type).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace kvb {

class Model;

class CalibrationArtifact {
 public:
  virtual ~CalibrationArtifact() = default;
  std::string method;       // the method that computed it
  std::string key;          // sha256 of `meta` (the inputs): the cache file's name
  std::string path;         // the cache file ("" when not saved to disk)
  int64_t file_bytes = 0;   // its size
  bool from_cache = false;  // loaded from the cache file rather than computed by this process
  double seconds = 0;       // time spent computing it (0 when loaded)
  nlohmann::json meta;      // everything that decides it (model hash, parameters, data hash)
};

// The counters every calibrated store reports: whether its artifact came from the cache file, the
// seconds computing it took (0 when loaded) and the file's size.
inline void add_calibration_counters(const CalibrationArtifact& a,
                                     std::map<std::string, double>* counters) {
  (*counters)["calib_from_cache"] = a.from_cache ? 1.0 : 0.0;
  (*counters)["calib_seconds"] = a.seconds;
  (*counters)["calib_artifact_bytes"] = static_cast<double>(a.file_bytes);
}

// model: the run's model, to be run (through an Engine of the calibrator's own) but never changed;
// params: the method's parameters, resolved against its schema. Throws kvb::Error naming the input
// when calibration data is missing or a cached artifact is corrupt.
using Calibrator = std::function<std::shared_ptr<const CalibrationArtifact>(
    const std::shared_ptr<Model>& model, const nlohmann::json& params)>;

}  // namespace kvb
