#pragma once
// The protocol contract. A protocol is how a run turns a model and a KV method into samples and
// metrics: a name, a summary, a typed parameter schema (the ParamSpec system methods use), hints
// for the reports, and three steps the runner (runner.h) drives:
//
//   plan        reads and checks everything the run takes from the user (data files, lists,
//   lengths)
//               before the run row exists, so a config that cannot run leaves the database
//               untouched; returns the run's samples (count and content keys);
//   run_sample  computes one sample as JSON (it may read samples stored before it);
//   metrics     the run-level metrics from all stored samples.
//
// The runner owns the rest (skipping stored samples, the key check on resume, one transaction per
// sample, finishing or failing the run). A built-in protocol is one file in harness/eval/protocols/
// that ends with one line:
//
//   KVB_REGISTER_PROTOCOL(stream, StreamProtocol);
//
// Out-of-tree protocols live in plugins (harness/kv/plugin.h) and register in their entry point.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/params.h"
#include "harness/eval/run_env.h"
#include "harness/store/results_db.h"

namespace kvb {

class Model;
struct MethodInfo;
class CalibrationArtifact;

// A metric a protocol's samples support one by one (for paired bootstraps): the run-level value is
// f(sum num_i / sum den_i) over samples i, f the identity or exp (perplexity).
struct SampleMetricDef {
  std::string name;  // as in the metric table ("kl_mean", "ppl", ...)
  std::string unit;
  Direction direction = Direction::kNone;
  std::string source;  // the sums it is computed from ("nll" for ppl); "" = its own name
  bool exp_transform = false;
};

// A per-sample metric with the unit and direction the metric table gives `name` (metric_table.h);
// `source` and `exp_transform` as in SampleMetricDef.
SampleMetricDef table_sample_metric(const std::string& name, const std::string& source = "",
                                    bool exp_transform = false);

// Puts one sample's (num, den) under a source name.
using SampleSumSink = std::function<void(const std::string& source, double num, double den)>;

// How the reports present a protocol's runs (harness/report/leaderboard.h).
struct ProtocolReport {
  // The metrics its samples support one by one, in display order; empty: every task metric of the
  // metric table (task_sample_metrics).
  std::vector<SampleMetricDef> sample_metrics;
  std::string default_metric;  // ranked by when runs have it; "" (or absent): a task metric
  // Shown beside the ranked metric (those that are not it), at most max_secondary of them; when
  // secondary_needs_all_runs, only if every finished run of the table recorded them.
  std::vector<std::string> secondary_metrics;
  size_t max_secondary = std::numeric_limits<size_t>::max();
  bool secondary_needs_all_runs = false;
  std::vector<std::string> always_shown_settings;  // protocol params always named in table titles
  // Per-sample metrics whose full-cache value each sample stores itself (metric -> sums source), so
  // a run can be paired without a full-cache run in its table (qa: accuracy -> full_accuracy).
  std::map<std::string, std::string> paired_in_sample;
  bool shows_top1 = false;  // a top-1 agreement column (top1_agreement) when not ranked by it
  // Runs are deterministic (one simulation each): differences are exact, no interval; this note
  // says so.
  std::string exact_delta_note;
  bool measures_throughput = false;  // its decode_tok_s fills the other tables' throughput column
  int table_order = 0;               // tables sort by it first (accuracy 0, speed 1, serving 2)
  // False for a protocol that measures the workload rather than the methods (profile): the
  // leaderboard leaves its runs out.
  bool ranks_methods = true;
};

struct ProtocolInfo {
  std::string name;     // unique, [a-z0-9_]+
  std::string summary;  // one line
  std::vector<ParamSpec> params;
  bool needs_tokenizer = false;  // the run's model must have one (text protocols)
  ProtocolReport report;
  std::string origin = "builtin";  // builtin | plugin:<path>
};

// What a protocol's run is given. `resolved` is the whole resolved run config.
struct RunContext {
  const nlohmann::json& resolved;
  std::shared_ptr<Model> model;
  const MethodInfo& method;
  const nlohmann::json& method_params;  // resolved against the method's schema
  const RunEnv& env;
  // The method's calibration artifact for this run (computed before plan); null when it has none.
  // Caches built for the run carry it in CacheContext::calibration.
  std::shared_ptr<const CalibrationArtifact> calibration;

