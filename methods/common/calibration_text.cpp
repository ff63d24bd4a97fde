#include "methods/common/calibration_text.h"

#include <algorithm>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/observed_kv_cache.h"

namespace kvb {

namespace {

int64_t sequence_tokens(const Model& m, const CalibrationText& t) {
  return m.config.max_seq_len > 0 ? std::min(t.tokens, m.config.max_seq_len) : t.tokens;
}

}  // namespace

std::vector<ParamSpec> calibration_text_params(const std::string& method, int64_t samples,
                                               int64_t tokens) {
  return {string_param("calib_corpus", "tinystories-valid-sample", {},
                       "calibration text: a built-in corpus name or a .txt path"),
          int_param("calib_samples", samples, 1, 1 << 20, "calibration sequences"),
          int_param("calib_tokens", tokens, 2, 1 << 24,
                    "tokens per calibration sequence, BOS included (at most the model's "
                    "max_seq_len)"),
          int_param("calib_skip_tokens", 32768, 0, 1 << 30,
                    "corpus tokens skipped before calibration (keeps the evaluation text out)"),
          string_param("data_dir", "", {},
                       "where calib_corpus lives (\"\": $KVBENCH_DATA, ./data, ../shared/data)"),
          string_param("cache_dir", "results/cache/" + method, {},
                       "calibration artifacts, by content hash (\"\": not saved)")};
}

CalibrationText parse_calibration_text(const nlohmann::json& p) {
  CalibrationText t;
  t.corpus = p.at("calib_corpus").get<std::string>();
  t.samples = p.at("calib_samples").get<int64_t>();
  t.tokens = p.at("calib_tokens").get<int64_t>();
  t.skip_tokens = p.at("calib_skip_tokens").get<int64_t>();
  t.data_dir = p.at("data_dir").get<std::string>();
  t.cache_dir = p.at("cache_dir").get<std::string>();
  return t;
}

nlohmann::json calibration_text_json(const CalibrationText& t) {
  auto corpus = load_corpus(t.corpus, resolve_data_dir(t.data_dir));
  return {{"corpus", t.corpus},
          {"corpus_sha256", corpus->sha256},
          {"samples", t.samples},
          {"tokens", t.tokens},
          {"skip_tokens", t.skip_tokens}};
}

std::vector<std::vector<int64_t>> calibration_windows(const Model& model,
                                                      const CalibrationText& t) {
  KVB_CHECK(!model.tokenizer_path.empty(), "calibration: model ", model.source,
            " has no tokenizer to read calibration text ", t.corpus, " with");
  auto corpus = load_corpus(t.corpus, resolve_data_dir(t.data_dir));
  Tokenizer tok(model.tokenizer_path);
  const int64_t content = sequence_tokens(model, t) - 1;
  const int64_t need = t.skip_tokens + t.samples * content;
  const std::vector<int64_t> ids = encode_long_text(tok, corpus->text, need);
  KVB_CHECK(static_cast<int64_t>(ids.size()) >= need, "calibration: corpus ", t.corpus, " holds ",
            ids.size(), " tokens, fewer than calib_skip_tokens ", t.skip_tokens, " + ", t.samples,
            " samples x ", content, " tokens");
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < t.samples; ++s) {
    std::vector<int64_t> seq = {model.config.bos_id};
    const auto from = ids.begin() + t.skip_tokens + s * content;
    seq.insert(seq.end(), from, from + content);
    out.push_back(std::move(seq));
  }
  return out;
}

int64_t run_calibration_text(const std::shared_ptr<Model>& model, const CalibrationText& t,
                             const LayerObserver& observe) {
  const std::vector<std::vector<int64_t>> windows = calibration_windows(*model, t);
  CacheContext ctx{model->config, model->device, model->dtype};
  int64_t sample = 0;
  auto observer = std::make_unique<ObservedKvCache>(
      MethodRegistry::instance().create("full", ctx, nlohmann::json::object()),
      [&](const LayerInput& in) {
        KVB_ASSERT(in.batch->batch_size() == 1, "calibration text", "one sequence per step, got ",
                   in.batch->batch_size());
        observe(sample, in);
      });
  EngineOptions eo;
  eo.prefill_chunk = sequence_tokens(*model, t);
  Engine e(model, std::move(observer), eo);
  for (const auto& seq : windows) {
    const int64_t id = e.new_sequence();
    e.prefill({id}, {seq}, nullptr, /*call_end_prefill=*/false);
    e.release(id);
    ++sample;
  }
  return t.samples;
}

}  // namespace kvb
