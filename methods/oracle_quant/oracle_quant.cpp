// oracle_quant: the bound of layer-wise mixed-precision KV quantization at a bit budget. Before
// the run, KVTuner's offline search (methods/kvtuner/kvtuner_search.h) runs with the EVAL's own
// windows as its calibration text and the eval's end-to-end KL as both the per-layer sensitivity
// and the search objective, over one group per layer (no clustering), exhaustively where the
// feasible space allows; the pick (or a uniform pair, when one beats it on the same windows) is
// stored through kvtuner's store. The stream protocol's windows are a deterministic function of
// its dataset, window, stride, max_windows and prefill_tokens, so the calibrator cuts the same
// windows from the same parameters (repeated in the method's params, hence in the config hash),
// and the store checks, through the hindsight pass the protocol hands it, that every window the
// run feeds is one it was tuned on. No deployable method can tune on the text it is scored on.

#include <ATen/ATen.h>

#include <cmath>
#include <memory>
#include <set>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/sha256.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/forwarding_kv_cache.h"
#include "harness/kv/hindsight.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/method_listing.h"
#include "methods/common/tensor_artifact.h"
#include "methods/kvtuner/kvtuner_search.h"

namespace kvb {
namespace {

constexpr const char* kName = "oracle_quant";

MethodInfo oracle_quant_info() {
  MethodInfo m = method_listing(
      kName,
      "oracle: KVTuner's per-layer (K bits, V bits) search run on the eval's own windows with "
      "their end-to-end KL, at an equivalent-bits budget; a bound, not deployable",
      "bounds Li et al., KVTuner (ICML 2025, arXiv 2502.04420)",
      {float_param("bits", 4, 2, 8,
                   "budget in KVTuner's equivalent bits: mean over layers of (bK + bV) / 2 "
                   "(scales, mins and the residual not counted)"),
       string_param("mode", "kivi", {"kivi", "per_token"},
                    "kvtuner's layout: kivi (per-channel K, per-token V, G=32, R=32) or "
                    "per_token (group = head_dim, R=0)"),
       int_param("max_exhaustive", 4096, 1, 1 << 20,
                 "exhaustive search when the feasible configs are at most this many, else "
                 "NSGA-II (kvtuner-search's, 150 evaluations, seed 0)"),
       string_param(
           "eval_dataset", "tinystories-valid-sample", {},
           "the stream protocol's dataset (must equal the run's: every window is checked)"),
       int_param("eval_window", 256, 2, 1 << 20, "the stream protocol's window"),
       int_param("eval_stride", 0, 0, 1 << 20, "the stream protocol's stride"),
       int_param("eval_max_windows", 4, 1, 1 << 20, "the stream protocol's max_windows"),
       int_param("eval_prefill_tokens", 1, 1, 1 << 20, "the stream protocol's prefill_tokens"),
       string_param("data_dir", "", {}, "where eval_dataset is found; \"\": the default data path"),
       string_param("cache_dir", "results/cache/oracle_quant", {},
                    "artifacts by content hash (\"\": kept in memory only)")});
  m.caps.quantizes = true;
  m.caps.oracle = true;
  m.caps.needs_hindsight = true;  // only protocols that hand the continuation (the check below)
  m.caps.needs_calibration = true;
  return m;
}

// The continuation the stream protocol hands an oracle for a window: the tokens after the
// prefilled prompt, the last one excluded (harness/eval/stream.cpp's feed_window).
std::string continuation_hash(const std::vector<int64_t>& c) {
  return sha256_hex(nlohmann::json(c).dump());
}

struct EvalWindows {
  std::vector<std::vector<int64_t>> windows;
  nlohmann::json info;  // dataset, its sha256, options, per-window hashes and continuation hashes
};

// The stream protocol's windows of the eval (harness/eval/stream_data.cpp does the same).
EvalWindows eval_windows(const Model& model, const nlohmann::json& p) {
  KVB_CHECK(!model.tokenizer_path.empty(), "method oracle_quant: model ", model.source,
            " has no tokenizer, so the eval's windows cannot be cut");
  const std::string dataset = p.at("eval_dataset");
  auto corpus = load_corpus(dataset, resolve_data_dir(p.at("data_dir")));
  Tokenizer tok(model.tokenizer_path);
  WindowOptions wo;
  wo.window_tokens = p.at("eval_window");
  wo.stride = p.at("eval_stride");
  wo.max_windows = p.at("eval_max_windows");
  wo.bos = tok.add_bos() ? "each" : "none";
  TextWindows w = make_windows(tok, corpus->text, wo, corpus->name);
  KVB_CHECK(!w.windows.empty(), "method oracle_quant.eval_dataset: ", dataset,
            " gives no window of ", wo.window_tokens, " tokens");
  const int64_t prefill = p.at("eval_prefill_tokens");
  EvalWindows out;
  nlohmann::json hashes = nlohmann::json::array(), conts = nlohmann::json::array();
  for (const auto& x : w.windows) {
    const int64_t n = static_cast<int64_t>(x.ids.size());
    const int64_t P = std::min<int64_t>(std::max<int64_t>(1, prefill), n - 1);
    hashes.push_back(x.hash);
    conts.push_back(continuation_hash(std::vector<int64_t>(x.ids.begin() + P, x.ids.end() - 1)));
    out.windows.push_back(x.ids);
  }
  out.info = {{"dataset", dataset},      {"corpus_sha256", corpus->sha256},
              {"windows_hash", w.hash},  {"window", wo.window_tokens},
              {"stride", wo.stride},     {"max_windows", wo.max_windows},
              {"bos", wo.bos},           {"prefill_tokens", prefill},
              {"window_hashes", hashes}, {"continuation_hashes", conts}};
  return out;
}

// The artifact: per layer (bK, bV) as fp32 [L, 2], and the search's figures on the eval windows
// [5]: the pick's KL, the best uniform pair's KL at the budget, configs evaluated, whether the
// search's own pick won (1) or a uniform pair (0), seconds.
std::map<std::string, at::Tensor> search_on_eval(const std::shared_ptr<Model>& model,
                                                 const EvalWindows& ew, const nlohmann::json& p) {
  const double bits = p.at("bits");
  kvtuner::SearchOptions o;
  o.mode = p.at("mode");
  o.budgets = {bits};
  o.sensitivity = "kl";     // the eval's own end-to-end KL, not a local proxy
  o.local_errors = false;   // which the KL sensitivity does not use
  o.cluster_threshold = 0;  // one group per layer: the oracle is not bound to KVTuner's clusters
  o.max_exhaustive = p.at("max_exhaustive");
  o.prefill_tokens = p.at("eval_prefill_tokens");
  kvtuner::CalibrationData data{ew.windows, ew.info};
  const nlohmann::json a = kvtuner::run_search(model, data, o);
  const nlohmann::json& pick = a.at("selected").at(0);
  // A uniform pair is in the search space only if every layer's pruned front kept it: the bound
  // takes whichever is lower on the same windows.
  double best_uniform = INFINITY;
  std::string uniform_pair;
  for (const auto& u : a.at("uniform"))
    if (u.at("equivalent_bits").get<double>() <= bits + 1e-9 &&
        u.at("kl_mean").get<double>() < best_uniform) {
      best_uniform = u.at("kl_mean");
      uniform_pair = u.at("pair");
    }
  // The layers the kvtuner store serves, as the search numbers them ("layers" keys 0..L-1).
  const int64_t L = static_cast<int64_t>(pick.at("layers").size());
  at::Tensor pairs = at::empty({L, 2}, at::kFloat);  // [layer, (k bits, v bits)]
  const bool search_won = pick.at("kl_mean").get<double>() <= best_uniform;
  if (search_won) {
    const nlohmann::json& layers = pick.at("layers");
    for (int64_t l = 0; l < L; ++l) {
      const auto& e = layers.at(std::to_string(l));
      pairs[l][0] = e.at("nbits_key").get<float>();
      pairs[l][1] = e.at("nbits_value").get<float>();
    }
  } else {
    for (const auto& c : kvtuner::candidate_pairs())
      if (c.name() == uniform_pair)
        for (int64_t l = 0; l < L; ++l) {
          pairs[l][0] = static_cast<float>(c.k);
          pairs[l][1] = static_cast<float>(c.v);
        }
  }
  at::Tensor tuned = at::tensor(
      {static_cast<float>(std::min(pick.at("kl_mean").get<double>(), best_uniform)),
       static_cast<float>(best_uniform),
       static_cast<float>(a.at("search").at("evaluated").get<double>()), search_won ? 1.f : 0.f,
       static_cast<float>(a.at("search").at("seconds_total").get<double>())},
      at::kFloat);
  return {{"pairs", pairs}, {"tuned", tuned}};
}

std::shared_ptr<const CalibrationArtifact> oracle_quant_calibrate(
    const std::shared_ptr<Model>& model, const nlohmann::json& p) {
  const double bits = p.at("bits");
  KVB_CHECK(bits >= 2, "method oracle_quant.bits: ", bits,
            " is below the cheapest pair, KV2 (2 equivalent bits)");
  const EvalWindows ew = eval_windows(*model, p);
  // The key covers the eval text (every window's tokens through its hash), the model's content
  // and everything that decides the search.
  const nlohmann::json inputs = {{"artifact", "oracle_quant.pairs/1"},
                                 {"model", model_content_hash(*model)},
                                 {"eval", ew.info},
                                 {"bits", bits},
                                 {"mode", p.at("mode")},
                                 {"max_exhaustive", p.at("max_exhaustive")}};
  return cached_tensor_artifact(kName, inputs, p.at("cache_dir"),
                                [&] { return search_on_eval(model, ew, p); });
}

// kvtuner's store with the tuned pairs; as a HindsightCache it sees each window's continuation
// before the prompt is compressed, and refuses a window the pairs were not tuned on.
class OracleQuantKvCache : public ForwardingKvCache, public HindsightCache {
 public:
  OracleQuantKvCache(std::unique_ptr<KvCache> inner, std::set<std::string> tuned_on,
                     std::map<std::string, double> extra)
      : ForwardingKvCache(std::move(inner)),
        tuned_on_(std::move(tuned_on)),
        extra_(std::move(extra)) {}

