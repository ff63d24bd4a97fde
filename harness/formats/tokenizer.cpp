#include "harness/formats/tokenizer.h"

#include "harness/common/error.h"
#include "harness/formats/bpe_tokenizer.h"
#include "harness/formats/tokenizer_json.h"
#include "harness/formats/tokenizer_gguf.h"

namespace kvb {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Tokenizer::Tokenizer(const std::string& path) : path_(path) {
  if (ends_with(path, ".json")) {
    impl_ = std::make_shared<BpeTokenizer>(tokenizer_spec_from_json_file(path));
  } else if (ends_with(path, ".gguf")) {
    impl_ = tokenizer_backend_from_gguf(GgufFile(path));
  } else {
    impl_ = std::make_shared<SentencePieceBackend>(std::make_shared<SentencePieceModel>(path),
                                                   "sentencepiece");
  }
}

Tokenizer::Tokenizer(const std::string& bytes, const std::string& source) : path_(source) {
  impl_ = std::make_shared<SentencePieceBackend>(
      std::make_shared<SentencePieceModel>(bytes, source), "sentencepiece");
}

Tokenizer::Tokenizer(const TokenizerSpec& spec) : path_(spec.source) {
  impl_ = std::make_shared<BpeTokenizer>(spec);
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int64_t> ids = impl_->encode(text);
  if (add_special && impl_->add_bos()) ids.insert(ids.begin(), impl_->bos_id());
  if (add_special && impl_->add_eos()) ids.push_back(impl_->eos_id());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

}  // namespace kvb
