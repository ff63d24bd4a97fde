#pragma once
// A SentencePiece tokenizer read straight from `tokenizer.model` (the ModelProto wire format), with
// BPE encoding and decoding implemented here. Torch-free.
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

class Tokenizer {
 public:
  enum class PieceType : uint8_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4,
                                   kUnused = 5, kByte = 6 };

  // Throws kvb::Error naming the path when the file is missing, corrupt or unsupported.
  explicit Tokenizer(const std::string& model_path);
  // Parses serialized ModelProto bytes; `source` names them in errors.
  Tokenizer(const std::string& bytes, const std::string& source);

  std::vector<int64_t> encode(const std::string& text) const;  // no BOS/EOS
  std::string decode(const std::vector<int64_t>& ids) const;
  const std::string& piece(int64_t id) const;
  int64_t piece_id(const std::string& piece) const;  // -1 when absent
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t unk_id() const { return unk_id_; }
  const std::string& path() const { return path_; }
  bool add_bos() const { return true; }  // a SentencePiece model's documents start with BOS
  const std::string& chat_template() const { return chat_template_; }  // none in tokenizer.model

 private:
  void parse(const std::string& bytes);
  std::string normalize(const std::string& text) const;

  struct Piece {
    std::string text;
    float score = 0.f;
    PieceType type = PieceType::kNormal;
  };
  std::string path_;
  std::string chat_template_;
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
