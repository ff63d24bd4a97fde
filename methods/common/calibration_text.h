#pragma once
// Calibration text run through a model: the part every calibrating method shares. A corpus is cut
// into `samples` sequences of `tokens` tokens (BOS first, after `skip_tokens` corpus tokens that
// keep evaluation text out), each prefilled alone through the full cache while an observer sees
// every layer's inputs (the queries, keys before and after RoPE, values and positions), so a method
// accumulates its statistic without holding the whole calibration set. The parameters are the same
// for every method (calib_corpus, calib_samples, calib_tokens, calib_skip_tokens, data_dir,
// cache_dir), and their JSON, with the corpus text's sha256, is part of the artifact's key.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/params.h"
#include "harness/kv/kv_cache.h"

namespace kvb {

class Model;

struct CalibrationText {
  std::string corpus = "tinystories-valid-sample";  // built-in corpus name or a .txt path
  std::string data_dir;                             // "" = resolve_data_dir()
  int64_t samples = 8;                              // sequences
  int64_t tokens = 512;  // per sequence, BOS included; at most the model's max_seq_len
  int64_t skip_tokens = 32768;
  std::string cache_dir;  // artifacts by content hash; "" = not saved
};

// The schema entries, with a method's own defaults; cache_dir defaults to results/cache/<method>.
std::vector<ParamSpec> calibration_text_params(const std::string& method, int64_t samples,
                                               int64_t tokens);
CalibrationText parse_calibration_text(const nlohmann::json& p);

// What decides the calibration data: the options (cache_dir and data_dir excluded: where files
// live does not change them) and the corpus text's sha256. Loads the corpus (errors name it).
nlohmann::json calibration_text_json(const CalibrationText& t);

// The calibration sequences as token ids: `samples` windows of the corpus, BOS first, `tokens` long
// (at most the model's max_seq_len), after `skip_tokens`. Throws kvb::Error naming the corpus when
// it holds too few tokens, or the model when it has no tokenizer.
std::vector<std::vector<int64_t>> calibration_windows(const Model& model, const CalibrationText& t);

// Called for every layer of every prefill step of sample `sample` (one sequence per step).
using LayerObserver = std::function<void(int64_t sample, const LayerInput& in)>;

// Runs the samples through `model` (its own Engine over the full cache) and returns the sequences
// run. Throws kvb::Error naming the corpus when it holds too few tokens, or the model when it has
// no tokenizer.
int64_t run_calibration_text(const std::shared_ptr<Model>& model, const CalibrationText& t,
                             const LayerObserver& observe);

}  // namespace kvb
