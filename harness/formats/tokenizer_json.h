#pragma once
// Reads a Hugging Face `tokenizers` file (`tokenizer.json`) into a TokenizerSpec: BPE models
// (byte-level: GPT-2, Llama 3, Qwen2, SmolLM2; SentencePiece-style: Llama 2, Mistral, TinyLlama)
// with the normalizers, pre-tokenizers, post-processors and decoders those files carry. Anything
// else (a WordPiece or Unigram model, an unknown regex, a decoder we do not implement) is a
// kvb::Error naming the file and the field, never an approximation. A `tokenizer_config.json`
// beside the file supplies chat_template and the bos/eos names when present (then config.json's
// bos/eos ids). Torch-free.

#include <string>

#include "harness/formats/tokenizer_spec.h"

namespace kvb {

TokenizerSpec tokenizer_spec_from_json_file(const std::string& path);
// `text` is the JSON; `source` names it in errors; `config_text` is tokenizer_config.json ("" when
// absent) and `config_source` names it; `model_config_text` is the model's config.json beside it,
// whose bos_token_id / eos_token_id name the ids when tokenizer_config.json does not.
TokenizerSpec tokenizer_spec_from_json(const std::string& text, const std::string& source,
                                       const std::string& config_text = "",
                                       const std::string& config_source = "",
                                       const std::string& model_config_text = "",
                                       const std::string& model_config_source = "");

}  // namespace kvb
