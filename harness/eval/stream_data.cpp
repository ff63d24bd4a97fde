// The stream protocol's samples: tokenized windows of a corpus (datasets/corpus.h).

#include "datasets/corpus.h"
#include "harness/eval/runner.h"
#include "harness/formats/tokenizer.h"

namespace kvb {

std::vector<StreamWindow> stream_windows(const std::string& tokenizer_path,
                                         const nlohmann::json& protocol,
                                         const std::string& data_dir, std::string* dataset_hash) {
  Tokenizer tok(tokenizer_path);
  auto corpus = load_corpus(protocol["dataset"].get<std::string>(), resolve_data_dir(data_dir));
  WindowOptions wo;
  wo.window_tokens = protocol["window"];
  wo.stride = protocol["stride"];
  wo.max_windows = protocol["max_windows"];
  if (protocol.contains("skip_tokens") && !protocol["skip_tokens"].is_null())
    wo.skip_tokens = protocol["skip_tokens"];
  // Each window is a fresh document as the tokenizer would start one: BOS first only where the
  // tokenizer adds one (SmolLM2's and Qwen's add none, so their windows are raw slices).
  wo.bos = tok.add_bos() ? "each" : "none";
  TextWindows w = make_windows(tok, corpus->text, wo, corpus->name);
  *dataset_hash = w.hash;
  std::vector<StreamWindow> out;
  for (auto& x : w.windows) out.push_back({std::move(x.ids), x.hash});
  return out;
}

}  // namespace kvb
