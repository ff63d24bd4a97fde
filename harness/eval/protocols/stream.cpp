// The stream protocol (harness/eval/stream.h): teacher-forced text windows, one sample per window.

#include "harness/eval/stream.h"

#include "harness/eval/protocol_registry.h"
#include "harness/eval/protocols/text_windows.h"

namespace kvb {
namespace {

class StreamRun : public WindowRun {
 public:
  explicit StreamRun(const RunContext& ctx) : WindowRun(ctx) {
    windows_ = checked_text_windows(ctx, &dataset_hash_);
    opts_.prefill_tokens = proto_["prefill_tokens"];
    opts_.prefill_chunk = proto_["prefill_chunk"];
    opts_.cache_dir = ctx.env.cache_dir;
  }
  SampleOutput run_sample(int64_t i, const StoredSamples&) override {
    StreamSampleResult r =
        run_stream_sample(model_, method_, method_params_, windows_[i].tokens, opts_);
    nlohmann::json j = r.to_json();
    j["dataset_hash"] = dataset_hash_;
    double kl = 0;
    for (float k : r.kl) kl += k;
    return {j, "sample " + std::to_string(i + 1) + "/" + std::to_string(windows_.size()) +
                   ": nll " + std::to_string(r.nll_sum / std::max<int64_t>(1, r.tokens)) +
                   " kl_mean " + std::to_string(r.tokens ? kl / r.tokens : 0.0)};
  }

  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    return stream_metrics(parsed<StreamSampleResult>(stored), caps_.simulated);
  }

 private:
  std::string dataset_hash_;
  StreamOptions opts_;
};

class StreamProtocol : public PlannedProtocol<StreamRun> {
 public:
  StreamProtocol()
      : PlannedProtocol("stream",
                        "teacher-forced text windows with the method active while decoding; "
                        "NLL, perplexity and KL / top-1 against the full cache",
                        {string_param("dataset", "tinystories-valid-sample", {},
                                      "corpus name in the data path, or a path to a .txt file"),
                         int_param("window", 256, 2, 1 << 20, "tokens per window (BOS included)"),
                         int_param("stride", 0, 0, 1 << 20,
                                   "tokens between window starts; 0: window (no overlap)"),
                         int_param("max_windows", 4, 1, 1 << 20, "windows scored (samples)"),
                         int_param("skip_tokens", 0, 0, 1 << 30,
                                   "unset or 0: windows from the text's start; n: the first "
                                   "window starts n content tokens in (text held out from a "
                                   "calibration span before it)")
                             .unset_by_default(),
                         int_param("prefill_tokens", 1, 1, 1 << 20,
                                   "tokens prefilled before token-by-token decoding (1: only BOS)"),
                         int_param("prefill_chunk", 512, 1, 1 << 20, "tokens per prefill step")}) {
    info_.needs_tokenizer = true;
    ProtocolReport& r = info_.report;
    r.sample_metrics = {table_sample_metric("kl_mean"),
                        table_sample_metric("ppl", "nll", true),
                        table_sample_metric("nll"),
                        table_sample_metric("top1_agreement"),
                        table_sample_metric("mean_abs_dprob"),
                        table_sample_metric("bytes_per_token")};
    r.default_metric = "kl_mean";
    r.secondary_metrics = {"ppl", "kl_mean"};  // perplexity beside KL, KL beside perplexity
    r.max_secondary = 1;
    r.always_shown_settings = {"window", "max_windows"};
    r.shows_top1 = true;
  }
  // The window's tokens after the prompt are the continuation an oracle compresses with.
  bool hands_hindsight(const nlohmann::json&) const override { return true; }
  int64_t expected_samples(const nlohmann::json& proto) const override {
    return proto["max_windows"].get<int64_t>();
  }
  void check_inputs(const nlohmann::json& proto, const std::string& data_dir,
                    const InputCheck& check) const override {
    check_dataset_input(proto, data_dir, check);
  }
  void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                          const std::string&, const InputCheck& check) const override {
    check_window_input(resolved, model, check);
  }

  void sample_sums(const nlohmann::json& j, const SampleSumSink& put) const override {
    const double tokens = sample_number(j, "tokens");
    double kl = 0;
    if (j.contains("kl") && j["kl"].is_array())
      for (const auto& x : j["kl"]) kl += x.is_number() ? x.get<double>() : 0.0;
    put("kl_mean", kl, tokens);
    put("nll", sample_number(j, "nll_sum"), tokens);
    put("top1_agreement", sample_number(j, "top1_agree"), tokens);
    put("mean_abs_dprob", sample_number(j, "abs_dprob_sum"), tokens);
  }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(stream, kvb::StreamProtocol);
