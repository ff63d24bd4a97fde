#include <iostream>

#include <nlohmann/json.hpp>

#include "harness/cli/cli_common.h"

namespace kvb::cli {

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<ModelArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "print a model's architecture, parameter count and KV bytes per token as JSON");
  add_model_options(sub, args.get());
  sub->callback([args] {
    auto model = load_model_from_args(*args);
    const auto& c = model->config;
    nlohmann::json j = c.to_json();
    j["source"] = model->source;
    j["tokenizer"] = model->tokenizer_path;
    j["device"] = model->device.str();
    j["dtype"] = dtype_name(model->dtype);
    j["parameter_count"] = c.parameter_count();
    j["weight_bytes"] = model->weight_bytes();
    j["kv_bytes_per_token"] = c.kv_bytes_per_token(dtype_bytes(model->dtype));
    j["kv_bytes_per_token_by_dtype"] = {{"fp32", c.kv_bytes_per_token(4)},
                                        {"bf16", c.kv_bytes_per_token(2)},
                                        {"fp16", c.kv_bytes_per_token(2)}};
    std::cout << j.dump(2) << "\n";
  });
}

}  // namespace kvb::cli
