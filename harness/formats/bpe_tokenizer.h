#pragma once
// The BPE backend of kvb::Tokenizer for tokenizer.json and GGUF vocabularies (tokenizer_spec.h),
// following Hugging Face `tokenizers` step by step: added tokens are cut out of the raw text first
// (leftmost-longest, with lstrip/rstrip/single_word), each remaining segment is normalized, then
// pre-tokenized, then every pre-token is merged by rank (lowest rank first, leftmost on ties, as
// tokenizers' Word::merge_all) with a per-word cache. Torch-free.

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/formats/tokenizer_backend.h"
#include "harness/formats/tokenizer_spec.h"

namespace kvb {

class BpeTokenizer : public TokenizerBackend {
 public:
  // Validates the spec (every merge names vocabulary tokens, ids in range, no duplicate tokens...)
  // and throws kvb::Error naming spec.source and the field.
  explicit BpeTokenizer(TokenizerSpec spec);
  BpeTokenizer(const BpeTokenizer&) = delete;  // added_by_byte_ points into spec_
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override;
  const std::string& piece(int64_t id) const override;
  int64_t piece_id(const std::string& piece) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t bos_id() const override { return spec_.bos_id; }
  int64_t eos_id() const override { return spec_.eos_id; }
  int64_t unk_id() const override { return spec_.unk_id; }
  bool add_bos() const override { return spec_.add_bos; }
  bool add_eos() const override { return spec_.add_eos; }
  bool is_special(int64_t id) const override;
  std::vector<int64_t> special_ids() const override;
  const std::string& chat_template() const override { return spec_.chat_template; }
  std::string kind() const override;

 private:
  struct Match {
    size_t begin, end;  // the bytes the token consumes (with its stripped whitespace)
    int32_t id;
  };
  void find_added(const std::string& s, bool normalized, std::vector<Match>* out) const;
  void encode_segment(const std::string& s, bool first_segment, std::vector<int64_t>* ids) const;
  void encode_word(const std::string& w, std::vector<int64_t>* ids) const;
  std::string normalize(const std::string& s) const;
  const std::string& decode_text(int64_t id) const;

  TokenizerSpec spec_;
  std::vector<std::string> tokens_;                     // id -> token (model and added tokens)
  std::unordered_map<std::string, int32_t> vocab_;      // model vocabulary, token -> id
  std::unordered_map<std::string, int32_t> piece_ids_;  // every token, added ones included
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> rank, id
  std::vector<uint8_t> special_;                                      // by id
  // Added tokens by the first byte of the text they match, longest first, for the raw pass and the
  // normalized pass (a normalized token matches its content normalized, as tokenizers does).
  struct AddedMatch {
    std::string text;
    const AddedToken* token;
  };
  std::vector<AddedMatch> added_by_byte_[2][256];
  // Normalized added tokens decode as their normalized content (what tokenizers 0.23 does: a
  // Prepend normalizer's U+2581 comes back as a space).
  std::unordered_map<int32_t, std::string> decode_as_;
  int32_t byte_ids_[256];  // <0xXX> tokens for byte fallback, -1 when absent
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kvb
