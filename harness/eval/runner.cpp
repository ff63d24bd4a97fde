#include "harness/eval/runner.h"

#include <map>
#include <mutex>

#include <ATen/Parallel.h>
#include <torch/csrc/api/include/torch/version.h>

#include <chrono>
#include <optional>

#include "harness/common/disk_full_error.h"
#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/sha256.h"
#include "harness/engine/thread_policy.h"
#include "harness/eval/ledger.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/run_config.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "harness/model/model_files.h"
#include "harness/store/config_hash.h"
#include "harness/store/lease_heartbeat.h"
#include "harness/store/provenance.h"

#ifndef KVB_SOURCE_DIR
#define KVB_SOURCE_DIR "."
#endif

namespace kvb {

namespace {

// The run's stored samples, parsed as the protocol reads them.
class DbSamples : public StoredSamples {
 public:
  DbSamples(ResultsDb& db, int64_t run_id) : db_(db), run_id_(run_id) {}
  std::vector<nlohmann::json> outputs() const override {
    std::vector<nlohmann::json> out;
    for (const auto& s : db_.samples(run_id_)) out.push_back(parse(s));
    return out;
  }
  nlohmann::json output(int64_t index) const override {
    for (const auto& s : db_.samples(run_id_))
      if (s.index == index) return parse(s);
    KVB_FAIL("run ", run_id_, ": sample ", index, " is not stored");
  }

 private:
  nlohmann::json parse(const SampleRow& s) const {
    return parse_json(s.output_json, "run " + std::to_string(run_id_) + " sample");
  }
  ResultsDb& db_;
  int64_t run_id_;
};

[[noreturn]] void throw_held(const std::string& config_hash, int64_t run_id,
                             const std::string& holder) {
  throw RunHeldElsewhere(
      "run " + config_hash.substr(0, 12) + " (id " + std::to_string(run_id) + ") is held by " +
          holder +
          ", which is computing it; it is left to that process (kvbench grid waits for "
          "it; a run whose holder is gone is taken over)",
      holder);
}

std::string provenance_json(const RunEnv& env, const Model& m) {
  Provenance p = collect_provenance(env.source_dir.empty() ? KVB_SOURCE_DIR : env.source_dir);
  if (!p.checkout_git_commit.empty() && env.log)
    env.log("warning: this binary was built from commit " + p.git_commit + " but the checkout is at " +
            p.checkout_git_commit + " (both recorded in the run's provenance; rebuild to run the checkout's code)");
  nlohmann::json j = p.to_json();
  j["libtorch_version"] = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH);
  j["device_name"] = m.device.str();
  j["model_source"] = m.source;
  // What the results were computed from: a later run of the same config (whose hash names the model
  // by path) checks them before it skips or resumes this run.
  j["model_content"] = m.content_hash();
  j["model_files"] = model_files_identity(m.source, "");
  j["threads"] = at::get_num_threads();
  return j.dump();
}

// The model content a stored run recorded ("" when it predates the record).
std::string recorded_model_content(const RunRow& run) {
  const nlohmann::json p = nlohmann::json::parse(run.provenance_json, nullptr, false);
  if (!p.is_object() || !p.contains("model_content") || !p["model_content"].is_string()) return "";
  return p["model_content"].get<std::string>();
}

[[noreturn]] void throw_other_weights(const RunRow& run, const std::string& model, const std::string& then,
                                      const std::string& now, const char* what) {
  KVB_FAIL("run ", run.config_hash.substr(0, 12), " (id ", run.id, ") ", what, " model ", model,
           " with other weights (content ", then, " then, ", now,
           " now: the checkpoint was replaced in place); its results would stand for a model that is "
           "gone. Use another --db for the new weights (a run's config names its model by path)");
}

// Stored samples of an unfinished run are resumed only onto the weights that computed them.
void check_resumed_run_model(const RunRow& run, const std::string& spec, const Model& model) {
  const std::string then = recorded_model_content(run);
  if (!then.empty() && then != model.content_hash())
    throw_other_weights(run, spec, then, model.content_hash(), "holds samples computed from");
}

LoadOptions load_options(const nlohmann::json& resolved, const RunEnv& env) {
  LoadOptions lo;
  lo.device = resolved["device"];
  lo.dtype = resolved["dtype"];
  lo.models_dir = env.models_dir;
  lo.synthetic_seed = resolved["seed"].get<uint64_t>();
  return lo;
}

// The model of a run: the process's last one when the run asks for the same files (size, inode,
// times), device, dtype and options, else loaded (and kept in its place). A grid's cells on one
// model load it once; holding one model bounds the memory.
std::shared_ptr<Model> run_model(const nlohmann::json& resolved, const RunEnv& env) {
  static std::mutex mu;
  static std::string last_key;
  static std::shared_ptr<Model> last;
  const std::string spec = resolved["model"];
  const LoadOptions lo = load_options(resolved, env);
  const std::string key = resolve_model_path(spec, env.models_dir) + "|" +
                          model_files_identity(spec, env.models_dir) + "|" + lo.device + "|" +
                          lo.dtype + "|" + std::to_string(lo.synthetic_seed) + "|" +
                          std::to_string(lo.rope_table_len);
  std::lock_guard<std::mutex> lock(mu);
  if (last && key == last_key) return last;
  last.reset();  // before loading the next one: never two models at once
  last = load_model(spec, lo);
  last_key = key;
  return last;
}

// A finished run is skipped only while its model is the one it was computed from: when the model's
// files changed since (size, times, inode), the model is loaded and its content compared.
void check_done_run_model(const RunRow& run, const nlohmann::json& resolved, const RunEnv& env) {
  const nlohmann::json p = nlohmann::json::parse(run.provenance_json, nullptr, false);
  if (!p.is_object() || !p.contains("model_files") || !p["model_files"].is_string()) return;
  const std::string model = resolved["model"];
  if (model_files_identity(model, env.models_dir) == p["model_files"].get<std::string>()) return;
  const std::string then = recorded_model_content(run);
  // A grid meets the same model in many finished cells (a DB copied from another machine: other
  // inodes, the same bytes): it is loaded and hashed once per process.
  static std::mutex mu;
  static std::map<std::string, std::string> content_by_files;
  const std::string files = model_files_identity(model, env.models_dir) + "|" + resolved["dtype"].get<std::string>();
  std::string now;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = content_by_files.find(files);
    if (it != content_by_files.end()) now = it->second;
  }
  if (now.empty()) {
    now = load_model(model, load_options(resolved, env))->content_hash();
    std::lock_guard<std::mutex> lock(mu);
    content_by_files[files] = now;
  }
  if (!then.empty() && then != now) throw_other_weights(run, model, then, now, "was computed from");
}

