// The probe protocol (harness/eval/probe.h): per-layer fidelity against exact attention, one sample
// per text window.

#include "harness/eval/probe.h"

#include "harness/eval/protocol_registry.h"
#include "harness/eval/protocols/text_windows.h"

namespace kvb {
namespace {

class ProbeRun : public WindowRun {
 public:
  explicit ProbeRun(const RunContext& ctx) : WindowRun(ctx) {
    std::string dataset_hash;  // probe samples do not record it
    windows_ = checked_text_windows(ctx, &dataset_hash);
    opts_.prefill_tokens = proto_["prefill_tokens"];
    opts_.every = proto_["every"];
  }
  SampleOutput run_sample(int64_t i, const StoredSamples&) override {
    return {run_probe_sample(model_, method_, method_params_, windows_[i].tokens, opts_).to_json(),
            ""};
  }
  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    return probe_metrics(parsed<ProbeSampleResult>(stored));
  }

 private:
  ProbeOptions opts_;
};

class ProbeProtocol : public PlannedProtocol<ProbeRun> {
 public:
  ProbeProtocol()
      : PlannedProtocol(
            "probe",
            "per-layer fidelity against exact attention at sampled decode positions (the "
            "method's and an exact cache get the same inputs): attention-output, key, value and "
            "attention-probability error",
            {string_param("dataset", "tinystories-valid-sample", {}, "corpus name or .txt path"),
             int_param("window", 256, 3, 1 << 20, "tokens per window (BOS included)"),
             int_param("max_windows", 2, 1, 1 << 20, "windows probed (samples)"),
             int_param("prefill_tokens", 64, 1, 1 << 20, "tokens prefilled (and compressed) first"),
             int_param("every", 16, 1, 1 << 20, "probe every n-th decode position"),
             int_param("stride", 0, 0, 1 << 20, "tokens between window starts; 0: window")}) {
    info_.needs_tokenizer = true;
    info_.report.default_metric = "attn_output_rel_err";
  }
  void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                          const std::string&, const InputCheck& check) const override {
    check_window_input(resolved, model, check);
  }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(probe, kvb::ProbeProtocol);
