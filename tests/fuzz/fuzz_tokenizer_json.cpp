// libFuzzer target for tokenizer.json parsing and encoding: any bytes must give a tokenizer or a
// kvb::Error, never a crash, a sanitizer report or a huge allocation. A file that loads then
// encodes a fixed text (specials, digits, CJK, invalid UTF-8) and text taken from the input's tail,
// and decodes the ids. Built with KVB_BUILD_FUZZ (tests/fuzz/CMakeLists.txt), run by scripts/fuzz.sh.

#include <cstddef>
#include <cstdint>
#include <string>

#include "harness/common/error.h"
#include "harness/formats/bpe_tokenizer.h"
#include "harness/formats/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const kvb::BpeTokenizer tok(kvb::tokenizer_spec_from_json(bytes, "<fuzz>"));
    const std::string tail = bytes.substr(size > 64 ? size - 64 : 0);
    for (const std::string& text :
         {std::string("Hello <s> world 12345 \xE6\x97\xA5\xE6\x9C\xAC \xFF\xFE  \n\n"), tail}) {
      const auto ids = tok.encode(text);
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
    }
  } catch (const kvb::Error&) {
  }
  return 0;
}
