#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/engine/engine.h"
#include "harness/formats/unicode_text.h"

namespace kvb::cli {

namespace {

// The most text --file reads: far more than any model's context in tokens (the context check below
// refuses anything longer anyway), small enough that a wrong file fails at once instead of tokenizing
// gigabytes.
constexpr size_t kMaxScoreFileBytes = size_t{16} << 20;

// --file PATH, or standard input for "-": bounded (stdin is read only until it passes the bound, never
// to its end), and refused unless UTF-8, naming the file and the first bad byte's offset.
std::string read_score_text(const std::string& path) {
  std::string text;
  const std::string name = path == "-" ? "--file - (standard input)" : "--file " + path;
  if (path == "-") {
    char buf[65536];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
      text.append(buf, n);
      KVB_CHECK(text.size() <= kMaxScoreFileBytes, name, ": more than the ", kMaxScoreFileBytes,
                " bytes a text to score may have");
    }
    KVB_CHECK(!std::ferror(stdin), name, ": read error");
  } else {
    try {
      text = read_text_file(path, kMaxScoreFileBytes);  // refuses a FIFO or a directory without opening it
    } catch (const Error& e) {
      KVB_FAIL("--file: ", e.what());
    }
  }
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_valid_len(text, i);
    if (len == 0) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned>(static_cast<uint8_t>(text[i])));
      KVB_FAIL(name, ": not UTF-8 text (invalid byte ", byte, " at offset ", i, ")");
    }
    i += len;
  }
  return text;
}

}  // namespace

void register_score(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::string text, file;
    std::vector<int64_t> ids;
    int64_t chunk = 512;
    int64_t top_k = 0;
    bool per_token = false;
    bool beyond_context = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("score", "teacher-forced NLL of a text (BOS first unless the model adds none; every following token scored); prints JSON");
  add_model_options(sub, &args->model);
  auto* text = sub->add_option("--text,-t", args->text, "text to score");
  auto* ids = sub->add_option("--ids", args->ids,
                              "token ids to score as given (no BOS added, no tokenizer needed)");
  auto* file = sub->add_option("--file,-f", args->file,
                               "score the text of a file (UTF-8, at most 16 MiB; - reads standard input)");
  text->excludes(ids);
  ids->excludes(text);
  file->excludes(text);
  file->excludes(ids);
  sub->add_option("--prefill-chunk", args->chunk, "tokens per prefill step")->capture_default_str();
  sub->add_flag("--per-token", args->per_token,
                "also print each scored token's NLL (token_nll: one per token after the first)");
  sub->add_option("--top-k", args->top_k,
                  "also print each scored position's K highest logits as [id, logit] pairs "
                  "(top_logits; for comparing logits with another implementation)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--beyond-context", args->beyond_context,
                "score a text longer than the model's context (max_position_embeddings): positions "
                "past it are extrapolation, and the work grows with the square of the length");
  sub->callback([args] {
    if (!args->file.empty()) args->text = read_score_text(args->file);  // before the model loads
    KVB_CHECK(!args->text.empty() || !args->ids.empty() || !args->file.empty(), "score: give --text, --file or --ids");
    auto model = load_model_from_args(args->model);
    EngineOptions eo;
    eo.prefill_chunk = args->chunk;
    // A long text's scoring prints its progress on stderr (stdout is the result).
    eo.prefill_progress =
        prefill_progress_lines([](const std::string& s) { std::cerr << "kvbench: " << s << "\n"; });
    Engine engine(model, make_default_kv(*model), eo);
    std::vector<int64_t> ids = args->ids;
    if (ids.empty()) {
      auto tok = load_tokenizer(*model);
      // A model that adds no BOS (config.add_bos false, e.g. SmolLM2's GGUF) scores the text alone.
      if (model->config.add_bos) ids.push_back(model->config.bos_id);
      auto t = tok->encode(args->text);
      ids.insert(ids.end(), t.begin(), t.end());
      KVB_CHECK(ids.size() >= 2, args->file.empty() ? "--text" : "--file " + args->file,
                ": nothing to score (the text encodes to fewer than 2 tokens)");
    }
    KVB_CHECK(ids.size() >= 2, "--ids: nothing to score (give at least 2 ids)");
    for (int64_t id : ids)
      KVB_CHECK(id >= 0 && id < model->config.vocab_size, "--ids: id ", id,
                " is outside the vocabulary [0, ", model->config.vocab_size, ")");
    // Refused before any forward pass: a long text otherwise scores for minutes (attention work grows
    // with the square of the length) and past the trained context the NLL measures extrapolation.
    const int64_t ctx = model->config.max_seq_len;
    KVB_CHECK(args->beyond_context || static_cast<int64_t>(ids.size()) <= ctx,
              !args->ids.empty() ? "--ids" : args->file.empty() ? "--text" : "--file " + args->file,
              ": ", ids.size(), " tokens is longer than the model's context of ", ctx,
              " (max_position_embeddings); score a shorter text, or pass --beyond-context");
    auto r = engine.score(ids, args->top_k);
    nlohmann::json j = {{"tokens", r.tokens}, {"n", r.n()}, {"nll", r.nll_sum}, {"ppl", r.ppl()}};
    if (args->per_token) j["token_nll"] = r.token_nll;
    if (args->top_k > 0) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& row : r.top_logits) {
        nlohmann::json pairs = nlohmann::json::array();
        for (const auto& [id, logit] : row) pairs.push_back({id, logit});
        rows.push_back(std::move(pairs));
      }
      j["top_logits"] = std::move(rows);
    }
    std::cout << j.dump() << "\n";
  });
}

}  // namespace kvb::cli
