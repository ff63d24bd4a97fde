#pragma once
// kvb::Tokenizer: the tokenizer every call site holds (by value; copies share one backend). The
// path decides the backend:
//   - `*.model` (anything not below): SentencePiece ModelProto, read by sentencepiece_model.h;
//   - `*.json` (`tokenizer.json`): a Hugging Face `tokenizers` BPE file, byte-level (GPT-2,
//     Llama 3, Qwen2, SmolLM2) or SentencePiece-style (Llama 2, Mistral, TinyLlama), bpe_tokenizer.h;
//   - `*.gguf`: the `tokenizer.ggml.*` metadata ("gpt2" byte-level BPE, "llama" SentencePiece).
// Torch-free. Every backend throws kvb::Error naming the file and the field for a file it cannot
// tokenize exactly; nothing is approximated.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/formats/sentencepiece_model.h"
#include "harness/formats/tokenizer_backend.h"

namespace kvb {

struct TokenizerSpec;

class Tokenizer {
 public:
  using PieceType = SentencePieceModel::PieceType;

  // Throws kvb::Error naming the path when the file is missing, corrupt or unsupported.
  explicit Tokenizer(const std::string& path);
  // Parses serialized SentencePiece ModelProto bytes; `source` names them in errors.
  Tokenizer(const std::string& bytes, const std::string& source);
  // A BPE tokenizer from an already-read vocabulary (tokenizer_spec.h); `spec.source` names it.
  explicit Tokenizer(const TokenizerSpec& spec);

  // Text to ids. Added/special tokens written in the text become their ids (tokenizer.json, GGUF
  // BPE and GGUF SentencePiece vocabularies, as HF `tokenizers` with add_special_tokens=False; a
  // plain tokenizer.model matches none, as spm_encode). `add_special`: also prepend BOS when
  // add_bos() and append EOS when add_eos() (add_special_tokens=True).
  std::vector<int64_t> encode(const std::string& text, bool add_special = false) const;
  // Ids to text. Special tokens are written out unless `skip_special` (SentencePiece control pieces
  // stay invisible either way, as in spm_decode).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;
  const std::string& piece(int64_t id) const { return impl_->piece(id); }
  int64_t piece_id(const std::string& piece) const { return impl_->piece_id(piece); }
  int64_t vocab_size() const { return impl_->vocab_size(); }
  int64_t bos_id() const { return impl_->bos_id(); }  // -1 when none
  int64_t eos_id() const { return impl_->eos_id(); }  // -1 when none
  int64_t unk_id() const { return impl_->unk_id(); }  // -1 when none
  // Whether the tokenizer's own rule prepends BOS (tokenizer.json post-processor, GGUF
  // tokenizer.ggml.add_bos_token; true for SentencePiece models, as Llama 2 does).
  bool add_bos() const { return impl_->add_bos(); }
  bool add_eos() const { return impl_->add_eos(); }  // RobertaProcessing-style templates
  bool is_special(int64_t id) const { return impl_->is_special(id); }
  std::vector<int64_t> special_ids() const { return impl_->special_ids(); }
  // The raw chat template (GGUF tokenizer.chat_template; tokenizer_config.json's chat_template
  // beside a tokenizer.json), "" when none.
  const std::string& chat_template() const { return impl_->chat_template(); }
  // "sentencepiece", "tokenizer.json", "gguf" (the file format), then the model, e.g.
  // "tokenizer.json:bpe-byte-level".
  std::string kind() const { return impl_->kind(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::shared_ptr<const TokenizerBackend> impl_;
};

}  // namespace kvb
