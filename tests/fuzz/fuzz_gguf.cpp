// libFuzzer target for the GGUF reader: any bytes must give a valid GgufFile or a kvb::Error, never a
// crash, a sanitizer report or a huge allocation. A file that parses is read the way the loader reads
// it: every metadata getter, and every supported tensor dequantized (bounded, so that a large valid
// tensor does not slow the fuzzer down).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvb::GgufFile f(std::string(reinterpret_cast<const char*>(data), size), "<fuzz>");
    for (const auto& [key, v] : f.metadata()) {
      // The typed getters on every key: each either returns or throws kvb::Error.
      try { (void)f.get_int(key); } catch (const kvb::Error&) {}
      try { (void)f.get_float(key); } catch (const kvb::Error&) {}
      try { (void)f.get_string(key); } catch (const kvb::Error&) {}
      try { (void)f.get_bool(key); } catch (const kvb::Error&) {}
      try { (void)f.get_strings(key).size(); } catch (const kvb::Error&) {}
      try { (void)f.get_ints(key).size(); } catch (const kvb::Error&) {}
      try { (void)f.get_floats(key).size(); } catch (const kvb::Error&) {}
    }
    std::vector<float> out;
    for (const kvb::GgufTensor& t : f.tensors()) {
      (void)t.shape();
      if (!kvb::ggml_type_supported(t.type) || t.numel() > (int64_t{1} << 22)) continue;
      out.assign(static_cast<size_t>(t.numel()), 0.f);
      kvb::gguf_dequantize(t, out.data());
    }
  } catch (const kvb::Error&) {
  }
  return 0;
}
