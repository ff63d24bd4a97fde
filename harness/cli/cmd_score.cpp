#include <iostream>

#include <nlohmann/json.hpp>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/engine/engine.h"

namespace kvb::cli {

void register_score(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::string text;
    int64_t chunk = 512;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("score", "teacher-forced NLL of a text (BOS first, every following token scored); prints JSON");
  add_model_options(sub, &args->model);
  sub->add_option("--text,-t", args->text, "text to score")->required();
  sub->add_option("--prefill-chunk", args->chunk, "tokens per prefill step")->capture_default_str();
  sub->callback([args] {
    auto model = load_model_from_args(args->model);
    auto tok = load_tokenizer(*model);
    EngineOptions eo;
    eo.prefill_chunk = args->chunk;
    Engine engine(model, make_default_kv(*model), eo);
    std::vector<int64_t> ids = {model->config.bos_id};
    auto t = tok->encode(args->text);
    ids.insert(ids.end(), t.begin(), t.end());
    KVB_CHECK(ids.size() >= 2, "--text: nothing to score (the text encodes to no tokens)");
    auto r = engine.score(ids);
    nlohmann::json j = {{"tokens", r.tokens}, {"n", r.n()}, {"nll", r.nll_sum}, {"ppl", r.ppl()}};
    std::cout << j.dump() << "\n";
  });
}

}  // namespace kvb::cli
