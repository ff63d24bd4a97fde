#include "harness/eval/protocols/text_windows.h"

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/model/model.h"

namespace kvb {

void check_window_fits(const nlohmann::json& protocol, int64_t context_tokens,
                       const std::string& model) {
  const int64_t window = protocol.at("window");
  KVB_CHECK(context_tokens <= 0 || window <= context_tokens, "config.protocol.window: ", window,
            " tokens is longer than the model's context of ", context_tokens,
            " (max_position_embeddings of ", model, ")");
}

void check_window_input(const nlohmann::json& resolved, const ModelFacts& model,
                        const InputCheck& check) {
  const nlohmann::json& proto = resolved.at("protocol");
  check("window:" + model.spec + ":" + proto.at("window").dump(),
        [&] { check_window_fits(proto, model.context_tokens, model.spec); });
}

std::vector<StreamWindow> checked_text_windows(const RunContext& ctx, std::string* dataset_hash) {
  const nlohmann::json& proto = ctx.protocol();
  const Model& model = *ctx.model;
  const int64_t window = proto["window"];
  check_window_fits(proto, model.config.max_seq_len, model.source);
  std::vector<StreamWindow> windows =
      stream_windows(model.tokenizer_path, proto, ctx.env.data_dir, dataset_hash);
  KVB_CHECK(!windows.empty(), "config.protocol.dataset: '", proto["dataset"].get<std::string>(),
            "' yields no window of ", window, " tokens");
  return windows;
}

void check_dataset_input(const nlohmann::json& protocol, const std::string& data_dir,
                         const InputCheck& check) {
  const std::string ds = protocol["dataset"];
  check("dataset:" + ds, [&] { load_corpus(ds, resolve_data_dir(data_dir)); });
}

}  // namespace kvb
