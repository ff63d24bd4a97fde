#pragma once
// The text windows of a run (stream, probe): config.protocol.window checked against the model's
// context, then the windows of config.protocol.dataset; at least one, else kvb::Error naming the
// key.

#include <string>
#include <vector>

#include "harness/eval/protocol.h"
#include "harness/eval/runner.h"  // StreamWindow

namespace kvb {

std::vector<StreamWindow> checked_text_windows(const RunContext& ctx, std::string* dataset_hash);

}  // namespace kvb

namespace kvb {

// The grid's check of config.protocol.dataset: the corpus loads from the data path.
void check_dataset_input(const nlohmann::json& protocol, const std::string& data_dir,
                         const InputCheck& check);

}  // namespace kvb
