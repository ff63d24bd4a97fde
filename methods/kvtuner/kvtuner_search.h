#pragma once
// KVTuner's offline part (Li et al., ICML 2025 (a) steps 3-7): the
// search that produces the per-layer (bK, bV) precision config the online `kvtuner` cache loads.
//
//   1. profile    for every layer l and every pair p in {2,4,8}^2:
//                   local errors of layer l's cache at p on calibration text — attention-output
//                   relative error e_o, key / value relative errors e_k / e_v,
//                   attention-probability total variation tv — measured like the probe protocol
//                   (the quantized cache and an exact cache get the same q/k/v) but with the engine
//                   fed the EXACT attention output, so every layer sees the full-precision
//                   trajectory: one run per pair gives e(l, p) for all l exactly as "only layer l
//                   at p, every other layer exact";
//                 and an end-to-end proxy: mean KL(full || cache) over the calibration positions
//                   with layer l at p and every other layer at KV8.
//   2. prune      per layer, keep the pairs on the Pareto front of (equivalent bits (bK+bV)/2,
//                 sensitivity) — sensitivity is e_o (the paper's) or the end-to-end KL.
//   3. cluster    (i) split layers by their pruned candidate set; (ii) inside a split, average-
//                 linkage agglomerative clustering on the vectors log10(sensitivity) over the
//                 split's candidates, merging while the closest clusters' RMS log10 distance is
//                 <= threshold (or while there are more than max_groups groups). The paper does
//                 not say which algorithm it uses (its code hard-codes the groups).
//   4. search     objectives: equivalent bits (mean over layers of (bK+bV)/2) and the KL proxy on
//                 the calibration windows, both minimized; a gene per group picks one of its
//                 candidates. Exhaustive when the feasible space is small, else NSGA-II (Deb et
//                 al. 2002: constrained domination, crowding distance, binary tournaments, uniform
//                 crossover, per-gene reset mutation), deterministic under a seed. Configs above
//                 max_bits are infeasible and never evaluated. The result is the Pareto front of
//                 every evaluated config (like Optuna's best_trials).
//   5. select     per budget B: the evaluated config with the lowest KL among those with
//                 equivalent bits <= B.
// The artifact (artifact_json) holds the pick under the first budget under "layers" (the
// `kvtuner` method's `config` parameter loads it), every pick, the Pareto set, the profile table,
// the settings and hashes of the model and the calibration data.
//
// Sliding-window layers: the search covers the layers the `kvtuner` method's store serves
// (searched_layers). On a model with both window and global layers those are the global layers
// (WindowedKvCache keeps every window layer's window dense, at full precision, whatever the
// method), so the profile, the groups and every config are over the global layers in model order
// ("layers" key i is the i-th global layer, as the method numbers them); the artifact names them
// (searched_layers, window_layers). On a model whose every layer is a window, every layer is
// searched, within the window: the calibration windows must fit in it (there the model is plain
// causal attention, and it is profiled as such); a longer one is refused by name.

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/model/model.h"

