#include "harness/engine/thread_policy.h"
#include "harness/eval/runner.h"

#include <ATen/Parallel.h>
#include <torch/csrc/api/include/torch/version.h>

#include <chrono>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/strings.h"
#include "harness/eval/ledger.h"
#include "harness/eval/perf.h"
#include "harness/eval/probe.h"
#include "harness/eval/qa.h"
#include "harness/eval/serve.h"
#include "datasets/corpus.h"
#include "harness/formats/tokenizer.h"
#include "harness/eval/run_config.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "harness/store/config_hash.h"
#include "harness/store/provenance.h"

#ifndef KVB_SOURCE_DIR
#define KVB_SOURCE_DIR "."
#endif

namespace kvb {

namespace {

// A comma-separated list of integers in [min, max] from config.protocol.<key>; `what` names one.
std::vector<int64_t> parse_int_list(const std::string& s, const char* key, const char* what,
                                    int64_t min, int64_t max) {
  std::vector<int64_t> out;
  for (const std::string& item : split(s, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    KVB_CHECK(!item.empty() && end && *end == '\0' && v >= min && v <= max, "config.protocol.", key,
              ": '", item, "' is not a ", what, " in [", min, ", ", max, "]");
    out.push_back(v);
  }
  return out;
}

std::string provenance_json(const RunEnv& env, const Model& m) {
  Provenance p = collect_provenance(env.source_dir.empty() ? KVB_SOURCE_DIR : env.source_dir);
  nlohmann::json j = p.to_json();
  j["libtorch_version"] = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH);
  j["device_name"] = m.device.str();
  j["model_source"] = m.source;
  j["threads"] = at::get_num_threads();
  return j.dump();
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
  const nlohmann::json& proto = resolved["protocol"];
  const std::string protocol = proto["name"];
  const bool declared_simulated = MethodRegistry::instance().info(method).caps.simulated;

  // Cheap checks first, so a bad model name fails before anything is written.
  resolve_model_path(resolved["model"], env.models_dir);

  RunSpec spec;
  spec.config_hash = out.config_hash;
  spec.config_json = canonical_json(resolved);
  spec.method = method;
  spec.model = resolved["model"];
  spec.protocol = protocol;
  spec.dataset = run_dataset_label(resolved);
  spec.grid = env.grid;
  spec.simulated = declared_simulated;

  if (auto existing = db.find_run_by_hash(out.config_hash); existing && existing->status == RunStatus::kDone) {
    out.run_id = existing->id;
    out.skipped = true;
    out.metrics = db.metrics(existing->id);
    log("run " + out.config_hash.substr(0, 12) + " already done (id " + std::to_string(existing->id) + "): skipped");
    return out;
  }

  const auto t0 = std::chrono::steady_clock::now();
  int64_t run_id = 0;
  try {
    apply_thread_policy(resolved["threads"].get<int>());
    LoadOptions lo;
    lo.device = resolved["device"];
    lo.dtype = resolved["dtype"];
    lo.models_dir = env.models_dir;
    lo.synthetic_seed = resolved["seed"].get<uint64_t>();
    auto model = load_model(resolved["model"], lo);
    spec.provenance_json = provenance_json(env, *model);

    // Everything the protocol reads from the user (data files, lists, depths, lengths, targets) is
    // read and checked here, before the run row exists: a config that cannot run fails with one line
    // and leaves the database as it was, instead of as a failed run (or a "done" run of 0 samples).
    const bool needs_tokenizer = protocol == "stream" || protocol == "probe" || protocol == "qa" || protocol == "serve";
    KVB_CHECK(!needs_tokenizer || !model->tokenizer_path.empty(), model->source, ": the ", protocol,
              " protocol needs a tokenizer");
    std::string dataset_hash;
    std::vector<StreamWindow> windows;  // stream, probe; serve's footprint text
    std::unique_ptr<Tokenizer> qa_tok;
    std::vector<QaSample> qa_set;
    std::vector<int64_t> int_list;  // perf: batch sizes; serve: probe lengths
    if (protocol == "stream" || protocol == "probe") {
      const int64_t window = proto["window"];
      KVB_CHECK(window <= model->config.max_seq_len, "config.protocol.window: ", window,
                " tokens is longer than the model's context of ", model->config.max_seq_len,
                " (max_position_embeddings of ", model->source, ")");
      windows = stream_windows(model->tokenizer_path, proto, env.data_dir, &dataset_hash);
      KVB_CHECK(!windows.empty(), "config.protocol.dataset: '", proto["dataset"].get<std::string>(),
                "' yields no window of ", window, " tokens");
    } else if (protocol == "qa") {
      qa_tok = std::make_unique<Tokenizer>(model->tokenizer_path);
      nlohmann::json p = proto;
      p["seed"] = resolved["seed"];
      qa_set = qa_samples(*qa_tok, p, env.data_dir, env.cache_dir, &dataset_hash);
      KVB_CHECK(!qa_set.empty(), "config.protocol: the qa source '", proto["source"].get<std::string>(),
                "' yields no samples");
    } else if (protocol == "perf") {
      int_list = parse_int_list(proto["batch_sizes"], "batch_sizes", "batch size", 1, 4096);
    } else if (protocol == "serve") {
      const int64_t decode = proto["probe_decode_tokens"];
      int_list = parse_int_list(proto["probe_lengths"], "probe_lengths", "length", 2,
                                model->config.max_seq_len - decode);
      check_serve_inputs(proto, resolve_data_dir(env.data_dir));
      nlohmann::json wp = {{"dataset", proto["dataset"]}, {"stride", 0}, {"max_windows", 1},
                           {"window", *std::max_element(int_list.begin(), int_list.end())}};
      windows = stream_windows(model->tokenizer_path, wp, env.data_dir, &dataset_hash);
      KVB_CHECK(!windows.empty(), proto["dataset"].get<std::string>(), ": no text for the footprint probe");
    }

    RunInfo info = db.begin_run(spec);
    run_id = info.id;
    out.run_id = run_id;
    if (info.already_done) {  // another process finished it meanwhile
      out.skipped = true;
      out.metrics = db.metrics(run_id);
      return out;
    }
    if (info.resumed) log("resuming run " + std::to_string(run_id) + " with " + std::to_string(info.done_samples) + " samples done");
    const std::set<int64_t> done = db.done_sample_indices(run_id);

    if (protocol == "stream") {
      out.samples_total = static_cast<int64_t>(windows.size());
      StreamOptions so;
      so.prefill_tokens = proto["prefill_tokens"];
      so.prefill_chunk = proto["prefill_chunk"];
      so.cache_dir = env.cache_dir;
      const auto keys = db.done_sample_keys(run_id);
      for (size_t i = 0; i < windows.size(); ++i) {
        const int64_t idx = static_cast<int64_t>(i);
        if (done.count(idx)) {
          KVB_CHECK(keys.at(idx) == windows[i].key, "run ", run_id, ": stored sample ", idx,
                    " was computed on different data (key mismatch); delete the run to redo it");
          continue;
        }
        StreamSampleResult r = run_stream_sample(model, method, method_params, windows[i].tokens, so);
        nlohmann::json j = r.to_json();
        j["dataset_hash"] = dataset_hash;
        db.add_sample(run_id, idx, windows[i].key, j.dump());
        out.samples_computed++;
        log("sample " + std::to_string(i + 1) + "/" + std::to_string(windows.size()) + ": nll " +
            std::to_string(r.nll_sum / std::max<int64_t>(1, r.tokens)) + " kl_mean " +
            std::to_string(r.tokens ? [&] { double s = 0; for (float k : r.kl) s += k; return s / r.tokens; }() : 0.0));
      }
      std::vector<StreamSampleResult> all;
      for (const auto& s : db.samples(run_id)) all.push_back(StreamSampleResult::from_json(parse_json(s.output_json, "run " + std::to_string(run_id) + " sample")));
      out.metrics = stream_metrics(all, declared_simulated);
    } else if (protocol == "probe") {
      out.samples_total = static_cast<int64_t>(windows.size());
      ProbeOptions po;
      po.prefill_tokens = proto["prefill_tokens"];
      po.every = proto["every"];
      for (size_t i = 0; i < windows.size(); ++i) {
        const int64_t idx = static_cast<int64_t>(i);
        if (done.count(idx)) continue;
        auto r = run_probe_sample(model, method, method_params, windows[i].tokens, po);
        db.add_sample(run_id, idx, windows[i].key, r.to_json().dump());
        out.samples_computed++;
      }
      std::vector<ProbeSampleResult> all;
      for (const auto& s : db.samples(run_id)) all.push_back(ProbeSampleResult::from_json(parse_json(s.output_json, "run " + std::to_string(run_id) + " sample")));
      out.metrics = probe_metrics(all);
    } else if (protocol == "qa") {
      const Tokenizer& tok = *qa_tok;
      const std::vector<QaSample>& samples = qa_set;
      out.samples_total = static_cast<int64_t>(samples.size());
      QaOptions qo;
      qo.mode = proto["mode"];
      qo.prefill_chunk = proto["prefill_chunk"];
      qo.cache_dir = env.cache_dir;
      qo.chat = resolve_chat_template(proto["chat_template"], tok.chat_template(),
                                      "config.protocol.chat_template");
      if (qo.chat.active()) log("chat template: " + qo.chat.describe());
      const auto keys = db.done_sample_keys(run_id);
      for (size_t i = 0; i < samples.size(); ++i) {
        const int64_t idx = static_cast<int64_t>(i);
        if (done.count(idx)) {
          KVB_CHECK(keys.at(idx) == samples[i].key, "run ", run_id, ": stored sample ", idx,
                    " was computed on different data (key mismatch); delete the run to redo it");
          continue;
        }
        QaSampleResult r = run_qa_sample(model, tok, method, method_params, samples[i], qo);
        nlohmann::json j = r.to_json();
        j["meta"] = samples[i].meta;
        j["dataset_hash"] = dataset_hash;
        j["chat_template"] = qo.chat.describe();
        db.add_sample(run_id, idx, samples[i].key, j.dump());
        out.samples_computed++;
        double sc = 0;
        for (const auto& it : r.items) sc += it.score;
        log("sample " + std::to_string(i + 1) + "/" + std::to_string(samples.size()) + ": score " +
            std::to_string(sc / std::max<size_t>(1, r.items.size())) + " (" +
            std::to_string(r.context_tokens) + " context tokens)");
      }
      std::vector<QaSampleResult> all;
      for (const auto& s : db.samples(run_id)) all.push_back(QaSampleResult::from_json(parse_json(s.output_json, "run " + std::to_string(run_id) + " sample")));
      out.metrics = qa_metrics(all, declared_simulated);
    } else if (protocol == "perf") {
      const std::vector<int64_t>& batches = int_list;
      out.samples_total = static_cast<int64_t>(batches.size());
      for (size_t i = 0; i < batches.size(); ++i) {
        const int64_t idx = static_cast<int64_t>(i);
        if (done.count(idx)) continue;
        PerfCell c = run_perf_cell(model, method, method_params, batches[i], proto["context"],
                                   proto["decode_tokens"], proto["repeats"], proto["prefill_chunk"],
                                   resolved["seed"].get<uint64_t>());
        db.add_sample(run_id, idx, "batch=" + std::to_string(batches[i]), c.to_json().dump());
        out.samples_computed++;
        log("batch " + std::to_string(batches[i]) + ": decode " + std::to_string(c.decode_tok_s) + " tok/s");
      }
      std::vector<PerfCell> cells;
      for (const auto& s : db.samples(run_id)) cells.push_back(PerfCell::from_json(parse_json(s.output_json, "run " + std::to_string(run_id) + " sample")));
      out.metrics = perf_metrics(cells, declared_simulated);
    } else if (protocol == "serve") {
      out.samples_total = 2;
      if (!done.count(0)) {
        const int64_t decode = proto["probe_decode_tokens"];
        const std::vector<int64_t>& lengths = int_list;
        KVB_CHECK(!windows.empty(), proto["dataset"].get<std::string>(), ": no text for the footprint probe");
        auto points = measure_footprint_points(model, method, method_params, windows[0].tokens, lengths,
                                               decode, proto["prefill_chunk"]);
        // Bytes as a 16-bit deployment holds them (fp32 runs rescale the model-dtype rows).
        nlohmann::json j = footprint_sample_json(
            points, static_cast<double>(model->config.kv_bytes_per_token(2)));
        j["dataset_hash"] = dataset_hash;
        j["probe_dtype"] = resolved["dtype"];
        db.add_sample(run_id, 0, "footprint", j.dump());
        out.samples_computed++;
        log("footprint measured at " + std::to_string(points.size()) + " lengths");
      }
      nlohmann::json footprint;
      for (const auto& s : db.samples(run_id))
        if (s.index == 0) footprint = parse_json(s.output_json, "run " + std::to_string(run_id) + " sample");
      if (!done.count(1)) {
        nlohmann::json sim = serve_simulation_sample(proto, footprint, resolve_data_dir(env.data_dir),
                                                     resolved["seed"].get<uint64_t>());
        db.add_sample(run_id, 1, "simulation", sim.dump());
        out.samples_computed++;
        log("simulated " + std::to_string(sim["trace"]["requests"].get<int64_t>()) + " requests");
      }
      nlohmann::json sim;
      for (const auto& s : db.samples(run_id))
        if (s.index == 1) sim = parse_json(s.output_json, "run " + std::to_string(run_id) + " sample");
      const MethodCaps& caps = MethodRegistry::instance().info(method).caps;
      out.metrics = serve_metrics(footprint, sim, !caps.evicts && !caps.query_aware);
      out.metrics.push_back({"simulated", declared_simulated ? 1.0 : 0.0, "", Direction::kNone});
    } else {
      KVB_FAIL("protocol '", protocol, "' has no runner");
    }
    for (auto& m : device_allocator_metrics(resolved["device"])) out.metrics.push_back(m);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    db.finish_run(run_id, out.metrics, wall);
    return out;
  } catch (const std::exception& e) {
    if (run_id > 0) {
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      try {
        db.fail_run(run_id, e.what(), wall);
      } catch (...) {
      }
    }
    throw;
  }
}

}  // namespace kvb
