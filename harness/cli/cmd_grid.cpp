// kvbench grid: expand, validate and run an ablation grid (optionally one shard of it) into a results
// database; kvbench merge: combine per-shard databases.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/strings.h"
#include "harness/common/text_escape.h"
#include "harness/eval/grid.h"
#include "harness/store/results_db.h"

namespace kvb::cli {

namespace {

std::atomic<int> g_stop{0};

extern "C" void grid_on_signal(int sig) {
  if (g_stop.load() != 0) _exit(128 + sig);  // second signal: stop now (committed rows are safe)
  g_stop.store(sig);
  static const char msg[] =
      "\nkvbench: stopping after the current sample (send the signal again to stop at once)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::string dir_of(const std::string& path) {
  const auto pos = path.find_last_of('/');
  return pos == std::string::npos ? "." : path.substr(0, pos);
}

std::string short_hash(const std::string& h) { return h.substr(0, 12); }

}  // namespace

void register_grid(CLI::App& app) {
  struct Args {
    std::string config;
    std::string db = "results/kvbench.sqlite";
    std::string shard;
    std::vector<std::string> sets;
    std::string models_dir, data_dir, cache_dir;
    bool dry_run = false, json = false, quiet = false, verbose = false, schema_only = false;
    std::string progress = "auto";
    std::optional<int64_t> threads;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "grid", "run an ablation grid (methods x params x models x datasets x settings) into the results database");
  sub->add_option("--config,-c", args->config, "grid config (JSON; format: configs/README.md)")->required();
  sub->add_option("--db", args->db, "results database")->capture_default_str();
  sub->add_option("--shard", args->shard, "run only shard i of n (cells whose number is i modulo n), e.g. 0/4");
  sub->add_option("--set", args->sets, "override a run config key in every cell: a.b.c=value (repeatable)");
  add_threads_override(sub, &args->threads);
  sub->add_flag("--dry-run,-n", args->dry_run, "print the plan (cells, which are done) and run nothing");
  sub->add_flag("--schema-only", args->schema_only,
                "with --dry-run: expand and validate the configs without looking for the models and "
                "data files (to plan a grid meant for another machine)");
  sub->add_flag("--json", args->json, "print the plan / summary as JSON");
  sub->add_option("--models-dir", args->models_dir, "extra directory to look models up in");
  sub->add_option("--data-dir", args->data_dir, "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--cache-dir", args->cache_dir, "full-cache baseline cache (default: <db dir>/cache/baseline)");
  sub->add_option("--progress", args->progress, "auto (a bar on a terminal, lines otherwise) | bar | lines | none")
      ->check(CLI::IsMember({"auto", "bar", "lines", "none"}))
      ->capture_default_str();
  sub->add_flag("--verbose,-v", args->verbose, "also print each run's per-sample lines");
  sub->add_flag("--quiet,-q", args->quiet, "no progress output (same as --progress none)");
  sub->callback([args] {
    if (!args->dry_run) check_db_path(args->db, "--db");
    KVB_CHECK(args->dry_run || !args->schema_only, "grid: --schema-only needs --dry-run");
    apply_threads_override(args->threads, args->sets);
    GridOptions go;
    go.check_inputs = !args->schema_only;
    go.sets = args->sets;
    go.models_dir = args->models_dir;
    go.data_dir = args->data_dir;
    // Every cell is expanded, resolved and checked here, before the database is touched.
    GridPlan plan = load_grid(args->config, go);
    Shard shard;
    if (!args->shard.empty()) shard = parse_shard(args->shard);
    const std::vector<GridCell> cells = shard_cells(plan.cells, shard);
    for (const auto& w : plan.warnings) std::cerr << "kvbench: warning: " << w << "\n";
    const std::string shard_text =
        args->shard.empty() ? "" : " [shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) + "]";

    if (args->dry_run) {
      std::unique_ptr<ResultsDb> db;
      if (path_exists(args->db))  // never create it here, nor write to it
        db = std::make_unique<ResultsDb>(args->db, ResultsDb::read_only_options());
      std::map<std::string, int> counts;
      nlohmann::json jcells = nlohmann::json::array();
      std::ostringstream rows;
      for (const auto& c : cells) {
        CellState s = db ? cell_state(*db, c) : CellState{"new", 0, ""};
        const std::string st = s.status == "running" ? "partial" : s.status;
        counts[st]++;
        rows << "  #" << std::left << std::setw(5) << c.index << std::setw(9) << st << std::right
             << std::setw(4) << s.samples << "/" << std::left << std::setw(5) << c.expected_samples
             << short_hash(c.config_hash) << "  " << c.label << "\n";
        jcells.push_back({{"index", c.index},
                          {"label", c.label},
                          {"config_hash", c.config_hash},
                          {"status", st},
                          {"samples_done", s.samples},
                          {"samples_expected", c.expected_samples},
                          {"config", c.resolved}});
      }
      const int to_run = static_cast<int>(cells.size()) - counts["done"];
      if (args->json) {
        std::cout << nlohmann::json({{"grid", plan.name},
                                     {"shard", args->shard.empty() ? nlohmann::json(nullptr) : nlohmann::json(args->shard)},
                                     {"axes", plan.axis_keys},
                                     {"expanded", plan.expanded},
                                     {"excluded", plan.excluded},
                                     {"duplicates", plan.duplicates},
                                     {"cells_total", plan.cells.size()},
                                     {"cells", jcells},
                                     {"to_run", to_run},
                                     {"warnings", plan.warnings}})
                         .dump(2)
                  << "\n";
        return;
      }
      std::cout << "grid '" << plan.name << "'" << shard_text << ": " << cells.size() << " of "
                << plan.cells.size() << " cells (" << plan.expanded << " expanded, " << plan.excluded
                << " excluded, " << plan.duplicates << " duplicate" << (plan.duplicates == 1 ? "" : "s")
                << "); axes: " << (plan.axis_keys.empty() ? "(none)" : join(plan.axis_keys, ", ")) << "\n";
      std::cout << "db " << args->db << (db ? "" : " (does not exist yet)") << ": " << counts["done"]
                << " done, " << counts["partial"] << " partial, " << counts["failed"] << " failed, "
                << counts["new"] << " new -> " << to_run << " to run\n";
      std::cout << "  cell   status   samples  config hash   cell\n" << rows.str();
      return;
    }

    RunEnv env;
    env.models_dir = args->models_dir;
    env.data_dir = args->data_dir;
    env.cache_dir = args->cache_dir.empty() ? dir_of(args->db) + "/cache/baseline" : args->cache_dir;
    GridRunOptions ro;
    ro.env = env;
    ro.stop = &g_stop;
    std::string mode = args->quiet ? "none" : args->progress;
    if (mode == "auto") mode = isatty(STDERR_FILENO) ? "bar" : "lines";
    ro.progress = mode == "none" ? nullptr : &std::cerr;
    ro.progress_bar = mode == "bar";
    ro.verbose = args->verbose;

    struct sigaction sa {};
    sa.sa_handler = grid_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    GridSummary sum;
    {
      ResultsDb::Options db_options;
      db_options.check_integrity = true;  // a damaged DB fails before the grid writes to it
      ResultsDb db(args->db, db_options);
      if (ro.progress)
        *ro.progress << "grid '" << plan.name << "'" << shard_text << ": " << cells.size() << " cells -> "
                     << args->db << "\n";
      sum = run_grid(plan.name, cells, db, ro);
    }  // database closed before exiting
    const int sig = g_stop.load();
    if (args->json) {
      nlohmann::json jc = nlohmann::json::array();
      for (const auto& r : sum.cells)
        jc.push_back({{"index", r.index},
                      {"label", r.label},
                      {"config_hash", r.config_hash},
                      {"status", r.status},
                      {"error", r.error},
                      {"run_id", r.run_id},
                      {"samples_computed", r.samples_computed},
                      {"wall_s", r.wall_s}});
      std::cout << nlohmann::json({{"grid", plan.name},
                                   {"shard", args->shard.empty() ? nlohmann::json(nullptr)
                                                                 : nlohmann::json(args->shard)},
                                   {"db", args->db},
                                   {"cells", jc},
                                   {"ran", sum.ran},
                                   {"skipped", sum.skipped},
                                   {"failed", sum.failed},
                                   {"not_reached", sum.not_reached},
                                   {"held", sum.held},
                                   {"disk_full", sum.disk_full},
                                   {"interrupted", sum.interrupted},
                                   {"wall_s", sum.wall_s}})
                       .dump(2)
                << "\n";
    } else {
      std::cout << "grid '" << plan.name << "'" << shard_text << ": " << cells.size() << " cells: " << sum.ran
                << " ran, " << sum.skipped << " already done, " << sum.failed << " failed";
      if (sum.interrupted) std::cout << ", interrupted with " << sum.not_reached << " not reached";
      if (sum.held > 0) std::cout << ", " << sum.held << " still held by other processes";
      if (sum.disk_full)
        std::cout << ", stopped for want of disk space with " << sum.not_reached << " not reached";
      std::cout << " (" << std::fixed << std::setprecision(1) << sum.wall_s << " s) -> " << args->db << "\n";
      for (const auto& r : sum.cells)
        if (r.status == "failed")
          std::cout << "  FAILED #" << r.index << " " << r.label << " [" << short_hash(r.config_hash)
                    << "]: " << r.error << "\n";
      if (sum.interrupted) std::cout << "  re-run the same command to finish the grid (finished samples are kept)\n";
    }
    std::cout.flush();
    std::cerr.flush();
    if (sum.interrupted) std::exit(128 + (sig ? sig : SIGINT));
    if (sum.failed > 0) std::exit(3);
  });
}

