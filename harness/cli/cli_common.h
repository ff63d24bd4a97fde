#pragma once
// What the built-in subcommands share: the model options (harness/tool/model_options.h) and the
// registration function of each subcommand. Method tools are not here: see harness/tool/tool_registry.h.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/common/params.h"
#include "harness/tool/model_options.h"

namespace kvb::cli {

// The shared model options live below the methods (harness/tool) so that method tools use them too.
using tool::ModelArgs;
using tool::add_model_options;
using tool::check_db_path;
using tool::load_model_from_args;
using tool::load_tokenizer;

// The results database a run command writes by default, and the folder of a database path (its
// baseline cache lives in <folder>/cache/baseline) (cmd_run.cpp).
std::string default_db_path();
std::string db_dir_of(const std::string& db);

// A parameter schema as `kvbench methods NAME` and `kvbench protocols NAME` print it.
void print_param_specs(const std::vector<ParamSpec>& params);

// --threads N of run and grid: exactly `--set threads=N` (threads_override.cpp). Refuses both at once.
void add_threads_override(CLI::App* sub, std::optional<int64_t>* threads);
void apply_threads_override(const std::optional<int64_t>& threads, std::vector<std::string>& sets);

// Registration of each subcommand (one file each).
void register_generate(CLI::App& app);
void register_score(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_methods(CLI::App& app);
void register_protocols(CLI::App& app);
void register_run(CLI::App& app);
void register_profile(CLI::App& app);
void register_grid(CLI::App& app);
void register_merge(CLI::App& app);
void register_leaderboard(CLI::App& app);
void register_compare(CLI::App& app);
void register_reproduce(CLI::App& app);
void register_show(CLI::App& app);
void register_train(CLI::App& app);
void register_tokenize(CLI::App& app);

}  // namespace kvb::cli
