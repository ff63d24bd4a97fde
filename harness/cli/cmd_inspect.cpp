#include <iostream>

#include <nlohmann/json.hpp>

#include "harness/cli/cli_common.h"
#include "harness/common/limits.h"
#include "harness/common/strings.h"
#include "harness/model/synthetic_presets.h"

namespace kvb::cli {

namespace {

// The architecture figures of a config: its shapes and family fields (to_json), and what its KV
// cache costs. kv_bytes_per_token counts every layer; a model with sliding-window layers holds at
// most window - 1 rows in each of those, so its full cache at a length is full_kv_bytes_at.
nlohmann::json shapes_json(const ModelConfig& c, int64_t elem_bytes) {
  nlohmann::json j = c.to_json();
  j["parameter_count"] = c.parameter_count();
  j["kv_bytes_per_token"] = c.kv_bytes_per_token(elem_bytes);
  j["kv_bytes_per_token_by_dtype"] = {{"fp32", c.kv_bytes_per_token(4)},
                                      {"bf16", c.kv_bytes_per_token(2)},
                                      {"fp16", c.kv_bytes_per_token(2)}};
  j["global_layers"] = c.n_layers - c.n_window_layers();
  j["window_layers"] = c.n_window_layers();
  nlohmann::json at = nlohmann::json::object();
  for (int64_t n : {int64_t{4096}, int64_t{32768}, c.max_seq_len})
    at[std::to_string(n)] = c.full_kv_bytes(n, elem_bytes);
  j["full_kv_bytes_at"] = at;
  return j;
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<ModelArgs>();
  auto presets = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("inspect", "print a model's architecture, parameter count and KV bytes per token as JSON");
  add_model_options(sub, args.get());
  sub->add_flag("--presets", *presets,
                "print every synthetic preset's architecture (the families' real shapes) without "
                "materializing weights");
  sub->callback([args, presets] {
    const int64_t elem = dtype_bytes(parse_dtype(args->dtype));
    check_thread_count(args->threads, "--threads");
    if (*presets) {
      nlohmann::json all = nlohmann::json::array();
      for (const auto& name : synthetic_preset_names()) {
        nlohmann::json j = shapes_json(synthetic_preset(name), elem);
        j["dtype"] = dtype_name(parse_dtype(args->dtype));
        all.push_back(j);
      }
      std::cout << all.dump(2) << "\n";
      return;
    }
    if (starts_with(args->model, "synthetic:")) {
      // A preset's shapes need no weights (a 12B preset's would be 48 GB in fp32).
      // The same refusals as a load would give.
      check_thread_count(args->threads, "--threads");
      (void)parse_device(args->device);
      const ModelConfig c = synthetic_preset(args->model.substr(10));
      nlohmann::json j = shapes_json(c, elem);
      j["source"] = args->model;
      j["tokenizer"] = "";
      j["device"] = args->device;
      j["dtype"] = dtype_name(parse_dtype(args->dtype));
      j["weight_bytes"] = c.parameter_count() * elem;
      j["weights_materialized"] = false;
      std::cout << j.dump(2) << "\n";
      return;
    }
    auto model = load_model_from_args(*args);
    const auto& c = model->config;
    nlohmann::json j = shapes_json(c, dtype_bytes(model->dtype));
    j["source"] = model->source;
    j["tokenizer"] = model->tokenizer_path;
    j["device"] = model->device.str();
    j["dtype"] = dtype_name(model->dtype);
    j["weight_bytes"] = model->weight_bytes();
    std::cout << j.dump(2) << "\n";
  });
}

}  // namespace kvb::cli
