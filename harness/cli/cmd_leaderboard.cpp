// kvbench leaderboard: rank methods per (model, dataset, protocol settings) from a results database.

#include <sys/stat.h>

#include <fstream>
#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/limits.h"
#include "harness/common/text_escape.h"
#include "harness/report/leaderboard.h"

namespace kvb::cli {

void register_leaderboard(CLI::App& app) {
  struct Args {
    std::string db = "results/kvbench.sqlite";
    std::string model, dataset, protocol, grid, metric, out;
    std::string format = "md";
    uint64_t seed = 0;
    size_t resamples = 10000;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "leaderboard",
      "rank methods by accuracy/fidelity at measured bytes per token, with paired bootstrap CIs vs the full cache");
  sub->add_option("--db", args->db, "results database")->capture_default_str();
  sub->add_option("--model", args->model, "only this model (as written in the run config)");
  sub->add_option("--dataset", args->dataset, "only this dataset");
  sub->add_option("--protocol", args->protocol, "only this protocol (stream, perf, ...)");
  sub->add_option("--grid", args->grid, "only runs of this grid");
  sub->add_option("--metric", args->metric, "ranking metric (default: stream kl_mean, perf decode_tok_s, qa accuracy)");
  sub->add_option("--format,-f", args->format, "md | csv | json | html")
      ->check(CLI::IsMember({"md", "csv", "json", "html"}))
      ->capture_default_str();
  sub->add_option("--out,-o", args->out, "write to this file instead of stdout");
  sub->add_option("--seed", args->seed, "bootstrap seed (the output is deterministic under it)")->capture_default_str();
  sub->add_option("--resamples", args->resamples, "bootstrap resamples")->capture_default_str();
  sub->callback([args] {
    struct stat st {};
    KVB_CHECK(::stat(args->db.c_str(), &st) == 0, args->db, ": no such results database (run `kvbench grid` or `kvbench run` first)");
    KVB_CHECK(
        args->resamples >= 1 && args->resamples <= static_cast<size_t>(kMaxBootstrapResamples),
        "--resamples: ", args->resamples, " is out of range; expected 1..", kMaxBootstrapResamples);
    LeaderboardOptions o;
    o.filter.model = args->model;
    o.filter.dataset = args->dataset;
    o.filter.protocol = args->protocol;
    o.filter.grid = args->grid;
    o.metric = args->metric;
    o.seed = args->seed;
    o.n_resamples = args->resamples;
    std::string text;
    {
      ResultsDb db(args->db, ResultsDb::read_only_options());
      db.check_integrity();
      Leaderboard lb = build_leaderboard(db, o);
      if (args->format == "md") text = leaderboard_markdown(lb);
      else if (args->format == "csv") text = leaderboard_csv(lb);
      else if (args->format == "json") text = leaderboard_json(lb).dump(2) + "\n";
      else text = leaderboard_html(lb);
    }
    if (args->out.empty()) {
      // Method labels and errors come from the DB; JSON and HTML escape them themselves.
      std::cout << (args->format == "md" || args->format == "csv" ? terminal_text(text) : text);
      return;
    }
    std::ofstream f(args->out, std::ios::binary);
    KVB_CHECK(f.good(), args->out, ": cannot open for writing");
    f << text;
    f.close();
    KVB_CHECK(f.good(), args->out, ": write failed");
    std::cerr << "kvbench: wrote " << args->out << "\n";
  });
}

}  // namespace kvb::cli
