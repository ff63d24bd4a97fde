// libFuzzer target for config.json (parse_hf_config): any text gives a validated ModelConfig or a
// kvb::Error. A config that parses must satisfy what the loader then relies on.

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/common/error.h"
#include "harness/common/limits.h"
#include "harness/formats/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvb::ModelConfig c =
        kvb::parse_hf_config(std::string(reinterpret_cast<const char*>(data), size), "<fuzz>");
    if (c.max_seq_len < 1 || c.max_seq_len > kvb::kMaxContextTokens ||
        c.n_heads % c.n_kv_heads != 0)
      __builtin_trap();
    (void)c.parameter_count();
    (void)c.kv_bytes_per_token(4);
    (void)c.to_json().dump();
  } catch (const kvb::Error&) {
  }
  return 0;
}
