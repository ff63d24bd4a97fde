#pragma once
// The options every model-using subcommand shares (--model, --device, --dtype, ...) and the helpers
// that turn them into a loaded model, a tokenizer and a checked results-DB path. Below the methods
// (kvb_harness), so that a method's tool (tool_registry.h) has the same flags as the built-in
// subcommands of harness/cli.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "harness/formats/tokenizer.h"
#include "harness/model/model.h"

namespace kvb::tool {

struct ModelArgs {
  std::string model = "stories260K";
  std::string models_dir;
  std::string device = "cpu";
  std::string dtype = "fp32";
  int threads = 0;  // 0: LibTorch's default
  uint64_t synthetic_seed = 0;
};

void add_model_options(CLI::App* app, ModelArgs* a);
// Applies --threads and loads the model (logging to stderr).
std::shared_ptr<Model> load_model_from_args(const ModelArgs& a);
// Refuses a results-DB path whose rows SQLite would discard at exit (":memory:", and "" which SQLite
// opens as a private temporary file): a run or grid into it would report success and keep nothing.
void check_db_path(const std::string& path, const std::string& flag);
// The model's tokenizer; throws naming the model when it has none.
std::unique_ptr<Tokenizer> load_tokenizer(const Model& m);

}  // namespace kvb::tool
