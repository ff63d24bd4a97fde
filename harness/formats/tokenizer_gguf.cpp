#include "harness/formats/tokenizer_gguf.h"

#include <cstring>

#include "harness/common/error.h"
#include "harness/formats/bpe_tokenizer.h"
#include "harness/formats/sentencepiece_model.h"

namespace kvb {

namespace {

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int64_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4,
                  kTypeUnused = 5, kTypeByte = 6;

std::vector<int64_t> token_types(const GgufFile& f, size_t n) {
  const std::string key = "tokenizer.ggml.token_type";
  if (!f.has(key)) return std::vector<int64_t>(n, kTypeNormal);
  const auto& t = f.get_ints(key);
  KVB_CHECK(t.size() == n, f.path(), ": ", key, " has ", t.size(), " entries for ", n, " tokens");
  for (size_t i = 0; i < n; ++i)
    KVB_CHECK(t[i] >= kTypeNormal && t[i] <= kTypeByte, f.path(), ": ", key, "[", i, "] = ", t[i],
              " is not a llama.cpp token type (1..6)");
  return t;
}

int64_t id_key(const GgufFile& f, const std::string& key, size_t n) {
  const int64_t id = f.get_int_or(key, -1);
  KVB_CHECK(id >= -1 && id < static_cast<int64_t>(n), f.path(), ": ", key, " = ", id,
            " is outside the vocabulary [0, ", n, ")");
  return id;
}

// The pre-tokenizer llama.cpp names in tokenizer.ggml.pre, as the tokenizer.json of that family
// writes it (llama.cpp's llama-vocab.cpp regexes are those same patterns).
void set_pre_tokenizer(const GgufFile& f, TokenizerSpec* spec) {
  const std::string key = "tokenizer.ggml.pre";
  KVB_CHECK(
      f.has(key), f.path(), ": ", key,
      " is missing (llama.cpp then falls back to its 'default' regex set, which kvbench does not "
      "implement)");
  const std::string pre = f.get_string(key);
  PreTokenizerStep split;
  split.type = PreTokenizerStep::Type::kSplit;
  PreTokenizerStep bytes;
  bytes.type = PreTokenizerStep::Type::kByteLevel;
  bytes.add_prefix_space = false;
  if (pre == "llama-bpe" || pre == "llama3") {
    split.regex = SplitRegex::kLlama3;
    bytes.use_regex = false;
    spec->pre_tokenizers = {split, bytes};
    spec->ignore_merges =
        true;  // llama.cpp sets ignore_merges for this pre type, as Llama 3's file
  } else if (pre == "qwen2") {
    split.regex = SplitRegex::kQwen2;
    bytes.use_regex = false;
    spec->normalizers = {{NormalizerStep::Type::kNfc, "", ""}};
    spec->pre_tokenizers = {split, bytes};
  } else if (pre == "gpt-2") {
    bytes.use_regex = true;
    spec->pre_tokenizers = {bytes};
  } else if (pre == "smollm") {
    PreTokenizerStep digits;
    digits.type = PreTokenizerStep::Type::kDigits;
    digits.individual_digits = true;
    bytes.use_regex = true;
    spec->pre_tokenizers = {digits, bytes};
  } else {
    KVB_FAIL(f.path(), ": ", key, " '", pre,
             "' is not supported (supported: llama-bpe, llama3, qwen2, gpt-2, smollm)");
  }
}

// Protobuf wire writers, to hand a "llama" GGUF vocabulary to the SentencePiece backend as the
// ModelProto it was converted from.
void pb_varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    *out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  *out += static_cast<char>(v);
}
void pb_uint(int field, uint64_t v, std::string* out) {
  pb_varint(static_cast<uint64_t>(field) << 3, out);
  pb_varint(v, out);
}
void pb_bytes(int field, const std::string& s, std::string* out) {
  pb_varint((static_cast<uint64_t>(field) << 3) | 2, out);
  pb_varint(s.size(), out);
  *out += s;
}
void pb_float(int field, float f, std::string* out) {
  pb_varint((static_cast<uint64_t>(field) << 3) | 5, out);
  char b[4];
  std::memcpy(b, &f, 4);
  out->append(b, 4);
}

std::shared_ptr<const TokenizerBackend> sentencepiece_from_gguf(const GgufFile& f) {
  const auto& tokens = f.get_strings("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  KVB_CHECK(n > 0 && static_cast<int64_t>(n) <= kMaxTokenizerVocab, f.path(),
            ": tokenizer.ggml.tokens has ", n, " tokens (allowed 1..", kMaxTokenizerVocab, ")");
  const auto& scores = f.get_floats("tokenizer.ggml.scores");
  KVB_CHECK(scores.size() == n, f.path(), ": tokenizer.ggml.scores has ", scores.size(),
            " entries for ", n, " tokens");
  auto types = token_types(f, n);
  // Control, unknown and user-defined tokens spelled in the raw text are those tokens (as the file
  // types them, before the unknown id is retyped below): Hugging Face's added tokens, llama.cpp's
  // special and user-defined tokens. Gemma's runs of spaces are user-defined pieces stored as
  // spaces, which SentencePiece's normalized text (spaces as U+2581) would never hold.
  std::vector<int64_t> text_specials;
  for (size_t i = 0; i < n; ++i)
    if (types[i] == kTypeControl || types[i] == kTypeUnknown || types[i] == kTypeUserDefined)
      text_specials.push_back(static_cast<int64_t>(i));
  // llama.cpp takes the unknown, BOS and EOS tokens from the id keys, whatever their token type and
  // text: Gemma's <unk> is typed control and its BOS/EOS are <bos>/<eos>. The ModelProto says the
  // same with an unknown-typed piece and TrainerSpec's bos_piece/eos_piece.
  const int64_t unk = id_key(f, "tokenizer.ggml.unknown_token_id", n);
  const int64_t bos = id_key(f, "tokenizer.ggml.bos_token_id", n);
  const int64_t eos = id_key(f, "tokenizer.ggml.eos_token_id", n);
  if (unk >= 0) types[static_cast<size_t>(unk)] = kTypeUnknown;
  for (int64_t id : {bos, eos})
    KVB_CHECK(id < 0 || types[static_cast<size_t>(id)] == kTypeControl, f.path(),
              ": BOS/EOS token ", id, " '", id < 0 ? "" : tokens[static_cast<size_t>(id)],
              "' is not a control token (token_type 3)");
  std::string proto;
  bool have_bytes = false;
  for (size_t i = 0; i < n; ++i) {
    std::string piece;
    pb_bytes(1, tokens[i], &piece);
    pb_float(2, static_cast<float>(scores[i]), &piece);
    pb_uint(3, static_cast<uint64_t>(types[i]), &piece);
    pb_bytes(1, piece, &proto);
    have_bytes = have_bytes || types[i] == kTypeByte;
  }
  std::string trainer;
  pb_uint(3, 2, &trainer);                    // model_type BPE
  pb_uint(35, have_bytes ? 1 : 0, &trainer);  // byte_fallback, as llama.cpp uses byte tokens
  if (bos >= 0) pb_bytes(46, tokens[static_cast<size_t>(bos)], &trainer);
  if (eos >= 0) pb_bytes(47, tokens[static_cast<size_t>(eos)], &trainer);
  pb_bytes(2, trainer, &proto);
  std::string norm;
  pb_bytes(1, "identity", &norm);
  pb_uint(3, f.get_bool_or("tokenizer.ggml.add_space_prefix", true) ? 1 : 0, &norm);
  pb_uint(4, 0, &norm);  // llama.cpp never collapses whitespace
  pb_bytes(3, norm, &proto);
  auto model = std::make_shared<SentencePieceModel>(proto, f.path());
  for (const auto& [key, id] :
       {std::pair<const char*, int64_t>{"tokenizer.ggml.bos_token_id", model->bos_id()},
        {"tokenizer.ggml.eos_token_id", model->eos_id()},
        {"tokenizer.ggml.unknown_token_id", model->unk_id()}}) {
    const int64_t want = id_key(f, key, n);
    KVB_CHECK(want < 0 || want == id, f.path(), ": ", key, " = ", want,
              " but the vocabulary's own ", "piece is ", id,
              " (the vocabulary names one <unk>, one BOS and one EOS)");
  }
  return std::make_shared<SentencePieceBackend>(
      model, "gguf:sentencepiece", f.get_bool_or("tokenizer.ggml.add_bos_token", true),
      f.get_string_or("tokenizer.chat_template", ""), text_specials);
}

}  // namespace

