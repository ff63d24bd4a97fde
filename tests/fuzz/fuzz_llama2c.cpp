// libFuzzer target for the llama2.c checkpoint header: any bytes give a layout whose arrays all lie
// inside the file, or a kvb::Error. The input is the whole file (header and weights).

#include <cstddef>
#include <cstdint>

#include "harness/common/error.h"
#include "harness/formats/llama2c_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvb::Llama2cLayout L = kvb::parse_llama2c_header(data, size, "<fuzz>");
    if (L.expected_bytes > size)
      __builtin_trap();  // the parser promised the file holds every array
    for (const auto& a : L.arrays) {
      size_t n = 1;
      for (int64_t d : a.shape) n *= static_cast<size_t>(d);
      if (28 + 4 * (a.offset_floats + n) > size) __builtin_trap();
    }
  } catch (const kvb::Error&) {
  }
  return 0;
}
