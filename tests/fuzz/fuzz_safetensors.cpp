// libFuzzer target for the safetensors reader: any bytes give a validated file (every tensor's span
// inside the data section, dtype x shape = bytes) or a kvb::Error, never a crash or sanitizer
// report. A file that parses has every tensor read end to end, so that a span check that is off by
// one shows up as an ASan read past the mapping.

#include <cstddef>
#include <cstdint>

#include "harness/common/error.h"
#include "harness/formats/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvb::fuzz::write_input(data, size, "model.safetensors");
  try {
    const kvb::SafetensorsFile f(path);
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : f.tensors()) {
      if (t.numel() * static_cast<int64_t>(kvb::st_dtype_size(t.dtype)) !=
          static_cast<int64_t>(t.nbytes))
        __builtin_trap();  // the reader promised dtype x shape = bytes
      for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
    }
    for (const auto& [k, v] : f.metadata()) (void)k.size(), (void)v.size();
  } catch (const kvb::Error&) {
  }
  return 0;
}
