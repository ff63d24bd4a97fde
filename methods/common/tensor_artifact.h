#pragma once
// A calibration artifact made of named fp32 tensors (per-layer, per-head statistics: Q-Filters'
// filters, DuoAttention's head scores), cached on disk by content hash. The file is
// <cache_dir>/<key>.safetensors, key = sha256 of the inputs' JSON (the model's content hash, the
// calibration parameters, the calibration text's sha256); its metadata records the method, the key,
// the inputs and the sha256 of the tensor payload, so a file that was cut short or changed is
// refused naming its path instead of being read as numbers. Files are written to a temporary name
// and renamed, so concurrent grid shards never see half a file.

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/kv/calibration.h"

namespace kvb {

class Model;
struct CalibrationText;

class TensorArtifact : public CalibrationArtifact {
 public:
  std::map<std::string, at::Tensor> tensors;  // fp32, CPU, contiguous
  // Throws kvb::Error naming the artifact's file when `name` is absent.
  const at::Tensor& get(const std::string& name) const;
};

// The artifact of `inputs` for `method`: loaded from cache_dir when a valid file is there, else
// compute() (tensors by name, any float dtype or device) and saved; cache_dir "" keeps it in
// memory only. Throws kvb::Error naming the file when a cached file is corrupt or holds another
// key.
std::shared_ptr<const TensorArtifact> cached_tensor_artifact(
    const std::string& method, const nlohmann::json& inputs, const std::string& cache_dir,
    const std::function<std::map<std::string, at::Tensor>()>& compute);

// The artifact a method calibrates from `text` run through `model`, as cached_tensor_artifact: its
// key is `artifact` (the artifact's name and version), the model's content hash, its tokenizer's,
// the calibration text (calibration_text_json) and `settings`, the method's own parameters that
// decide it (an object whose fields join the key's). Cached in text.cache_dir.
std::shared_ptr<const TensorArtifact> cached_calibration_artifact(
    const std::string& method, const std::string& artifact, const Model& model,
    const CalibrationText& text, nlohmann::json settings,
    const std::function<std::map<std::string, at::Tensor>()>& compute);

// The model's content identity (Model::content_hash: its config, dtype and every weight tensor's
// bytes): two models with equal hashes compute the same thing, whatever their path.
std::string model_content_hash(const Model& model);

// How many artifacts this process computed (not loaded) so far: a test's proof that a second run
// reused the cached file.
int64_t tensor_artifacts_computed();

}  // namespace kvb