  const nlohmann::json& protocol() const { return resolved.at("protocol"); }
  uint64_t seed() const { return resolved.at("seed").get<uint64_t>(); }
  void log(const std::string& line) const {
    if (env.log) env.log(line);
  }
};

// The samples of the run so far, as the database holds them.
class StoredSamples {
 public:
  virtual ~StoredSamples() = default;
  virtual std::vector<nlohmann::json> outputs() const = 0;  // every stored sample, by index
  virtual nlohmann::json output(int64_t index) const = 0;   // throws when not stored
};

struct SampleOutput {
  nlohmann::json json;  // what the database stores
  std::string log;      // a progress line ("" for none)
};

// One planned run: its inputs are read and checked; samples are computed one by one.
class ProtocolRun {
 public:
  virtual ~ProtocolRun() = default;
  virtual int64_t samples() const = 0;
  // A sample's content key: a resumed run whose stored key differs was computed on other data.
  virtual std::string sample_key(int64_t index) const = 0;
  virtual SampleOutput run_sample(int64_t index, const StoredSamples& stored) = 0;
  virtual std::vector<Metric> metrics(const StoredSamples& stored) const = 0;
};

// What a grid knows of a cell's model before any weights load: read from its config and tokenizer
// files (harness/model/model.h read_model_config), so that settings are checked against the model
// the way a run's plan checks them against the loaded one.
struct ModelFacts {
  std::string spec;            // the config's "model"
  int64_t context_tokens = 0;  // the context it declares (ModelConfig::max_seq_len)
  std::string tokenizer_path;  // "" when it has none
  bool add_bos = true;         // a prompt gets BOS in front (ModelConfig::add_bos)
};

// Calls `check` once per input a grid can verify before anything runs; `what` names the input (the
// grid checks each one once), `fn` throws kvb::Error when it is missing or bad.
using InputCheck = std::function<void(const std::string& what, const std::function<void()>& fn)>;

class Protocol {
 public:
  virtual ~Protocol() = default;
  virtual ProtocolInfo info() const = 0;
  // Reads and validates the run's inputs; throws kvb::Error naming the input. Writes nothing.
  virtual std::unique_ptr<ProtocolRun> plan(const RunContext& ctx) const = 0;

  // The dataset a run is filed under in the results store (leaderboards group by it), from the
  // resolved protocol parameters: by default config.protocol.dataset, else "synthetic".
  virtual std::string dataset_label(const nlohmann::json& protocol) const;
  // An upper bound of a run's samples, for grid progress. Throws kvb::Error on a bad parameter.
  virtual int64_t expected_samples(const nlohmann::json& protocol) const;
  // Whether the prompts a run prefills end with their question and the cache is told where it
  // starts (QuestionAwareCache), which methods with MethodCaps::needs_question require.
  virtual bool prompt_holds_question(const nlohmann::json& protocol) const { return false; }
  // Whether a run prefills each context alone and, before any question, hands a store that has
  // one its context pass (ContextPassCache), which methods with MethodCaps::needs_context_pass
  // require.
  virtual bool runs_context_pass(const nlohmann::json& protocol) const { return false; }
  // Whether a run prefills each prompt alone and, before its end-of-prefill compression, hands a
  // store that has one the continuation it will score (HindsightCache), which methods with
  // MethodCaps::needs_hindsight (oracles) require.
  virtual bool hands_hindsight(const nlohmann::json& protocol) const { return false; }
  // The cheap inputs (data files, traces) a grid checks before its first run.
  virtual void check_inputs(const nlohmann::json& protocol, const std::string& data_dir,
                            const InputCheck& check) const;
  // What a cell's settings need of its model (a length within its context; a task's minimum length
  // with its tokenizer), checked by the grid before its first run with the checks the run's plan
  // makes against the loaded model; `resolved` is the whole run config. Quick and writes nothing.
  // Default: nothing to check.
  virtual void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                                  const std::string& data_dir, const InputCheck& check) const;

  // Called by resolve_run_config once config.protocol is resolved against info().params: `given`
  // is config.protocol as written (without "name"), `resolved` has every default filled in. A
  // protocol refuses here what its schema cannot say (a key one setting requires; a key that does
  // not apply to the chosen setting: kvb::Error naming the key) and drops the parameters that do
  // not apply, so that they stay out of the config hash. Default: `resolved` as it is.
  virtual nlohmann::json finish_config(const nlohmann::json& given, nlohmann::json resolved) const;

  // One stored sample's sums per source name (report.sample_metrics); by default task_sample_sums.
  // A sample's "ledger" object adds bytes_per_token for every protocol (sample_stats.h).
  virtual void sample_sums(const nlohmann::json& sample, const SampleSumSink& put) const;
};

// config.protocol.<key> as a comma-separated list of integers in [min, max]; `what` names one item
// ("batch size"). Throws kvb::Error naming the key and the item.
std::vector<int64_t> protocol_int_list(const nlohmann::json& protocol, const std::string& key,
                                       const std::string& what, int64_t min, int64_t max);

// j[key] when it is a number, else `fallback` (samples from foreign or older files may lack it).
double sample_number(const nlohmann::json& j, const char* key, double fallback = 0.0);

// Every task metric of the metric table (the fractions), and a sample's values of them: numbers
// under "scores" or at the top level.
const std::vector<SampleMetricDef>& task_sample_metrics();
void task_sample_sums(const nlohmann::json& sample, const SampleSumSink& put);

}  // namespace kvb