TokenizerSpec tokenizer_spec_from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  KVB_CHECK(model == "gpt2", f.path(), ": tokenizer.ggml.model '", model,
            "' is not a byte-level BPE vocabulary (this reader takes 'gpt2')");
  TokenizerSpec spec;
  spec.source = f.path();
  spec.format = "gguf";
  spec.tokens = f.get_strings("tokenizer.ggml.tokens");
  const size_t n = spec.tokens.size();
  KVB_CHECK(n > 0 && static_cast<int64_t>(n) <= kMaxTokenizerVocab, f.path(),
            ": tokenizer.ggml.tokens has ", n, " tokens (allowed 1..", kMaxTokenizerVocab, ")");
  const auto& merges = f.get_strings("tokenizer.ggml.merges");
  spec.merges.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const std::string& m = merges[k];
    const size_t sp = m.find(' ');
    KVB_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size() &&
                  m.find(' ', sp + 1) == std::string::npos,
              f.path(), ": tokenizer.ggml.merges[", k, "] '", m,
              "' is not two tokens separated by one space");
    spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  // Control and user-defined tokens are matched in the text, as tokenizer.json's added_tokens.
  const auto types = token_types(f, n);
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != kTypeControl && types[i] != kTypeUserDefined) continue;
    if (spec.tokens[i].empty()) continue;
    AddedToken a;
    a.id = static_cast<int64_t>(i);
    a.content = spec.tokens[i];
    a.special = types[i] == kTypeControl;
    spec.added.push_back(std::move(a));
  }
  set_pre_tokenizer(f, &spec);
  spec.byte_level = true;
  spec.bos_id = id_key(f, "tokenizer.ggml.bos_token_id", n);
  spec.eos_id = id_key(f, "tokenizer.ggml.eos_token_id", n);
  spec.unk_id = id_key(f, "tokenizer.ggml.unknown_token_id", n);
  spec.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  spec.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", false);
  spec.chat_template = f.get_string_or("tokenizer.chat_template", "");
  (void)kTypeNormal;
  (void)kTypeUnknown;
  (void)kTypeUnused;
  return spec;
}

std::shared_ptr<const TokenizerBackend> tokenizer_backend_from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "gpt2") return std::make_shared<BpeTokenizer>(tokenizer_spec_from_gguf(f));
  if (model == "llama") return sentencepiece_from_gguf(f);
  KVB_FAIL(f.path(), ": tokenizer.ggml.model '", model,
           "' is not supported (supported: gpt2 = byte-level BPE, llama = SentencePiece)");
}

}  // namespace kvb
