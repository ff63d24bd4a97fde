#pragma once
// The vocabulary and rules of a BPE tokenizer as plain data: what tokenizer.json (tokenizer_json.h)
// and a GGUF file's tokenizer.ggml.* metadata (tokenizer_gguf.h) both reduce to, and what
// BpeTokenizer (bpe_tokenizer.h) is built from. Only the rules real checkpoints use are
// representable; the readers refuse anything else, naming the file and the field.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvb {

// The pre-tokenizer regexes kvbench recognises, by their exact strings (pre_tokenizer.h matches
// them by hand: they need \p{L}, \p{N} and lookahead, which std::regex lacks).
enum class SplitRegex {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
  kQwen2,   // the Llama 3 pattern with \p{N} (single digits) in place of \p{N}{1,3}
};

struct PreTokenizerStep {
  enum class Type {
    kSplit,      // Split(Regex, Isolated): matches and the gaps between them become pieces
    kByteLevel,  // ByteLevel: optional prefix space, optional GPT-2 regex split, bytes to GPT-2
                 // chars
    kDigits,     // Digits: numeric characters split off, one by one or in runs
    kMetaspace,  // Metaspace: spaces to U+2581 (+ prefix U+2581 first / always), no split
  };
  Type type = Type::kSplit;
  SplitRegex regex = SplitRegex::kGpt2;  // kSplit
  bool add_prefix_space = false;         // kByteLevel; kMetaspace: prepend (scheme != never)
  bool prefix_first_only = false;        // kMetaspace with prepend_scheme "first"
  bool use_regex = true;                 // kByteLevel
  bool individual_digits = false;        // kDigits
};

struct NormalizerStep {
  enum class Type { kNfc, kPrepend, kReplace };
  Type type = Type::kNfc;
  std::string a, b;  // kPrepend: a = prefix; kReplace: a -> b (literal strings)
};

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;  // matched after normalization (else on the raw text)
};

struct TokenizerSpec {
  std::string source;  // the file, for errors
  std::string format;  // "tokenizer.json" or "gguf"

  // The vocabulary: tokens[id] in the model's alphabet (GPT-2 byte characters when byte_level, else
  // U+2581 for spaces and <0xXX> byte tokens). Merges in rank order, as token strings.
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added;  // matched in the text before the model runs

  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool byte_level = false;     // GPT-2 byte alphabet (pre-tokenizer ByteLevel; decoder ByteLevel)
  bool ignore_merges = false;  // a whole pre-token that is in the vocabulary is emitted as is
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens
  bool fuse_unk = false;       // consecutive unknowns become one unk
  int64_t unk_id = -1;

  // Decoding of the SentencePiece style (Replace U+2581 -> ' ', ByteFallback, Fuse, Strip one
  // leading space); byte-level files decode through the GPT-2 byte alphabet instead.
  bool decode_strip_leading_space = false;

  int64_t bos_id = -1, eos_id = -1;
  bool add_bos = false;  // the post-processor / add_bos_token prepends bos_id
  bool add_eos = false;  // the post-processor appends eos_id (RobertaProcessing, a template's tail)
  std::string chat_template;
};

// Refuses vocabularies no real tokenizer has (a defence against files that would exhaust memory).
constexpr int64_t kMaxTokenizerVocab = 4 << 20;
constexpr int64_t kMaxTokenBytes = 1 << 16;

}  // namespace kvb
