#pragma once
// The text windows of a run (stream, probe, profile): config.protocol.window checked against the
// model's context, then the windows of config.protocol.dataset; at least one, else kvb::Error
// naming the key. A WindowRun has one sample per window, keyed by the window.

#include <string>
#include <vector>

#include "harness/eval/protocol.h"
#include "harness/eval/protocols/model_run.h"
#include "harness/eval/runner.h"  // StreamWindow

namespace kvb {

std::vector<StreamWindow> checked_text_windows(const RunContext& ctx, std::string* dataset_hash);

// config.protocol.window within the context `context_tokens` that `model` declares; kvb::Error
// naming the key and both lengths.
void check_window_fits(const nlohmann::json& protocol, int64_t context_tokens,
                       const std::string& model);

// A protocol's grid check of its window against the cell's model (Protocol::check_model_inputs).
void check_window_input(const nlohmann::json& resolved, const ModelFacts& model,
                        const InputCheck& check);

// A run whose samples are the windows_ its constructor fills, each keyed as its window.
class WindowRun : public ModelRun {
 public:
  int64_t samples() const override { return static_cast<int64_t>(windows_.size()); }
  std::string sample_key(int64_t i) const override { return windows_[i].key; }

 protected:
  using ModelRun::ModelRun;
  std::vector<StreamWindow> windows_;
};

}  // namespace kvb

namespace kvb {

// The grid's check of config.protocol.dataset: the corpus loads from the data path.
void check_dataset_input(const nlohmann::json& protocol, const std::string& data_dir,
                         const InputCheck& check);

}  // namespace kvb
