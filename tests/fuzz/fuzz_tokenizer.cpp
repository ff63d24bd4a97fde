// libFuzzer target for the SentencePiece tokenizer.model reader: any bytes give a tokenizer or a
// kvb::Error. A tokenizer that parses must encode a fixed text and the input itself, and decode
// what it encoded, without a crash (ids out of range, byte pieces, empty vocabularies).

#include <cstddef>
#include <cstdint>
#include <string>

#include "harness/common/error.h"
#include "harness/formats/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const kvb::Tokenizer tok(bytes, "<fuzz>");
    for (const std::string& text :
         {std::string("Once upon a time, 42 \xc3\xa9t\xc3\xa9s.\n"), bytes.substr(0, 256)}) {
      const auto ids = tok.encode(text);
      for (int64_t id : ids)
        if (id < 0 || id >= tok.vocab_size())
          __builtin_trap();  // encode must stay in the vocabulary
      (void)tok.decode(ids);
    }
    (void)tok.piece_id("a");
  } catch (const kvb::Error&) {
  }
  return 0;
}
