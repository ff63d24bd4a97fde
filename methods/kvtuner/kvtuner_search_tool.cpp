// `kvbench kvtuner-search`: KVTuner's offline part (methods/kvtuner/kvtuner_search.h) — profiles
// every layer at the nine (bK, bV) pairs on calibration text, prunes, clusters, searches the
// (equivalent bits, KL) front, and writes the calibration artifact that `kvtuner`'s `config`
// parameter loads. Prints a summary (JSON) on stdout; progress on stderr.

#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/common/error.h"
#include "harness/tool/model_options.h"
#include "harness/tool/tool_registry.h"
#include "methods/common/tool_output.h"
#include "methods/kvtuner/kvtuner_search.h"

namespace kvb::kvtuner {
namespace {

using tool::add_model_options;
using tool::load_model_from_args;
using tool::ModelArgs;

void setup_kvtuner_search(CLI::App* sub) {
  struct Args {
    ModelArgs model;
    std::string corpus = "tinystories-valid-sample";
    std::string data_dir;
    int64_t windows = 4, window_tokens = 256, skip_windows = 0;
    std::string budgets = "4,3";
    double max_bits = 0;
    std::string out;
    bool quiet = false;
    kvtuner::SearchOptions o;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  add_model_options(sub, &a->model);
  sub->add_option("--corpus,--dataset", a->corpus,
                  "calibration text: a built-in corpus name or a .txt path")
      ->capture_default_str();
  sub->add_option("--data-dir", a->data_dir,
                  "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--windows", a->windows, "calibration windows")->capture_default_str();
  sub->add_option("--window-tokens", a->window_tokens, "tokens per window (BOS included)")
      ->capture_default_str();
  sub->add_option("--skip-windows", a->skip_windows,
                  "skip the corpus's first N windows (keep calibration text apart from evaluation "
                  "text: the stream examples score the first windows)")
      ->capture_default_str();
  sub->add_option("--budgets", a->budgets,
                  "equivalent-bits budgets, comma-separated (first: the "
                  "artifact's `layers`)")
      ->capture_default_str();
  sub->add_option("--max-bits", a->max_bits, "search constraint on equivalent bits (0: max budget)")
      ->capture_default_str();
  sub->add_option("--mode", a->o.mode, "kivi | per_token (the kvtuner method's modes)")
      ->check(CLI::IsMember({"kivi", "per_token"}))
      ->capture_default_str();
  sub->add_option("--out,-o", a->out, "artifact path (FILE.json; picks also go to FILE.b<B>.json)")
      ->required();
  sub->add_option("--seed", a->seed, "NSGA-II seed")->capture_default_str();
  sub->add_option("--search", a->o.search, "auto | exhaustive | nsga2")
      ->check(CLI::IsMember({"auto", "exhaustive", "nsga2"}))
      ->capture_default_str();
  sub->add_option("--max-exhaustive", a->o.max_exhaustive,
                  "auto: exhaustive when the feasible space holds at most this many configs")
      ->capture_default_str();
  sub->add_option("--trials", a->o.trials, "NSGA-II: configs evaluated")->capture_default_str();
  sub->add_option("--population", a->o.population, "NSGA-II population")->capture_default_str();
  sub->add_option("--sensitivity", a->o.sensitivity,
                  "pruning and clustering metric: eo (attention-output error, the paper's) | kl")
      ->check(CLI::IsMember({"eo", "kl"}))
      ->capture_default_str();
  sub->add_option("--cluster-threshold", a->o.cluster_threshold,
                  "merge layer clusters whose RMS log10 sensitivity distance is at most this")
      ->capture_default_str();
  sub->add_option("--max-groups", a->o.max_groups, "merge further while more groups (0: no cap)")
      ->capture_default_str();
  sub->add_option("--probe-every", a->o.probe_every, "local errors at every N-th decode position")
      ->capture_default_str();
  add_quiet_flag(sub, &a->quiet);
  sub->callback([a] {
    a->o.budgets.clear();
    std::stringstream ss(a->budgets);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t used = 0;
      double b = 0;
      try {
        b = std::stod(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      KVB_CHECK(used > 0 && item.find_first_not_of(' ', used) == std::string::npos, "--budgets: '",
                item, "' is not a number");
      a->o.budgets.push_back(b);
    }
    a->o.max_bits = a->max_bits;
    a->o.seed = a->seed;
    a->o.log = tool_progress("kvtuner-search", a->quiet);
    auto model = load_model_from_args(a->model);
    auto data = kvtuner::calibration_windows(*model, a->corpus, a->data_dir, a->window_tokens,
                                             a->windows, a->skip_windows);
    nlohmann::json art = kvtuner::run_search(model, data, a->o);
    auto files = kvtuner::write_artifact(art, a->out);
    if (a->o.log) a->o.log("wrote " + a->out);
    nlohmann::json summary = {{"artifact", a->out},          {"budget_files", files},
                              {"selected", art["selected"]}, {"pareto", art["pareto"]},
                              {"groups", art["groups"]},     {"search", art["search"]}};
    for (auto& s : summary["selected"]) s.erase("layers");
    print_tool_summary(summary);
  });
}

}  // namespace

// Registered from this folder, so that harness/cli (the layer above the methods) names no method.
KVB_REGISTER_TOOL(
    "kvtuner-search",
    "KVTuner offline search: per-layer sensitivity profile, Pareto pruning, layer clustering, "
    "(bits, KL) search; writes the precision config for method kvtuner",
    setup_kvtuner_search);

}  // namespace kvb::kvtuner
