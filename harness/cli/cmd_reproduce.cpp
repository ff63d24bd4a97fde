// kvbench reproduce: run a paper's claim suite (configs/reproduce/<paper>.json) and write its
// report (harness/report/reproduce.h has the logic).

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "harness/cli/cli_common.h"
#include "harness/common/atomic_file.h"
#include "harness/common/error.h"
#include "harness/common/strings.h"
#include "harness/report/reproduce.h"
#include "harness/store/results_db.h"

namespace kvb::cli {

namespace {

std::atomic<int> g_reproduce_stop{0};

extern "C" void reproduce_on_signal(int sig) {
  if (g_reproduce_stop.load() != 0) _exit(128 + sig);
  g_reproduce_stop.store(sig);
  static const char msg[] =
      "\nkvbench: stopping after the current sample (send the signal again to stop at once)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

void stop_deferring_signals() {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  // A signal that arrived after the last cell's boundary was deferred to a boundary that never comes.
  if (const int sig = g_reproduce_stop.load(); sig != 0) raise(sig);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVB_CHECK(in.good(), path, ": cannot read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

void register_reproduce(CLI::App& app) {
  struct Args {
    std::string paper;
    bool all = false, evaluate_only = false, quiet = false;
    std::string db = "results/reproduce.sqlite";
    std::string scale = "cpu";
    std::string suites_dir = "configs/reproduce", grids_dir = "configs/grids";
    std::string out_dir = "results/reproduce";
    std::string readme;
    std::string models_dir, data_dir, cache_dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("reproduce",
                                     "check a paper's claims: run its suite's cells, evaluate each "
                                     "claim's predicate, write the report");
  sub->add_option("paper", args->paper, "paper (a file of --suites-dir without .json)");
  sub->add_flag("--all", args->all, "every suite of --suites-dir");
  sub->add_option("--db", args->db,
                  "results database (a copy of results/main.sqlite skips its finished cells)")
      ->capture_default_str();
  sub->add_option("--scale", args->scale,
                  "cpu: the CPU-size claims; gpu: also the GPU-size cells; gpu-only: the GPU-size "
                  "claims alone (scripts/device-check.sh)")
      ->check(CLI::IsMember({"cpu", "gpu", "gpu-only"}))
      ->capture_default_str();
  sub->add_flag("--evaluate-only", args->evaluate_only,
                "run no cell; evaluate what the database holds");
  sub->add_option("--suites-dir", args->suites_dir, "claim suites")->capture_default_str();
  sub->add_option("--grids-dir", args->grids_dir, "grids the suites reference")
      ->capture_default_str();
  sub->add_option("--out-dir", args->out_dir, "where <paper>.md and <paper>.html go")
      ->capture_default_str();
  sub->add_option("--readme", args->readme,
                  "with --all: rewrite this file's reproduce-summary block with the summary table");
  sub->add_option("--models-dir", args->models_dir, "extra directory to look models up in");
  sub->add_option("--data-dir", args->data_dir,
                  "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--cache-dir", args->cache_dir,
                  "full-cache baseline cache (default: <db dir>/cache/baseline)");
  sub->add_flag("--quiet,-q", args->quiet, "no progress output");
  sub->callback([args] {
    KVB_CHECK(args->all != !args->paper.empty(), "reproduce: give a PAPER or --all (one of them)");
    KVB_CHECK(args->all || args->readme.empty(),
              "reproduce: --readme needs --all (the summary covers every paper)");
    KVB_CHECK(
        args->scale != "gpu-only" || args->readme.empty(),
        "reproduce: --readme with --scale gpu-only would mark every CPU-size claim unevaluated; "
        "evaluate with --scale cpu or gpu for the README");
    std::vector<std::string> paths;
    if (args->all) {
      paths = list_reproduce_suites(args->suites_dir);
      KVB_CHECK(!paths.empty(), args->suites_dir, ": no suites (*.json)");
    } else {
      const std::string path = args->suites_dir + "/" + args->paper + ".json";
      if (!std::filesystem::is_regular_file(path)) {
        std::vector<std::string> names;
        if (std::filesystem::is_directory(args->suites_dir))
          for (const auto& p : list_reproduce_suites(args->suites_dir))
            names.push_back(std::filesystem::path(p).stem().string());
        KVB_CHECK(false, "reproduce: unknown paper '", args->paper, "'",
                  did_you_mean(args->paper, names), "; known: ", join(names, ", ").c_str());
      }
      paths.push_back(path);
    }
    // Every suite is loaded and validated before the database or any report is touched.
    ReproLoadOptions lo;
    lo.grids_dir = args->grids_dir;
    lo.models_dir = args->models_dir;
    lo.data_dir = args->data_dir;
    lo.check_inputs = !args->evaluate_only;
    std::vector<ReproSuite> suites;
    for (const auto& p : paths) suites.push_back(load_reproduce_suite(p, lo));
    std::string readme_text;
    if (!args->readme.empty()) {
      readme_text = read_text(args->readme);
      replace_marked_block(readme_text, "", args->readme);  // refuse a README without the block now
    }
    if (args->evaluate_only)
      KVB_CHECK(std::filesystem::is_regular_file(args->db), args->db, ": no such results database");
    else
      check_db_path(args->db, "--db");

    std::ostringstream cmd;
    cmd << "kvbench reproduce " << (args->all ? std::string("--all") : args->paper) << " --scale "
        << args->scale;
    ResultsDb db(args->db);
    if (!args->evaluate_only) {
      struct sigaction sa {};
      sa.sa_handler = reproduce_on_signal;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGINT, &sa, nullptr);
      sigaction(SIGTERM, &sa, nullptr);
      ReproRunOptions ro;
      ro.scale = args->scale;
      ro.grid.env.models_dir = args->models_dir;
      ro.grid.env.data_dir = args->data_dir;
      const std::string db_dir = std::filesystem::path(args->db).parent_path().string();
      ro.grid.env.cache_dir = args->cache_dir.empty()
                                  ? (db_dir.empty() ? "." : db_dir) + "/cache/baseline"
                                  : args->cache_dir;
      ro.grid.stop = &g_reproduce_stop;
      ro.grid.progress = args->quiet ? nullptr : &std::cerr;
      for (const ReproSuite& s : suites) {
        const GridSummary sum = run_reproduce_cells(s, db, ro);
        if (!args->quiet)
          std::cerr << "reproduce " << s.paper << ": " << sum.ran << " cells ran, " << sum.skipped
                    << " already done, " << sum.failed << " failed\n";
        if (sum.interrupted || sum.disk_full) {
          std::cerr << "reproduce: stopped; re-run the same command to finish (finished cells are "
                       "kept)\n";
          std::exit(sum.disk_full
                        ? 3
                        : 128 + (g_reproduce_stop.load() ? g_reproduce_stop.load() : SIGINT));
        }
      }
    }
    // The handler defers a signal to the next sample boundary; evaluating has none, and its pages are
    // written atomically, so from here a signal ends the process at once as it normally would.
    stop_deferring_signals();
    std::vector<SuiteReport> reports;
    for (const ReproSuite& s : suites) {
      SuiteReport r;
      r.suite = &s;
      for (const Claim& c : s.claims) r.results.push_back(evaluate_claim(c, db, args->scale));
      reports.push_back(std::move(r));
    }
    std::filesystem::create_directories(args->out_dir);
    for (const SuiteReport& r : reports) {
      const std::string c = "kvbench reproduce " + r.suite->paper + " --scale " + args->scale;
      write_file_atomically(args->out_dir + "/" + r.suite->paper + ".md",
                            render_reproduce_markdown(r, c));
      write_file_atomically(args->out_dir + "/" + r.suite->paper + ".html",
                            render_reproduce_html(r, c));
      for (size_t i = 0; i < r.results.size(); ++i)
        std::cout << r.suite->paper << "/" << r.suite->claims[i].id << ": "
                  << verdict_name(r.results[i].verdict) << "\n";
    }
    const std::string summary = render_reproduce_summary(reports);
    if (args->all) {
      write_file_atomically(args->out_dir + "/summary.md",
                            "# Paper claims reproduced\n\nGenerated by `" + cmd.str() +
                                "`; one page per paper in this directory.\n\n" +
                                render_reproduce_summary(reports, ""));
      if (!args->readme.empty())
        write_file_atomically(args->readme,
                              replace_marked_block(readme_text, summary, args->readme));
    }
    std::cout << summary;
  });
}

}  // namespace kvb::cli
