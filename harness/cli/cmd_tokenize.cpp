// `kvbench tokenize`: text to ids (or ids to text) with a model's or a file's tokenizer, as JSON.

#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"

namespace kvb::cli {

namespace {

struct TokenizeArgs {
  std::string model, models_dir, tokenizer, text, ids;
  bool special = false, skip_special = false;
};

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KVB_CHECK(used == w.size() && !w.empty(), "--ids: '", w, "' is not an integer id");
    out.push_back(v);
  }
  return out;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "encode --text to token ids (or decode --ids to text) with a model's or a file's "
      "tokenizer; prints JSON");
  auto* m = sub->add_option("--model,-m", a->model,
                            "model whose tokenizer to use (resolved as other commands do; weights "
                            "are not read)");
  sub->add_option("--models-dir", a->models_dir, "extra directory to look models up in");
  auto* t = sub->add_option("--tokenizer", a->tokenizer,
                            "tokenizer file: tokenizer.model, tokenizer.json or a .gguf");
  m->excludes(t);
  auto* text = sub->add_option("--text", a->text, "text to encode");
  auto* ids = sub->add_option("--ids", a->ids, "space-separated ids to decode");
  text->excludes(ids);
  sub->add_flag("--special", a->special,
                "encode: add the tokenizer's own BOS/EOS (HF add_special_tokens=True)");
  sub->add_flag("--skip-special", a->skip_special, "decode: drop special tokens");
  sub->callback([a, text, ids] {
    KVB_CHECK(!a->model.empty() || !a->tokenizer.empty(), "tokenize: give --model or --tokenizer");
    KVB_CHECK(text->count() > 0 || ids->count() > 0, "tokenize: give --text or --ids");
    const std::string path =
        a->tokenizer.empty() ? resolve_tokenizer_path(a->model, a->models_dir) : a->tokenizer;
    const Tokenizer tok(path);
    nlohmann::json j;
    j["tokenizer"] = path;
    j["kind"] = tok.kind();
    if (text->count() > 0) {
      j["ids"] = tok.encode(a->text, a->special);
    } else {
      // Lossy UTF-8 is possible (half a character); dump it with replacement characters.
      j["text"] = tok.decode(parse_ids(a->ids), a->skip_special);
    }
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  });
}

}  // namespace kvb::cli