  std::string name() const override { return kName; }

  int64_t run_hindsight_pass(const HindsightPass& pass) override {
    KVB_CHECK(pass.continuations.size() == 1 && pass.question_tokens.size() == 1 &&
                  pass.question_tokens[0] == 0,
              "method oracle_quant: tunes on the stream protocol's windows only; this protocol "
              "hands ",
              pass.continuations.size(), " continuations with questions");
    KVB_CHECK(tuned_on_.count(continuation_hash(pass.continuations[0])) != 0,
              "method oracle_quant: the run feeds a window its bits were not tuned on; set "
              "method.params.eval_dataset, eval_window, eval_stride, eval_max_windows and "
              "eval_prefill_tokens to the stream protocol's dataset, window, stride, max_windows "
              "and prefill_tokens");
    checked_.insert(pass.seq);
    ++windows_checked_;
    return 0;
  }

  void end_prefill(int64_t seq_id) override {
    KVB_CHECK(checked_.count(seq_id) != 0, "method oracle_quant: sequence ", seq_id,
              " ended its prefill without the hindsight pass; only the stream protocol can run "
              "oracle_quant");
    ForwardingKvCache::end_prefill(seq_id);
  }

  void release(int64_t seq_id) override {
    checked_.erase(seq_id);
    ForwardingKvCache::release(seq_id);
  }