void register_merge(CLI::App& app) {
  struct Args {
    std::string out;
    std::vector<std::string> inputs;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "merge", "merge results databases (e.g. one per grid shard) into OUT, de-duplicating runs by config hash");
  sub->add_option("out", args->out, "destination database (created when missing)")->required();
  sub->add_option("inputs", args->inputs, "source databases")->required();
  sub->add_flag("--json", args->json, "JSON output");
  sub->callback([args] {
    for (const auto& in : args->inputs) {
      KVB_CHECK(path_exists(in), in, ": no such results database");
      KVB_CHECK(in != args->out, in, ": cannot merge a database into itself");
    }
    // Every input is a readable results DB before OUT is created (merge_from reads each again).
    for (const auto& in : args->inputs) {
      const ResultsDb readable(in, ResultsDb::read_only_options());
    }
    check_db_path(args->out, "merge: OUT");
    ResultsDb out(args->out);
    MergeStats total;
    nlohmann::json per = nlohmann::json::array();
    for (const auto& in : args->inputs) {
      const MergeStats s = out.merge_from(in);
      auto add = [](MergeStats& t, const MergeStats& x) {
        t.runs_added += x.runs_added;
        t.runs_replaced += x.runs_replaced;
        t.runs_combined += x.runs_combined;
        t.runs_skipped += x.runs_skipped;
        t.runs_held += x.runs_held;
        t.samples_copied += x.samples_copied;
        t.metrics_copied += x.metrics_copied;
        t.artifacts_added += x.artifacts_added;
      };
      add(total, s);
      nlohmann::json j = {{"input", in},
                          {"runs_added", s.runs_added},
                          {"runs_replaced", s.runs_replaced},
                          {"runs_combined", s.runs_combined},
                          {"runs_skipped", s.runs_skipped},
                          {"runs_held", s.runs_held},
                          {"samples_copied", s.samples_copied},
                          {"metrics_copied", s.metrics_copied},
                          {"artifacts_added", s.artifacts_added}};
      per.push_back(j);
      if (!args->json)
        std::cout << terminal_text(in) << ": " << s.runs_added << " runs added, " << s.runs_replaced
                  << " replaced, " << s.runs_combined << " combined, " << s.runs_skipped
                  << " skipped (already done), " << s.runs_held
                  << " left to the live process computing them; " << s.samples_copied
                  << " samples, " << s.metrics_copied << " metrics, " << s.artifacts_added
                  << " artifacts copied\n";
    }
    const size_t runs = out.list_runs().size();
    const size_t done = out.list_runs(RunFilter{"", "", "", "", "", RunStatus::kDone}).size();
    if (args->json) {
      std::cout << nlohmann::json({{"out", args->out},
                                   {"inputs", per},
                                   {"runs_added", total.runs_added},
                                   {"runs_replaced", total.runs_replaced},
                                   {"runs_combined", total.runs_combined},
                                   {"runs_skipped", total.runs_skipped},
                                   {"runs_held", total.runs_held},
                                   {"samples_copied", total.samples_copied},
                                   {"metrics_copied", total.metrics_copied},
                                   {"artifacts_added", total.artifacts_added},
                                   {"runs", runs},
                                   {"runs_done", done}})
                       .dump(2)
                << "\n";
    } else {
      std::cout << args->out << ": " << runs << " runs (" << done << " done) after merging "
                << args->inputs.size() << " database" << (args->inputs.size() == 1 ? "" : "s") << "\n";
    }
  });
}

}  // namespace kvb::cli
