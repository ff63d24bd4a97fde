#include "methods/common/tensor_artifact.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/formats/safetensors.h"
#include "harness/formats/safetensors_writer.h"
#include "harness/model/model.h"
#include "methods/common/calibration_text.h"

namespace kvb {

namespace {

constexpr const char* kMetaKey = "kvb_calibration";

std::atomic<int64_t> g_computed{0};

void make_dirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if ((i == dir.size() || dir[i] == '/') && !cur.empty()) ::mkdir(cur.c_str(), 0755);
    if (i < dir.size()) cur += dir[i];
  }
}

// sha256 over the tensors in name order: name, shape, bytes.
std::string payload_hash(const std::map<std::string, at::Tensor>& tensors) {
  Sha256 h;
  for (const auto& [name, t] : tensors) {
    h.update(name);
    for (int64_t s : t.sizes()) h.update(&s, sizeof(s));
    h.update(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  return h.hex_digest();
}

std::shared_ptr<TensorArtifact> load(const std::string& path, const std::string& key) {
  SafetensorsFile f(path);  // a malformed file throws naming the path
  auto it = f.metadata().find(kMetaKey);
  KVB_CHECK(it != f.metadata().end(), path, ": not a kvbench calibration artifact (no '", kMetaKey,
            "' metadata); delete it to recalibrate");
  const nlohmann::json head = parse_json(it->second, path + ": calibration metadata");
  auto a = std::make_shared<TensorArtifact>();
  try {
    a->method = head.at("method").get<std::string>();
    a->key = head.at("key").get<std::string>();
    a->meta = head.at("inputs");
  } catch (const nlohmann::json::exception& e) {
    KVB_FAIL(path, ": calibration metadata lacks a field (", e.what(), "); delete it to recalibrate");
  }
  KVB_CHECK(a->key == key, path, ": holds calibration artifact ", a->key, ", expected ", key,
            "; delete it to recalibrate");
  for (const auto& [name, t] : f.tensors()) {
    KVB_CHECK(t.dtype == StDtype::kF32, path, ": calibration tensor ", name, " is not F32");
    at::Tensor out = at::empty(t.shape, at::kFloat);
    KVB_CHECK(static_cast<size_t>(out.nbytes()) == t.nbytes, path, ": tensor ", name, " size");
    std::memcpy(out.data_ptr(), t.data, t.nbytes);
    a->tensors[name] = out;
  }
  const std::string got = payload_hash(a->tensors);
  const std::string want = head.value("payload_sha256", "");
  KVB_CHECK(got == want, path, ": calibration artifact is corrupt (payload sha256 ", got,
            ", recorded ", want.empty() ? "nothing" : want, "); delete it to recalibrate");
  a->path = path;
  a->file_bytes = static_cast<int64_t>(MappedFile(path).size());
  a->from_cache = true;
  return a;
}

void save(const TensorArtifact& a, const std::string& path) {
  std::vector<StWriteEntry> entries;
  for (const auto& [name, t] : a.tensors)
    entries.push_back({name, StDtype::kF32, t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.nbytes())});
  const nlohmann::json head = {{"method", a.method},
                               {"key", a.key},
                               {"inputs", a.meta},
                               {"payload_sha256", payload_hash(a.tensors)}};
  make_dirs(path.substr(0, path.find_last_of('/')));
  // Atomic, with a temporary file of this process's own: two processes calibrating at once never
  // collide, and a full disk leaves nothing behind.
  write_safetensors(path, entries, {{kMetaKey, head.dump()}});
}

}  // namespace

const at::Tensor& TensorArtifact::get(const std::string& name) const {
  auto it = tensors.find(name);
  KVB_CHECK(it != tensors.end(), path.empty() ? "calibration artifact " + key : path,
            ": no tensor '", name, "' (written by another version of method ", method,
            "?); delete it to recalibrate");
  return it->second;
}

std::shared_ptr<const TensorArtifact> cached_tensor_artifact(
    const std::string& method, const nlohmann::json& inputs, const std::string& cache_dir,
    const std::function<std::map<std::string, at::Tensor>()>& compute) {
  const std::string key = sha256_hex(inputs.dump());
  const std::string path = cache_dir.empty() ? "" : cache_dir + "/" + method + "-" + key + ".safetensors";
  if (!path.empty() && file_exists(path)) return load(path, key);
  const auto t0 = std::chrono::steady_clock::now();
  auto a = std::make_shared<TensorArtifact>();
  a->method = method;
  a->key = key;
  a->meta = inputs;
  for (auto& [name, t] : compute()) a->tensors[name] = t.to(at::kCPU).to(at::kFloat).contiguous();
  a->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  g_computed++;
  if (!path.empty()) {
    save(*a, path);
    a->path = path;
    a->file_bytes = static_cast<int64_t>(MappedFile(path).size());
  }
  return a;
}

std::shared_ptr<const TensorArtifact> cached_calibration_artifact(
    const std::string& method, const std::string& artifact, const Model& model,
    const CalibrationText& text, nlohmann::json settings,
    const std::function<std::map<std::string, at::Tensor>()>& compute) {
  KVB_ASSERT(settings.is_object(), method, "calibration settings are not a JSON object");
  nlohmann::json inputs = std::move(settings);
  inputs["artifact"] = artifact;
  inputs["model"] = model_content_hash(model);
  inputs["tokenizer"] = model.tokenizer_hash();  // it cuts the calibration text into tokens
  inputs["text"] = calibration_text_json(text);
  return cached_tensor_artifact(method, inputs, text.cache_dir, compute);
}

std::string model_content_hash(const Model& m) { return m.content_hash(); }

int64_t tensor_artifacts_computed() { return g_computed.load(); }

}  // namespace kvb