namespace kvb::kvtuner {

// ---- precision pairs ----

struct BitPair {
  int32_t k = 8, v = 8;
  double bits() const { return 0.5 * (k + v); }  // KVTuner's equivalent bits of one layer
  std::string name() const;                      // "KV8", "K8V4", ...
};
// The nine candidates, in the paper's order: KV8, K8V4, K8V2, K4V8, KV4, K4V2, K2V8, K2V4, KV2.
const std::vector<BitPair>& candidate_pairs();
// The `pairs` parameter of the kvtuner method for per-layer pairs: "KV8,K8V4,...".
std::string pairs_string(const std::vector<BitPair>& layers);
double equivalent_bits(const std::vector<BitPair>& layers);
// {"0": {"nbits_key": bK, "nbits_value": bV}, ...}: the `config` file format.
nlohmann::json layers_json(const std::vector<BitPair>& layers);

// ---- multi-objective machinery (generic, torch-free) ----

using Objectives = std::array<double, 2>;  // both minimized

// Indices of the non-dominated points (a dominates b: a <= b in both and < in one; equal points
// are all kept), sorted by objective 0, then 1, then index.
std::vector<size_t> pareto_front(const std::vector<Objectives>& points);

// A genome: one choice per gene, gene i in [0, choices[i]).
using Genome = std::vector<int32_t>;
using ObjectiveFn = std::function<Objectives(const Genome&)>;
// > 0: infeasible by that much (never evaluated); 0: feasible. May be empty (all feasible).
using ViolationFn = std::function<double(const Genome&)>;

struct Evaluated {
  Genome genome;
  Objectives f{};
};

struct SearchResult {
  std::vector<Evaluated> evaluated;  // every feasible genome evaluated, in evaluation order, unique
  std::vector<size_t> front;         // pareto_front over `evaluated`
  int64_t space = 0;                 // number of genomes (feasible or not); -1 when too large
  int64_t infeasible_skipped = 0;    // exhaustive: genomes skipped by the violation function
  int64_t generations = 0;           // NSGA-II: generations run
};

// Number of genomes, or -1 when it exceeds `cap`.
int64_t space_size(const std::vector<int32_t>& choices, int64_t cap);

// Every genome in mixed-radix order (gene 0 fastest).
SearchResult exhaustive_search(const std::vector<int32_t>& choices, const ObjectiveFn& f,
                               const ViolationFn& violation = nullptr);

struct Nsga2Options {
  int64_t population = 24;
  int64_t max_evaluations = 150;  // distinct feasible genomes evaluated (Optuna's n_trials)
  int64_t max_generations = 1000;
  double crossover_prob = 0.9;  // uniform crossover
  double mutation_prob = -1;    // per gene; < 0: 1 / genes
  uint64_t seed = 0;
};
SearchResult nsga2_search(const std::vector<int32_t>& choices, const ObjectiveFn& f,
                          const ViolationFn& violation, const Nsga2Options& opts);

// ---- calibration, profiling and the whole search on a model ----

struct CalibrationData {
  std::vector<std::vector<int64_t>> windows;  // token windows, BOS first
  nlohmann::json info;                        // corpus, sha256, window hashes, skip, ...
};

// Windows [skip, skip + n) of a corpus (built-in name or .txt path), window_tokens each, BOS first.
CalibrationData calibration_windows(const Model& model, const std::string& corpus,
                                    const std::string& data_dir, int64_t window_tokens,
                                    int64_t n_windows, int64_t skip_windows);

struct SearchOptions {
  std::string mode = "kivi";  // kivi | per_token (the kvtuner method's modes)
  std::vector<double> budgets = {4, 3};
  double max_bits = 0;              // search constraint; 0: max(budgets)
  std::string sensitivity = "eo";   // pruning + clustering metric: eo | kl
  double cluster_threshold = 0.15;  // RMS log10 distance
  int64_t max_groups = 0;           // 0: no cap (threshold only)
  std::string search = "auto";      // auto | exhaustive | nsga2
  int64_t max_exhaustive = 512;     // auto: exhaustive when the feasible space is at most this
  int64_t trials = 150;             // NSGA-II evaluations
  int64_t population = 24;
  uint64_t seed = 0;
  int64_t prefill_tokens = 1;  // as the stream protocol: BOS prefilled, the rest decoded
  int64_t probe_every = 1;     // local errors at every probe_every-th decode position
  bool local_errors = true;    // false: not profiled (sensitivity kl only: it does not use them)
  std::function<void(const std::string&)> log;
};

// Mean KL(full || kvtuner with `layers`) and NLL over every predicted position of the windows
// (the stream protocol's schedule; the full-cache log-probabilities are computed once).
class KlEvaluator {
 public:
  KlEvaluator(std::shared_ptr<Model> model, std::vector<std::vector<int64_t>> windows,
              std::string mode, int64_t prefill_tokens);
  struct Result {
    double kl_mean = 0, nll = 0;
    int64_t tokens = 0;
  };
  Result evaluate(const std::vector<BitPair>& layers) const;
  int64_t evaluations() const { return evaluations_; }

 private:
  std::shared_ptr<Model> model_;
  std::vector<std::vector<int64_t>> windows_;
  std::string mode_;
  int64_t prefill_;
  std::vector<std::vector<float>> base_;  // per window: [n - 1, vocab] log-probs of the full cache
  mutable int64_t evaluations_ = 0;
};

struct PairStats {
  double e_o = 0, e_k = 0, e_v = 0, tv = 0;  // local errors (means over probed positions)
  double kl = 0, nll = 0;                    // end to end: this layer at the pair, others KV8
};
struct Profile {
  std::vector<BitPair> pairs;              // candidate_pairs()
  std::vector<std::vector<PairStats>> at;  // [layer][pair]
  int64_t probed_positions = 0;            // per layer and pair
  double kl_all_kv8 = 0;
  double metric(int64_t layer, size_t pair, const std::string& sensitivity) const;
};

// The model layers the search covers, in the `kvtuner` store's layer order (see the top of this
// file): the global layers of a model with both kinds, else every layer.
std::vector<int64_t> searched_layers(const ModelConfig& c);

// Local errors of every searched layer at `pair` on the exact trajectory (see the top of this
// file), one entry per searched layer.
std::vector<PairStats> local_errors(std::shared_ptr<Model> model,
                                    const std::vector<std::vector<int64_t>>& windows,
                                    const BitPair& pair, const std::string& mode,
                                    int64_t prefill_tokens, int64_t every, int64_t* probed);

Profile profile_layers(std::shared_ptr<Model> model, const KlEvaluator& kl,
                       const std::vector<std::vector<int64_t>>& windows, const SearchOptions& o);

// Per layer: indices into profile.pairs of the pairs on the (bits, sensitivity) Pareto front,
// ascending by bits.
std::vector<std::vector<int32_t>> prune_pairs(const Profile& profile,
                                              const std::string& sensitivity);

struct LayerGroup {
  std::vector<int64_t> layers;      // ascending
  std::vector<int32_t> candidates;  // indices into candidate_pairs(), ascending by bits
};
std::vector<LayerGroup> cluster_layers(const Profile& profile,
                                       const std::vector<std::vector<int32_t>>& candidates,
                                       const std::string& sensitivity, double threshold,
                                       int64_t max_groups);

// The whole offline pipeline; returns the artifact (see the top of this file).
nlohmann::json run_search(std::shared_ptr<Model> model, const CalibrationData& data,
                          const SearchOptions& o);

// Writes the artifact to `path` and the pick under each budget B to "<path without
// .json>.b<B>.json" in the plain config format; returns the paths of the latter.
std::vector<std::string> write_artifact(const nlohmann::json& artifact, const std::string& path);

// sha256 of every weight tensor's bytes (format independent), in a fixed order.
std::string model_weights_sha256(const Model& model);

}  // namespace kvb::kvtuner
