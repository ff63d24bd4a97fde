#include <iostream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/engine/engine.h"

namespace kvb::cli {

void register_generate(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::string prompt;
    std::vector<int64_t> ids;
    int64_t n = 128;
    double temperature = 0.0, top_p = 1.0;
    uint64_t seed = 0;
    int64_t block_size = 16;
    bool stats = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("generate", "generate text: prints the prompt and its continuation");
  add_model_options(sub, &args->model);
  auto* prompt = sub->add_option("--prompt,-p", args->prompt,
                                 "prompt text (BOS is prepended unless the model adds none)");
  auto* ids = sub->add_option("--ids", args->ids,
                              "prompt token ids as given (no BOS added, no tokenizer needed); prints "
                              "the new ids");
  prompt->excludes(ids);
  ids->excludes(prompt);
  sub->add_option("-n", args->n, "maximum new tokens")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--temperature", args->temperature, "0: greedy")->capture_default_str();
  sub->add_option("--top-p", args->top_p, "nucleus sampling mass")->capture_default_str();
  sub->add_option("--seed", args->seed, "sampling seed")->capture_default_str();
  sub->add_option("--block-size", args->block_size, "KV block size")->capture_default_str();
  sub->add_flag("--stats", args->stats, "print tokens/s on stderr");
  sub->callback([args] {
    auto model = load_model_from_args(args->model);
    std::unique_ptr<Tokenizer> tok;
    if (args->ids.empty()) tok = load_tokenizer(*model);
    Engine engine(model, make_default_kv(*model, args->block_size));
    std::vector<int64_t> prompt = args->ids;
    size_t n_bos = 0;
    if (tok) {
      if (model->config.add_bos) prompt.push_back(model->config.bos_id);
      n_bos = prompt.size();
      auto text_ids = tok->encode(args->prompt);
      prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());
      KVB_CHECK(!prompt.empty(),
                "--prompt: empty, and the model adds no BOS: nothing to generate from");
    }
    for (int64_t id : prompt)
      KVB_CHECK(id >= 0 && id < model->config.vocab_size, "--ids: id ", id,
                " is outside the vocabulary [0, ", model->config.vocab_size, ")");
    GenerateOptions g;
    g.max_new_tokens = args->n;
    g.sampling.temperature = args->temperature;
    g.sampling.top_p = args->top_p;
    g.sampling.seed = args->seed;
    // llama2.c models were trained with BOS between stories and never emit EOS: stop on either.
    g.stop_ids = model->config.eos_ids;
    if (model->config.format == "llama2c") g.stop_ids.push_back(model->config.bos_id);
    auto r = engine.generate({prompt}, g);
    if (!tok) {
      for (size_t i = 0; i < r.tokens[0].size(); ++i) std::cout << (i ? " " : "") << r.tokens[0][i];
      std::cout << "\n";
    } else {
      std::vector<int64_t> all(prompt.begin() + static_cast<std::ptrdiff_t>(n_bos), prompt.end());
      all.insert(all.end(), r.tokens[0].begin(), r.tokens[0].end());
      std::cout << tok->decode(all) << "\n";
    }
    if (args->stats) {
      std::cerr << "kvbench: prefill " << r.prefill_tokens << " tokens in " << r.prefill_s * 1e3
                << " ms; decode " << r.decode_tokens << " tokens in " << r.decode_s * 1e3
                << " ms (" << (r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0) << " tok/s)\n";
    }
  });
}

}  // namespace kvb::cli
