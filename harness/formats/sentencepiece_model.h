#pragma once
// The SentencePiece backend of kvb::Tokenizer (tokenizer.h): a SentencePiece tokenizer read straight
// from `tokenizer.model` (the ModelProto wire format), with BPE encoding and decoding implemented
// here. Torch-free.
//
// Why not libsentencepiece: Debian's build carries its own protobuf-lite 3.14 and exports its symbols,
// while Debian's LibTorch links the full protobuf 3.21; whichever loads first breaks the other's static
// initialisers (a crash before main, or a version abort). Parsing the model ourselves removes the
// conflict; the tests check every encoding against the real `spm_encode` on real text.
//
// Supported: BPE models (Llama 1/2, Mistral, TinyLlama, llama2.c's tok*.model, kvbench's own) with the
// identity normalizer, byte fallback, add_dummy_prefix, remove_extra_whitespaces. Unigram models and
// NFKC normalization are refused with a clear error rather than tokenized approximately.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvb {

class SentencePieceModel {
 public:
  enum class PieceType : uint8_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4,
                                   kUnused = 5, kByte = 6 };

  // Throws kvb::Error naming the path when the file is missing, corrupt or unsupported.
  explicit SentencePieceModel(const std::string& model_path);
  // Parses serialized ModelProto bytes; `source` names them in errors.
  SentencePieceModel(const std::string& bytes, const std::string& source);

  std::vector<int64_t> encode(const std::string& text) const;  // no BOS/EOS
  std::string decode(const std::vector<int64_t>& ids) const;
  const std::string& piece(int64_t id) const;
  PieceType type(int64_t id) const;  // throws for an id out of range
  float score(int64_t id) const;     // throws for an id out of range
  int64_t piece_id(const std::string& piece) const;  // -1 when absent
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t unk_id() const { return unk_id_; }
  const std::string& path() const { return path_; }

 private:
  void parse(const std::string& bytes);
  std::string normalize(const std::string& text) const;

  struct Piece {
    std::string text;
    float score = 0.f;
    PieceType type = PieceType::kNormal;
  };
  std::string path_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int32_t> mergeable_;  // normal + user-defined pieces
  std::vector<std::string> user_defined_;               // matched atomically, longest first
  int32_t byte_ids_[256];
  bool byte_fallback_ = false;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
  int64_t unk_id_ = 0, bos_id_ = 1, eos_id_ = 2;
  std::string unk_surface_ = " \xE2\x81\x87 ";
};

}  // namespace kvb

#include <memory>

#include "harness/formats/tokenizer_backend.h"

namespace kvb {

// SentencePieceModel behind the TokenizerBackend interface. Special ids are the control and unknown
// pieces; add_bos is true (Llama 2's rule) unless the source says otherwise (a GGUF's
// add_bos_token).
//
// `text_specials`: pieces matched where the raw text spells them, before SentencePiece sees it (a
// GGUF vocabulary's control, unknown and user-defined tokens: Gemma's <start_of_turn>, <bos>, runs
// of spaces, as Hugging Face's tokenizer.json matches its added tokens and llama.cpp its special
// and user-defined tokens). The
// longest one at the leftmost position wins; each stretch of text between them is encoded as a
// text of its own (a dummy prefix included where the model adds one, as llama.cpp does).
// `spm_encode` matches none (a plain tokenizer.model gets none).
class SentencePieceBackend : public TokenizerBackend {
 public:
  SentencePieceBackend(std::shared_ptr<const SentencePieceModel> model, std::string kind,
                       bool add_bos = true, std::string chat_template = "",
                       const std::vector<int64_t>& text_specials = {});
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override;
  const std::string& piece(int64_t id) const override { return m_->piece(id); }
  int64_t piece_id(const std::string& p) const override { return m_->piece_id(p); }
  int64_t vocab_size() const override { return m_->vocab_size(); }
  int64_t bos_id() const override { return m_->bos_id(); }
  int64_t eos_id() const override { return m_->eos_id(); }
  int64_t unk_id() const override { return m_->unk_id(); }
  bool add_bos() const override { return add_bos_; }
  bool is_special(int64_t id) const override;
  std::vector<int64_t> special_ids() const override;
  const std::string& chat_template() const override { return chat_template_; }
  std::string kind() const override { return kind_; }

 private:
  std::shared_ptr<const SentencePieceModel> m_;
  std::string kind_;
  bool add_bos_;
  std::string chat_template_;
  // text_specials by the first byte of their text, longest first.
  std::vector<std::pair<std::string, int64_t>> specials_by_byte_[256];
  bool any_specials_ = false;
};

}  // namespace kvb
