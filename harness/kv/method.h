#pragma once
// The method contract. A KV method is a name, a summary, its paper, a typed parameter schema and
// capability flags, plus a factory that builds the method's KvCache (kv_cache.h) for one run: the cache
// owns the per-layer state and serves every sequence of a batch. A method registers itself with one line
// at the end of its .cpp:
//
//   KVB_REGISTER_METHOD(paged, paged_info, make_paged);
//
// Out-of-tree methods live in shared libraries loaded with `kvbench --plugin lib.so` (plugin.h).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/common/params.h"
#include "harness/formats/model_config.h"
#include "harness/kv/calibration.h"
#include "harness/kv/kv_cache.h"

namespace kvb {

class Model;

struct MethodCaps {
  bool evicts = false;             // drops tokens (policy)
  bool quantizes = false;          // stores fewer bits per kept element (codec)
  bool tiers = false;              // moves KV between device/host/remote
  bool needs_calibration = false;  // computes an artifact from the run's model first (calibration.h)
  bool query_aware = false;        // uses the question/observation window to compress
  // Scores by the question itself, so it runs only where a protocol prefills the context and its
  // question together and says where the question starts (QuestionAwareCache: qa query_aware);
  // a run config pairing it with any other protocol is refused before anything runs (Finch).
  bool needs_question = false;
  // Runs its own pass over the context before any question (ContextPassCache: KVzip asks the model
  // to repeat the context), so it runs only where a protocol hands the store that pass (qa
  // query_agnostic); a run config pairing it with any other protocol is refused before anything runs.
  bool needs_context_pass = false;
  // Compresses the prompt with hindsight of the run's continuation (HindsightCache: oracle_evict),
  // so it runs only where a protocol hands the store that continuation (stream; qa
  // query_agnostic); a run config pairing it with any other protocol is refused before anything
  // runs.
  bool needs_hindsight = false;
  bool simulated = false;          // declares that it saves nothing physically (masks only)
  // A bound, not a deployable method: it uses what no real system has at that point (the future
  // continuation's attention, the exact score of every key); the leaderboard marks it and never
  // ranks it, and measures each deployable method's headroom against it.
  bool oracle = false;
  bool supports_fork = true;
  // Where the store runs. A store written for the host says so here rather than in its constructor:
  // a config asking for another device or dtype is then refused when it is resolved (kvbench run,
  // grid validation), before anything runs, instead of failing cell by cell.
  bool cpu_only = false;   // device cpu only
  bool fp32_only = false;  // dtype fp32 only
};

// The device and compute dtype a config asks a method's store to run on.
struct RunTarget {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
};

// Where a parameter narrows the targets (a codec that stores rows on the host, a CUDA decode kernel):
// "" when the resolved parameters run on `target`, otherwise the reason, naming the parameter.
using TargetCheck =
    std::function<std::string(const nlohmann::json& params, const RunTarget& target)>;

struct MethodInfo {
  std::string name;     // unique, [a-z0-9_]+
  std::string summary;  // one line
  std::string paper;    // citation or arXiv id; "" for engineering baselines
  std::vector<ParamSpec> params;
  MethodCaps caps;
  TargetCheck target_check;        // null: the caps alone decide where the method runs
  std::string origin = "builtin";  // builtin | plugin:<path>
};

// What a cache is built for: the model's shapes, where compute happens and in which dtype.
struct CacheContext {
  CacheContext() = default;
  // The shapes, device and dtype a cache is built for, and the run's model where there is one.
  CacheContext(ModelConfig c, c10::Device d, c10::ScalarType t, std::shared_ptr<Model> m = nullptr)
      : config(std::move(c)), device(d), dtype(t), model(std::move(m)) {}
  ModelConfig config;
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;  // the model's compute dtype (the uncompressed baseline)
  // The run's model, for a method that calibrates on it (MethodRegistry::create then runs the
  // method's Calibrator when `calibration` is null). Null where a store is built without a model
  // (tests of a store alone); a calibrating method then refuses to build.
  std::shared_ptr<Model> model;
  // What the method's Calibrator produced for this run (the runner computes it before the first
  // sample); null for methods that do not calibrate.
  std::shared_ptr<const CalibrationArtifact> calibration;
};

// params: the method's parameters, already validated and resolved against its schema.
using CacheFactory =
    std::function<std::unique_ptr<KvCache>(const CacheContext& ctx, const nlohmann::json& params)>;


nlohmann::json method_info_json(const MethodInfo& info);

}  // namespace kvb