// Computes the run's samples that are not stored yet, each in its own transaction; a stored one is
// checked against the plan's key. False when env.sample_limit stopped it first (the run stays open:
// the lease ends with the caller's heartbeat, and the next call resumes).
bool run_samples(ProtocolRun& plan, const StoredSamples& stored, ResultsDb& db, int64_t run_id,
                 const RunEnv& env, RunOutcome& out) {
  const std::map<int64_t, std::string> done = db.done_sample_keys(run_id);
  out.samples_total = plan.samples();
  for (int64_t i = 0; i < out.samples_total; ++i) {
    if (env.sample_limit >= 0 && i >= env.sample_limit) {
      out.unfinished = true;
      return false;
    }
    const std::string key = plan.sample_key(i);
    if (auto it = done.find(i); it != done.end()) {
      KVB_CHECK(it->second == key, "run ", run_id, ": stored sample ", i,
                " was computed on different data (key mismatch); delete the run to redo it");
      continue;
    }
    SampleOutput sample = plan.run_sample(i, stored);
    db.add_sample(run_id, i, key, sample.json.dump());
    out.samples_computed++;
    if (!sample.log.empty() && env.log) env.log(sample.log);
  }
  return true;
}

}  // namespace

RunOutcome execute_run(const nlohmann::json& resolved, ResultsDb& db, const RunEnv& env) {
  auto log = [&](const std::string& s) {
    if (env.log) env.log(s);
  };
  RunOutcome out;
  out.config_hash = run_config_hash(resolved);
  const std::string method = resolved["method"]["name"];
  const nlohmann::json method_params = resolved["method"]["params"];
  const std::string protocol_name = resolved["protocol"]["name"];
  const Protocol& protocol = ProtocolRegistry::instance().get(protocol_name);
  const ProtocolInfo& protocol_info = ProtocolRegistry::instance().info(protocol_name);
  const MethodInfo& method_info = MethodRegistry::instance().info(method);

  // Cheap checks first, so a bad model name fails before anything is written.
  resolve_model_path(resolved["model"], env.models_dir);

  RunSpec spec;
  spec.config_hash = out.config_hash;
  spec.config_json = canonical_json(resolved);
  spec.method = method;
  spec.model = resolved["model"];
  spec.protocol = protocol_name;
  spec.dataset = run_dataset_label(resolved);
  spec.grid = env.grid;
  spec.simulated = method_info.caps.simulated;

  const std::optional<RunRow> existing = db.find_run_by_hash(out.config_hash);
  if (existing && existing->status == RunStatus::kDone) {
    check_done_run_model(*existing, resolved, env);
    out.run_id = existing->id;
    out.skipped = true;
    out.metrics = db.metrics(existing->id);
    log("run " + out.config_hash.substr(0, 12) + " already done (id " + std::to_string(existing->id) + "): skipped");
    return out;
  } else if (existing && existing->status == RunStatus::kRunning) {
    // Another live process computing it: skip before loading anything (begin_run checks again).
    if (auto held = db.lease(existing->id); held && held->live && !held->ours)
      throw_held(out.config_hash, existing->id, held->describe());
  }

  const auto t0 = std::chrono::steady_clock::now();
  int64_t run_id = 0;
  try {
    apply_thread_policy(resolved["threads"].get<int>());
    std::shared_ptr<Model> model = run_model(resolved, env);
    if (existing) check_resumed_run_model(*existing, resolved["model"], *model);
    // A calibrating method computes (or loads) its artifact before the first sample, so a failure
    // (missing calibration text, a corrupt cached file) is one line before the run row exists, and
    // the run records which artifact it ran with.
    std::shared_ptr<const CalibrationArtifact> calibration =
        MethodRegistry::instance().calibrate(method, model, method_params);
    nlohmann::json prov = parse_json(provenance_json(env, *model), "provenance");
    if (calibration) {
      log("method " + method + ": calibration " + calibration->key.substr(0, 12) +
          (calibration->from_cache ? " loaded from " : " computed, saved to ") +
          (calibration->path.empty() ? std::string("(memory only)") : calibration->path));
      prov["calibration"] = {{"method", calibration->method},
                             {"key", calibration->key},
                             {"path", calibration->path},
                             {"from_cache", calibration->from_cache},
                             {"seconds", calibration->seconds}};
    }
    spec.provenance_json = prov.dump();

    // Everything the protocol reads from the user (data files, lists, depths, lengths, targets) is
    // read and checked by its plan, before the run row exists: a config that cannot run fails with
    // one line and leaves the database as it was, instead of as a failed run (or a "done" run of 0
    // samples).
    KVB_CHECK(!protocol_info.needs_tokenizer || !model->tokenizer_path.empty(), model->source,
              ": the ", protocol_name, " protocol needs a tokenizer");
    // A method checks what depends on the model or on several parameters at once (a kept ratio
    // above 1, a budget in the wrong unit) when its store is built: build one here, so that such a
    // config also fails before the run row exists.
    {
      CacheContext check_ctx{model->config, model->device, model->dtype, model};
      check_ctx.calibration = calibration;
      MethodRegistry::instance().create(method, check_ctx, method_params);
    }
    const RunContext ctx{resolved, model, method_info, method_params, env, calibration};
    std::unique_ptr<ProtocolRun> plan = protocol.plan(ctx);

    RunInfo info = db.begin_run(spec);
    out.run_id = info.id;
    if (info.already_done) {  // another process finished it meanwhile
      out.skipped = true;
      out.metrics = db.metrics(info.id);
      return out;
    }
    if (!info.held_by.empty()) throw_held(out.config_hash, info.id, info.held_by);
    run_id = info.id;  // from here on this process holds the run: a failure is recorded as its own
    std::optional<LeaseHeartbeat> heartbeat(std::in_place, db, run_id);
    if (!info.taken_over_from.empty())
      log("taking over run " + std::to_string(run_id) + " from " + info.taken_over_from);
    if (calibration && !calibration->path.empty()) {
      Artifact row;
      row.hash = sha256_file_hex(calibration->path);
      row.kind = "calibration";
      row.path = calibration->path;
      row.bytes = calibration->file_bytes;
      row.meta_json = nlohmann::json{{"method", calibration->method},
                                     {"key", calibration->key},
                                     {"config_hash", out.config_hash},
                                     {"inputs", calibration->meta}}
                          .dump();
      db.put_artifact(row);
    }
    if (info.resumed) log("resuming run " + std::to_string(run_id) + " with " + std::to_string(info.done_samples) + " samples done");

    const DbSamples stored(db, run_id);
    if (!run_samples(*plan, stored, db, run_id, env, out)) return out;  // a grid's window ends here
    out.metrics = plan->metrics(stored);
    for (auto& m : device_allocator_metrics(resolved["device"])) out.metrics.push_back(m);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    heartbeat.reset();
    db.finish_run(run_id, out.metrics, wall);
    return out;
  } catch (const RunHeldElsewhere&) {
    throw;  // the run is another process's: neither skipped as done nor failed by this one
  } catch (const std::exception& e) {
    if (run_id > 0) {
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool recorded = false;
      try {
        db.fail_run(run_id, e.what(), wall);
        recorded = true;
      } catch (...) {
      }
      // A full disk may refuse the failure record too: the run keeps its 'running' row, and its
      // lease dies with this process, so the next run or grid takes it over from its samples.
      if (!recorded && dynamic_cast<const DiskFullError*>(&e) != nullptr)
        throw DiskFullError(std::string(e.what()) + "; run " + std::to_string(run_id) +
                            " stays 'running' and resumes from its stored samples on the next "
                            "kvbench run or grid");
    }
    throw;
  }
}

}  // namespace kvb
