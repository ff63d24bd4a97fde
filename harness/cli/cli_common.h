#pragma once
// Options every model-using subcommand shares, and the helpers that turn them into a loaded model.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "harness/common/params.h"
#include "harness/model/model.h"
#include "harness/formats/tokenizer.h"

namespace kvb::cli {

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

// A parameter schema as `kvbench methods NAME` and `kvbench protocols NAME` print it.
void print_param_specs(const std::vector<ParamSpec>& params);

// Registration of each subcommand (one file each).
void register_generate(CLI::App& app);
void register_score(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_methods(CLI::App& app);
void register_protocols(CLI::App& app);
void register_run(CLI::App& app);
void register_grid(CLI::App& app);
void register_merge(CLI::App& app);
void register_leaderboard(CLI::App& app);
void register_compare(CLI::App& app);
void register_train(CLI::App& app);
void register_kvtuner_search(CLI::App& app);
void register_dms_train(CLI::App& app);
void register_packet_train(CLI::App& app);
void register_tokenize(CLI::App& app);

}  // namespace kvb::cli
