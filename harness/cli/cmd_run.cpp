#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"

namespace kvb::cli {

std::string default_db_path() { return "results/kvbench.sqlite"; }

std::string db_dir_of(const std::string& db) {
  const auto pos = db.find_last_of('/');
  return pos == std::string::npos ? "." : db.substr(0, pos);
}

void register_run(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    std::string db = default_db_path();
    std::string models_dir, data_dir, cache_dir;
    std::optional<int64_t> threads;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("run", "run one config into the results database (skips finished work, resumes by sample)");
  sub->add_option("--config,-c", args->config, "run config (JSON)")->required();
  sub->add_option("--set", args->sets, "override a config key: a.b.c=value (repeatable)");
  sub->add_option("--db", args->db, "results database")->capture_default_str();
  sub->add_option("--models-dir", args->models_dir, "extra directory to look models up in");
  sub->add_option("--data-dir", args->data_dir, "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--cache-dir", args->cache_dir, "full-cache baseline cache (default: <db dir>/cache/baseline)");
  add_threads_override(sub, &args->threads);
  sub->add_flag("--quiet,-q", args->quiet, "no progress lines");
  sub->callback([args] {
    check_db_path(args->db, "--db");
    apply_threads_override(args->threads, args->sets);
    nlohmann::json raw = load_config_file(args->config);
    apply_overrides(raw, args->sets);
    nlohmann::json resolved = resolve_run_config(raw);
    // Every config error surfaces here, before the database is opened (or created).
    RunConfigChecker(ConfigCheckOptions{args->models_dir, args->data_dir}).check(resolved);
    RunEnv env;
    env.models_dir = args->models_dir;
    env.data_dir = args->data_dir;
    env.cache_dir = args->cache_dir.empty() ? db_dir_of(args->db) + "/cache/baseline" : args->cache_dir;
    if (!args->quiet) env.log = [](const std::string& s) { std::cerr << "kvbench: " << s << "\n"; };
    ResultsDb::Options db_options;
    db_options.check_integrity = true;  // a damaged DB fails before the run writes to it
    ResultsDb db(args->db, db_options);
    RunOutcome o = execute_run(resolved, db, env);
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& m : o.metrics)
      if (!m.layer && !m.head) metrics[m.name] = m.value;
    std::cout << nlohmann::json({{"config_hash", o.config_hash},
                                 {"run_id", o.run_id},
                                 {"skipped", o.skipped},
                                 {"samples", o.samples_total},
                                 {"samples_computed", o.samples_computed},
                                 {"method", resolved["method"]["name"]},
                                 {"protocol", resolved["protocol"]["name"]},
                                 {"metrics", metrics}})
                     .dump(2)
              << "\n";
  });
}

}  // namespace kvb::cli
