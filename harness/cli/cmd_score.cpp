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
    std::vector<int64_t> ids;
    int64_t chunk = 512;
    bool beyond_context = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("score", "teacher-forced NLL of a text (BOS first unless the model adds none; every following token scored); prints JSON");
  add_model_options(sub, &args->model);
  auto* text = sub->add_option("--text,-t", args->text, "text to score");
  auto* ids = sub->add_option("--ids", args->ids,
                              "token ids to score as given (no BOS added, no tokenizer needed)");
  text->excludes(ids);
  ids->excludes(text);
  sub->add_option("--prefill-chunk", args->chunk, "tokens per prefill step")->capture_default_str();
  sub->add_flag("--beyond-context", args->beyond_context,
                "score a text longer than the model's context (max_position_embeddings): positions "
                "past it are extrapolation, and the work grows with the square of the length");
  sub->callback([args] {
    KVB_CHECK(!args->text.empty() || !args->ids.empty(), "score: give --text or --ids");
    auto model = load_model_from_args(args->model);
    EngineOptions eo;
    eo.prefill_chunk = args->chunk;
    Engine engine(model, make_default_kv(*model), eo);
    std::vector<int64_t> ids = args->ids;
    if (ids.empty()) {
      auto tok = load_tokenizer(*model);
      // A model that adds no BOS (config.add_bos false, e.g. SmolLM2's GGUF) scores the text alone.
      if (model->config.add_bos) ids.push_back(model->config.bos_id);
      auto t = tok->encode(args->text);
      ids.insert(ids.end(), t.begin(), t.end());
      KVB_CHECK(ids.size() >= 2, "--text: nothing to score (the text encodes to fewer than 2 tokens)");
    }
    KVB_CHECK(ids.size() >= 2, "--ids: nothing to score (give at least 2 ids)");
    for (int64_t id : ids)
      KVB_CHECK(id >= 0 && id < model->config.vocab_size, "--ids: id ", id,
                " is outside the vocabulary [0, ", model->config.vocab_size, ")");
    // Refused before any forward pass: a long text otherwise scores for minutes (attention work grows
    // with the square of the length) and past the trained context the NLL measures extrapolation.
    const int64_t ctx = model->config.max_seq_len;
    KVB_CHECK(args->beyond_context || static_cast<int64_t>(ids.size()) <= ctx, args->ids.empty() ? "--text" : "--ids",
              ": ", ids.size(), " tokens is longer than the model's context of ", ctx,
              " (max_position_embeddings); score a shorter text, or pass --beyond-context");
    auto r = engine.score(ids);
    nlohmann::json j = {{"tokens", r.tokens}, {"n", r.n()}, {"nll", r.nll_sum}, {"ppl", r.ppl()}};
    std::cout << j.dump() << "\n";
  });
}

}  // namespace kvb::cli
