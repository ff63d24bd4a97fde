#pragma once
// The interface every tokenizer backend implements (SentencePiece `tokenizer.model`, Hugging Face
// `tokenizer.json` BPE, a GGUF file's `tokenizer.ggml.*` vocabulary). kvb::Tokenizer is the facade
// call sites hold; the file's path picks the backend (tokenizer.h). Torch-free.

#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  // Text to ids with no BOS/EOS. Added/special tokens written in the text become their ids where
  // the backend's format defines that (tokenizer.json and GGUF BPE: as HF `tokenizers` does).
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // `skip_special`: drop special tokens instead of writing their text.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special) const = 0;
  virtual const std::string& piece(int64_t id) const = 0;        // throws for an id out of range
  virtual int64_t piece_id(const std::string& piece) const = 0;  // -1 when absent
  virtual int64_t vocab_size() const = 0;
  virtual int64_t bos_id() const = 0;  // -1 when the tokenizer has none
  virtual int64_t eos_id() const = 0;
  virtual int64_t unk_id() const = 0;
  virtual bool add_bos() const = 0;               // whether the tokenizer's own rule prepends BOS
  virtual bool add_eos() const { return false; }  // ... and appends EOS
  virtual bool is_special(int64_t id) const = 0;
  virtual std::vector<int64_t> special_ids() const = 0;  // ascending
  virtual const std::string& chat_template() const = 0;  // "" when the file carries none
  virtual std::string kind() const = 0;
};

}  // namespace kvb
