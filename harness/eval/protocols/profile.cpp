// The profile protocol (harness/eval/profile.h): the attention workload of a model on a text, per
// layer and KV head, on the exact cache; one sample per text window.

#include "harness/eval/profile.h"

#include <random>

#include "harness/common/error.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/protocols/text_windows.h"
#include "harness/kv/baseline_method.h"
#include "harness/kv/method.h"
#include "harness/metrics/portable_random.h"

namespace kvb {
namespace {

// The dataset name for seeded random tokens: a model without a tokenizer (synthetic presets).
constexpr const char* kRandomTokens = "random-tokens";

std::vector<StreamWindow> random_windows(const RunContext& ctx) {
  const nlohmann::json& proto = ctx.protocol();
  const int64_t window = proto["window"], count = proto["max_windows"];
  const int64_t vocab = ctx.model->config.vocab_size;
  check_window_fits(proto, ctx.model->config.max_seq_len, ctx.model->source);
  std::vector<StreamWindow> out;
  for (int64_t w = 0; w < count; ++w) {
    std::mt19937_64 rng(ctx.seed() * 1000003ULL + static_cast<uint64_t>(w));
    StreamWindow sw;
    for (int64_t i = 0; i < window; ++i)
      sw.tokens.push_back(static_cast<int64_t>(uniform_index(rng, vocab)));
    sw.key = std::string(kRandomTokens) + ":" + std::to_string(ctx.seed()) + ":" +
             std::to_string(w) + ":" + std::to_string(window);
    out.push_back(std::move(sw));
  }
  return out;
}

class ProfileRun : public WindowRun {
 public:
  explicit ProfileRun(const RunContext& ctx) : WindowRun(ctx) {
    // The profile reads the exact cache itself; a method's store would go unused, so any other
    // method is refused rather than ignored.
    KVB_CHECK(method_ == baseline_method(),
              "config.method: the profile protocol measures the exact cache; method must be '",
              baseline_method(), "', not '", method_, "'");
    opts_.decode_steps = proto_["decode_steps"];
    opts_.top_k = proto_["top_k"];
    opts_.cluster_rows = proto_["cluster_rows"];
    opts_.scan_share = proto_["scan_share"];
    opts_.kmeans_iterations = proto_["kmeans_iterations"];
    opts_.quant_group = proto_["quant_group"];
    const int64_t window = proto_["window"];
    KVB_CHECK(opts_.decode_steps < window, "config.protocol.decode_steps: ", opts_.decode_steps,
              " decode steps need a window longer than that (window ", window, ")");
    const std::string dataset = proto_["dataset"];
    if (dataset == kRandomTokens) {
      windows_ = random_windows(ctx);
    } else {
      KVB_CHECK(!ctx.model->tokenizer_path.empty(), "config.protocol.dataset: '", dataset,
                "' is text and the model has no tokenizer; use '", kRandomTokens, "'");
      std::string dataset_hash;
      windows_ = checked_text_windows(ctx, &dataset_hash);
    }
  }
  SampleOutput run_sample(int64_t i, const StoredSamples&) override {
    return {run_profile_sample(model_, windows_[i].tokens, opts_).to_json(), ""};
  }
  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    return profile_metrics(parsed<ProfileSampleResult>(stored));
  }

 private:
  ProfileOptions opts_;
};

class ProfileProtocol : public PlannedProtocol<ProfileRun> {
 public:
  ProfileProtocol()
      : PlannedProtocol(
            "profile",
            "the attention workload on the exact cache, per layer and KV head, over the last "
            "decode_steps tokens of each window: recency, sink mass, entropy and support, top-k "
            "overlap and reuse across steps, clustered-index recall, key/value quantization "
            "sensitivity (method must be full)",
            {string_param("dataset", "tinystories-valid-sample", {},
                          "corpus name or .txt path; 'random-tokens': seeded random ids (no "
                          "tokenizer needed)"),
             int_param("window", 256, 3, 1 << 20,
                       "context length: tokens per window (BOS included)"),
             int_param("max_windows", 2, 1, 1 << 20, "windows profiled (samples)"),
             int_param("stride", 0, 0, 1 << 20, "tokens between window starts; 0: window"),
             int_param("decode_steps", 16, 2, 1 << 20,
                       "last tokens of the window decoded and measured"),
             int_param("top_k", 32, 1, 1 << 20,
                       "rows of the top-k measures (overlap, reuse, recall, captures)"),
             int_param("cluster_rows", 32, 1, 1 << 20,
                       "mean rows per k-means cluster of the clustered index"),
             float_param("scan_share", 0.1, 1e-6, 1.0,
                         "share of the rows the clustered index scans"),
             int_param("kmeans_iterations", 8, 0, 1000, "Lloyd iterations of the clustered index"),
             int_param("quant_group", 32, 1, 4096, "group size of the key/value quantization")}) {
    info_.report.default_metric = "temporal_capture";
    info_.report.ranks_methods = false;  // it measures the workload on the full cache alone
  }
  int64_t expected_samples(const nlohmann::json& protocol) const override {
    return protocol.at("max_windows").get<int64_t>();
  }
  void check_inputs(const nlohmann::json& protocol, const std::string& data_dir,
                    const InputCheck& check) const override {
    if (protocol.at("dataset").get<std::string>() != kRandomTokens)
      check_dataset_input(protocol, data_dir, check);
  }
  void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                          const std::string&, const InputCheck& check) const override {
    check_window_input(resolved, model, check);
  }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(profile, kvb::ProfileProtocol);