  std::map<std::string, double> counters() const override {
    auto c = ForwardingKvCache::counters();
    for (const auto& [k, v] : extra_) c[k] = v;
    c["oracle_windows_checked"] = static_cast<double>(windows_checked_);
    return c;
  }

 private:
  std::set<std::string> tuned_on_;  // continuation hashes of the eval's windows
  std::map<std::string, double> extra_;
  std::set<int64_t> checked_;
  int64_t windows_checked_ = 0;
};

std::unique_ptr<KvCache> make_oracle_quant(const CacheContext& ctx, const nlohmann::json& p) {
  KVB_ASSERT(ctx.calibration != nullptr, kName, "built without its artifact");
  const auto* art = dynamic_cast<const TensorArtifact*>(ctx.calibration.get());
  KVB_ASSERT(art != nullptr, kName, "the artifact is not a tensor artifact");
  const at::Tensor& pairs = art->get("pairs");  // [L, 2]
  const at::Tensor& tuned = art->get("tuned");  // [5]
  const int64_t L = ctx.config.n_layers;
  KVB_CHECK(pairs.dim() == 2 && pairs.size(0) == L && pairs.size(1) == 2 && tuned.numel() == 5,
            "method oracle_quant: artifact ", art->path, " holds pairs for ", pairs.size(0),
            " layers, the model has ", L, "; delete it to recalibrate");
  std::vector<kvtuner::BitPair> layers(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    layers[l].k = static_cast<int32_t>(pairs[l][0].item<float>());
    layers[l].v = static_cast<int32_t>(pairs[l][1].item<float>());
  }
  const double bits = p.at("bits");
  KVB_CHECK(kvtuner::equivalent_bits(layers) <= bits + 1e-9, "method oracle_quant: artifact ",
            art->path, " holds ", kvtuner::pairs_string(layers), ", above the budget of ", bits,
            " bits; delete it to recalibrate");
  std::set<std::string> tuned_on;
  for (const auto& h : art->meta.at("eval").at("continuation_hashes"))
    tuned_on.insert(h.get<std::string>());
  std::map<std::string, double> extra = {
      {"oracle_tuned_kl_mean", tuned[0].item<float>()},
      {"oracle_best_uniform_kl_mean", tuned[1].item<float>()},
      {"oracle_configs_evaluated", tuned[2].item<float>()},
      {"oracle_search_pick", tuned[3].item<float>()},
      {"oracle_tuned_windows", static_cast<double>(tuned_on.size())},
      {"bits_budget", bits}};
  auto inner = MethodRegistry::instance().create(
      "kvtuner", ctx, {{"pairs", kvtuner::pairs_string(layers)}, {"mode", p.at("mode")}});
  return std::make_unique<OracleQuantKvCache>(std::move(inner), std::move(tuned_on),
                                              std::move(extra));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_CALIBRATED_METHOD(oracle_quant, kvb::oracle_quant_info, kvb::make_oracle_quant,
                               kvb::oracle_quant_calibrate);
