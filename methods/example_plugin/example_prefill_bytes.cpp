// example_prefill_bytes: a complete out-of-tree protocol. One sample per prompt length: a fixed
// pseudo-random prompt (from the run's seed, so no tokenizer is needed) is prefilled once with the
// run's method and once with the baseline method (full), and the sample records the bytes each
// cache holds afterwards. Metrics: bytes held per prompt token, and the share of the baseline's
// bytes.

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/protocol_registry.h"
#include "harness/kv/baseline_method.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"

namespace {

// Bytes the cache of `method` holds after prefilling `prompt` into one sequence.
int64_t held_bytes(const std::shared_ptr<kvb::Model>& model, const std::string& method,
                   const nlohmann::json& params, const std::vector<int64_t>& prompt,
                   int64_t chunk) {
  kvb::CacheContext ctx{model->config, model->device, model->dtype, model};
  kvb::EngineOptions eo;
  eo.prefill_chunk = chunk;
  kvb::Engine e(model, kvb::MethodRegistry::instance().create(method, ctx, params), eo);
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {prompt});
  return e.kv().footprint().physical_bytes();
}

class PrefillBytesRun : public kvb::ProtocolRun {
 public:
  explicit PrefillBytesRun(const kvb::RunContext& ctx)
      : model_(ctx.model),
        method_(ctx.method.name),
        params_(ctx.method_params),
        chunk_(ctx.protocol().at("prefill_chunk")) {
    lengths_ = kvb::protocol_int_list(ctx.protocol(), "lengths", "prompt length", 1,
                                      model_->config.max_seq_len);
    std::mt19937_64 rng(ctx.seed());
    const int64_t longest = *std::max_element(lengths_.begin(), lengths_.end());
    for (int64_t i = 0; i < longest; ++i)
      prompt_.push_back(
          static_cast<int64_t>(rng() % static_cast<uint64_t>(model_->config.vocab_size)));
  }
  int64_t samples() const override { return static_cast<int64_t>(lengths_.size()); }
  std::string sample_key(int64_t i) const override {
    return "tokens=" + std::to_string(lengths_[i]);
  }

  kvb::SampleOutput run_sample(int64_t i, const kvb::StoredSamples&) override {
    const std::vector<int64_t> prompt(prompt_.begin(), prompt_.begin() + lengths_[i]);
    const int64_t held = held_bytes(model_, method_, params_, prompt, chunk_);
    const int64_t full = held_bytes(model_, kvb::baseline_method(),
                                    nlohmann::json::object(), prompt, chunk_);
    return {{{"tokens", lengths_[i]}, {"held_bytes", held}, {"full_bytes", full}},
            "prefilled " + std::to_string(lengths_[i]) + " tokens: " + std::to_string(held) +
                " bytes held"};
  }

  std::vector<kvb::Metric> metrics(const kvb::StoredSamples& stored) const override {
    double tokens = 0, held = 0, full = 0;
    for (const auto& s : stored.outputs()) {
      tokens += s.at("tokens").get<double>();
      held += s.at("held_bytes").get<double>();
      full += s.at("full_bytes").get<double>();
    }
    return {
        {"prefill_held_bytes_per_token", held / tokens, "bytes/token", kvb::Direction::kLower},
        {"prefill_held_vs_full", full > 0 ? held / full : NAN, "fraction", kvb::Direction::kLower}};
  }

 private:
  std::shared_ptr<kvb::Model> model_;
  std::string method_;
  nlohmann::json params_;
  int64_t chunk_;
  std::vector<int64_t> lengths_, prompt_;
};

class PrefillBytesProtocol : public kvb::Protocol {
 public:
  kvb::ProtocolInfo info() const override {
    kvb::ProtocolInfo p;
    p.name = "example_prefill_bytes";
    p.summary =
        "example plugin: KV bytes held after prefilling fixed prompts, against the full cache";
    p.params = {
        kvb::string_param("lengths", "64,128", {}, "comma-separated prompt lengths (samples)"),
        kvb::int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step")};
    p.report.default_metric = "prefill_held_vs_full";
    return p;
  }
  std::unique_ptr<kvb::ProtocolRun> plan(const kvb::RunContext& ctx) const override {
    return std::make_unique<PrefillBytesRun>(ctx);
  }
};

}  // namespace

std::unique_ptr<kvb::Protocol> example_prefill_bytes_protocol() {
  return std::make_unique<PrefillBytesProtocol>();
}
