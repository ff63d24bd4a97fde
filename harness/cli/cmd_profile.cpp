// kvbench profile: the profile protocol (harness/eval/profile.h) at each context length given, run
// into the results database like `kvbench run`, and optionally the measured metrics as one JSON
// file for scripts/profile-report.py.

#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/common/atomic_file.h"
#include "harness/common/error.h"
#include "harness/common/params.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"

namespace kvb::cli {

namespace {

// "512,2048" -> {512, 2048}; each an integer >= 3, no duplicates.
std::vector<int64_t> parse_lengths(const std::string& text) {
  return parse_int_list(text, "--tokens", "context length", 3, 1 << 20, /*unique=*/true);
}

nlohmann::json metric_json(const Metric& m) {
  nlohmann::json j = {{"name", m.name}, {"value", m.value}, {"unit", m.unit}};
  if (m.layer) j["layer"] = *m.layer;
  if (m.head) j["head"] = *m.head;
  if (m.n) j["n"] = *m.n;
  return j;
}

}  // namespace

void register_profile(CLI::App& app) {
  struct Args {
    std::string model, dataset = "tinystories-valid-sample", tokens = "256", out;
    int64_t samples = 2, decode_steps = 16, top_k = 32;
    std::vector<std::string> sets;
    std::string db = default_db_path();
    std::string models_dir, data_dir;
    std::optional<int64_t> threads;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("profile",
                                     "profile a model's attention on a workload (the profile "
                                     "protocol) at each context length, into the results database");
  sub->add_option("--model,-m", args->model, "model (path, name or synthetic:<preset>)")
      ->required();
  sub->add_option("--dataset,--task", args->dataset,
                  "corpus name or .txt path; random-tokens for a model without a tokenizer")
      ->capture_default_str();
  sub->add_option("--tokens", args->tokens, "context lengths, comma-separated (one run each)")
      ->capture_default_str();
  sub->add_option("--samples", args->samples, "windows per length")->capture_default_str();
  sub->add_option("--decode-steps", args->decode_steps,
                  "last tokens of each window decoded and measured")
      ->capture_default_str();
  sub->add_option("--top-k", args->top_k, "rows of the top-k measures")->capture_default_str();
  sub->add_option("--set", args->sets,
                  "override a run config key: protocol.scan_share=0.2 (repeatable)");
  sub->add_option("--db", args->db, "results database")->capture_default_str();
  sub->add_option("--out", args->out,
                  "also write the runs' metrics as JSON here (scripts/profile-report.py reads it)");
  sub->add_option("--models-dir", args->models_dir, "extra directory to look models up in");
  sub->add_option("--data-dir", args->data_dir,
                  "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  add_threads_override(sub, &args->threads);
  sub->add_flag("--quiet,-q", args->quiet, "no progress lines");
  sub->callback([args] {
    check_db_path(args->db, "--db");
    apply_threads_override(args->threads, args->sets);
    const std::vector<int64_t> lengths = parse_lengths(args->tokens);
    // Every length's config is resolved (and so checked) before the database is opened.
    std::vector<nlohmann::json> configs;
    for (int64_t len : lengths) {
      nlohmann::json raw = {{"model", args->model},
                            {"method", "full"},
                            {"protocol",
                             {{"name", "profile"},
                              {"dataset", args->dataset},
                              {"window", len},
                              {"max_windows", args->samples},
                              {"decode_steps", args->decode_steps},
                              {"top_k", args->top_k}}}};
      apply_overrides(raw, args->sets);
      configs.push_back(resolve_run_config(raw));
    }
    RunEnv env;
    env.models_dir = args->models_dir;
    env.data_dir = args->data_dir;
    env.cache_dir = db_dir_of(args->db) + "/cache/baseline";
    if (!args->quiet) env.log = [](const std::string& s) { std::cerr << "kvbench: " << s << "\n"; };
    ResultsDb db(args->db);
    nlohmann::json report = {
        {"model", args->model}, {"dataset", args->dataset}, {"runs", nlohmann::json::array()}};
    for (const auto& resolved : configs) {
      RunOutcome o = execute_run(resolved, db, env);
      nlohmann::json metrics = nlohmann::json::array();
      for (const auto& m : o.metrics) metrics.push_back(metric_json(m));
      report["runs"].push_back({{"config_hash", o.config_hash},
                                {"run_id", o.run_id},
                                {"protocol", resolved["protocol"]},
                                {"metrics", std::move(metrics)}});
      std::cerr << "kvbench: profile at " << resolved["protocol"]["window"] << " tokens: run "
                << o.run_id << (o.skipped ? " (already done)" : "") << "\n";
    }
    if (!args->out.empty()) write_file_atomically(args->out, report.dump(1) + "\n");
    nlohmann::json summary = nlohmann::json::array();
    for (const auto& r : report["runs"]) {
      nlohmann::json means = nlohmann::json::object();
      for (const auto& m : r["metrics"])
        if (!m.contains("layer")) means[m["name"].get<std::string>()] = m["value"];
      summary.push_back(
          {{"window", r["protocol"]["window"]}, {"run_id", r["run_id"]}, {"means", means}});
    }
    std::cout << summary.dump(2) << "\n";
  });
}

}  // namespace kvb::cli
