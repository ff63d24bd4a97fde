// The perf protocol (harness/eval/perf.h): throughput at each batch size, one sample (cell) per
// size.

#include "harness/eval/perf.h"

#include "harness/common/error.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/protocols/model_run.h"
#include "harness/model/model.h"

namespace kvb {
namespace {

std::vector<int64_t> batch_sizes(const nlohmann::json& proto) {
  return protocol_int_list(proto, "batch_sizes", "batch size", 1, 4096);
}

// The prompt within the model's context. The decode steps after it may run past the context: what
// they time does not depend on what the positions mean.
void check_context_fits(const nlohmann::json& proto, int64_t context_tokens,
                        const std::string& model) {
  const int64_t context = proto.at("context");
  KVB_CHECK(context_tokens <= 0 || context <= context_tokens, "config.protocol.context: ", context,
            " prompt tokens is longer than the context of ", model, " (", context_tokens,
            " tokens)");
}

class PerfRun : public ModelRun {
 public:
  explicit PerfRun(const RunContext& ctx) : ModelRun(ctx), batches_(batch_sizes(proto_)) {
    check_context_fits(proto_, model_->config.max_seq_len, model_->source);
  }
  int64_t samples() const override { return static_cast<int64_t>(batches_.size()); }
  std::string sample_key(int64_t i) const override {
    return "batch=" + std::to_string(batches_[i]);
  }

  SampleOutput run_sample(int64_t i, const StoredSamples&) override {
    PerfCell c =
        run_perf_cell(model_, method_, method_params_, batches_[i], proto_["context"],
                      proto_["decode_tokens"], proto_["repeats"], proto_["prefill_chunk"], seed_);
    return {c.to_json(), "batch " + std::to_string(batches_[i]) + ": decode " +
                             std::to_string(c.decode_tok_s) + " tok/s"};
  }
  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    return perf_metrics(parsed<PerfCell>(stored), caps_.simulated);
  }

 private:
  std::vector<int64_t> batches_;
};

class PerfProtocol : public PlannedProtocol<PerfRun> {
 public:
  PerfProtocol()
      : PlannedProtocol(
            "perf",
            "throughput: prefill tok/s, decode tok/s, time to first token and per output token",
            {int_param("context", 512, 2, 1 << 22,
                       "prompt tokens per sequence, at most the model's context (the decode "
                       "steps after it may run past it)"),
             int_param("decode_tokens", 64, 1, 1 << 20, "tokens generated per sequence"),
             string_param("batch_sizes", "1", {}, "comma-separated batch sizes, e.g. \"1,16\""),
             int_param("repeats", 3, 1, 1000, "timed repeats after one warm-up"),
             int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step")}) {
    ProtocolReport& r = info_.report;
    r.sample_metrics = {table_sample_metric("decode_tok_s"), table_sample_metric("prefill_tok_s"),
                        table_sample_metric("ttft_ms"), table_sample_metric("tpot_ms"),
                        table_sample_metric("bytes_per_token")};
    r.default_metric = "decode_tok_s";
    r.always_shown_settings = {"context", "decode_tokens", "batch_sizes"};
    r.measures_throughput = true;
    r.table_order = 1;
  }
  int64_t expected_samples(const nlohmann::json& proto) const override {
    return static_cast<int64_t>(batch_sizes(proto).size());
  }
  void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                          const std::string&, const InputCheck& check) const override {
    const nlohmann::json& proto = resolved.at("protocol");
    check("perf context:" + model.spec + ":" + proto.at("context").dump(),
          [&] { check_context_fits(proto, model.context_tokens, model.spec); });
  }

  // One cell per batch size: the cell's own figures (den 1); its ledger fields are top-level.
  void sample_sums(const nlohmann::json& j, const SampleSumSink& put) const override {
    put("decode_tok_s", sample_number(j, "decode_tok_s", NAN), 1);
    put("prefill_tok_s", sample_number(j, "prefill_tok_s", NAN), 1);
    put("ttft_ms", sample_number(j, "ttft_ms", NAN), 1);
    put("tpot_ms", sample_number(j, "tpot_ms_p50", NAN), 1);
    put("bytes_per_token", sample_number(j, "physical_bytes", NAN),
        sample_number(j, "tokens_seen", 0));
  }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(perf, kvb::PerfProtocol);
