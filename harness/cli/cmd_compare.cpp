// kvbench compare: paired comparison of two runs, or of the same grid in two databases (e.g. two git
// commits): which metrics moved beyond their bootstrap confidence interval.

#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/limits.h"
#include "harness/common/strings.h"
#include "harness/common/text_escape.h"
#include "harness/report/compare.h"
#include "harness/report/leaderboard.h"

namespace kvb::cli {

void register_compare(CLI::App& app) {
  struct Args {
    std::vector<std::string> refs;
    std::string db, db_a, db_b, grid;
    uint64_t seed = 0;
    size_t resamples = 10000;
    double rel_tol = 0;
    bool json = false, fail_on_regression = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "compare",
      "paired comparison of two runs (A B: run ids or config hash prefixes), or of every run two databases "
      "share (--db-a X --db-b Y): which metrics moved beyond their 95% CI");
  sub->add_option("runs", args->refs, "A B: run ids or config hash prefixes (B - A is reported)")->expected(0, 2);
  sub->add_option("--db", args->db, "results database holding A and B (default results/kvbench.sqlite)");
  sub->add_option("--db-a", args->db_a, "database of A (or of the baseline side of a grid comparison)");
  sub->add_option("--db-b", args->db_b, "database of B (the candidate side)");
  sub->add_option("--grid", args->grid, "database mode: only runs of this grid");
  sub->add_option("--seed", args->seed, "bootstrap seed")->capture_default_str();
  sub->add_option("--resamples", args->resamples, "bootstrap resamples")->capture_default_str();
  sub->add_option("--rel-tol", args->rel_tol, "a move must also exceed this fraction of |A| to count")->capture_default_str();
  sub->add_flag("--json", args->json, "JSON output");
  sub->add_flag("--fail-on-regression", args->fail_on_regression, "exit 3 when any metric regressed");
  sub->callback([args] {
    auto must_exist = [](const std::string& p) {
      struct stat st {};
      KVB_CHECK(::stat(p.c_str(), &st) == 0, p, ": no such results database");
    };
    KVB_CHECK(args->refs.empty() || args->refs.size() == 2, "compare: give two runs (A B), or none with --db-a/--db-b");
    KVB_CHECK(
        args->resamples >= 1 && args->resamples <= static_cast<size_t>(kMaxBootstrapResamples),
        "--resamples: ", args->resamples, " is out of range; expected 1..", kMaxBootstrapResamples);
    KVB_CHECK(args->rel_tol >= 0, "--rel-tol: expected >= 0");
    CompareOptions o;
    o.seed = args->seed;
    o.n_resamples = args->resamples;
    o.rel_tol = args->rel_tol;
    size_t regressions = 0;
    if (args->refs.size() == 2) {
      const std::string pa = !args->db_a.empty() ? args->db_a : !args->db.empty() ? args->db : "results/kvbench.sqlite";
      const std::string pb = !args->db_b.empty() ? args->db_b : !args->db.empty() ? args->db : "results/kvbench.sqlite";
      must_exist(pa);
      must_exist(pb);
      ResultsDb da(pa, ResultsDb::read_only_options());
      da.check_integrity();
      std::unique_ptr<ResultsDb> owned;
      if (pb != pa) owned = std::make_unique<ResultsDb>(pb, ResultsDb::read_only_options());
      ResultsDb& dbb = owned ? *owned : da;
      if (owned) dbb.check_integrity();
      const RunRow a = find_run_ref(da, args->refs[0]);
      const RunRow b = find_run_ref(dbb, args->refs[1]);
      RunComparison c = compare_runs(da, a, dbb, b, o);
      regressions = c.regressions;
      if (args->json) std::cout << comparison_json(c).dump(2) << "\n";
      else
        std::cout << terminal_text(comparison_text(c, o));  // names come from the DBs
    } else {
      KVB_CHECK(!args->db_a.empty() && !args->db_b.empty(),
                "compare: give two runs (A B), or --db-a X --db-b Y to compare every run the two databases share");
      must_exist(args->db_a);
      must_exist(args->db_b);
      ResultsDb da(args->db_a, ResultsDb::read_only_options());
      ResultsDb dbb(args->db_b, ResultsDb::read_only_options());
      da.check_integrity();
      dbb.check_integrity();
      RunFilter f;
      f.grid = args->grid;
      f.status = RunStatus::kDone;
      size_t only_a = 0, not_done_b = 0, compared = 0, with_moves = 0;
      nlohmann::json all = nlohmann::json::array();
      std::map<std::string, bool> in_a;
      for (const auto& a : da.list_runs(f)) {
        in_a[a.config_hash] = true;
        auto b = dbb.find_run_by_hash(a.config_hash);
        if (!b) {
          only_a++;
          continue;
        }
        if (b->status != RunStatus::kDone) {
          not_done_b++;
          continue;
        }
        RunComparison c = compare_runs(da, a, dbb, *b, o);
        compared++;
        regressions += c.regressions;
        if (args->json) {
          all.push_back(comparison_json(c));
          continue;
        }
        std::vector<std::string> reg, imp, chg;
        for (const auto& m : c.metrics) {
          const std::string t = m.name + " " + (m.diff > 0 ? "+" : "") + format_value(m.diff) + " [" +
                                format_value(m.lo) + ", " + format_value(m.hi) + "]";
          if (m.verdict == "regression") reg.push_back(t);
          else if (m.verdict == "improvement") imp.push_back(t);
          else if (m.verdict == "changed") chg.push_back(t);
        }
        if (!reg.empty() || !imp.empty() || !chg.empty()) with_moves++;
        std::ostringstream line;
        line << a.config_hash.substr(0, 12) << "  " << a.method << " · " << a.model << " · "
             << a.dataset << " · " << a.protocol << ": " << c.common << " common samples";
        if (reg.empty() && imp.empty() && chg.empty()) line << "; nothing moved beyond its CI";
        if (!reg.empty()) line << "; REGRESSION " << join(reg, "; ");
        if (!imp.empty()) line << "; improved " << join(imp, "; ");
        if (!chg.empty()) line << "; changed " << join(chg, "; ");
        std::cout << terminal_text(line.str()) << "\n";  // names come from the DBs
      }
      size_t only_b = 0;
      for (const auto& b : dbb.list_runs(f))
        if (!in_a.count(b.config_hash)) only_b++;
      if (args->json) {
        std::cout << nlohmann::json({{"db_a", args->db_a},
                                     {"db_b", args->db_b},
                                     {"compared", compared},
                                     {"only_in_a", only_a},
                                     {"only_in_b", only_b},
                                     {"not_done_in_b", not_done_b},
                                     {"regressions", regressions},
                                     {"runs", all}})
                         .dump(2)
                  << "\n";
      } else {
        std::cout << compared << " runs compared by config hash (" << with_moves << " with moves, " << regressions
                  << " metric regression(s)); " << only_a << " done only in A, " << only_b << " done only in B, "
                  << not_done_b << " not done in B\n";
      }
    }
    std::cout.flush();
    if (args->fail_on_regression && regressions > 0) std::exit(3);
  });
}

}  // namespace kvb::cli
