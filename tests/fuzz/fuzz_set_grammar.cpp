// libFuzzer target for the `--set key=value` grammar: the input is lines, the first a JSON config
// (or anything), the rest --set arguments. Any input gives an updated config or a kvb::Error.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/common/config_overrides.h"
#include "harness/common/error.h"
#include "harness/common/json_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= in.size()) {
    const size_t nl = in.find('\n', start);
    lines.push_back(in.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  nlohmann::json config = nlohmann::json::object();
  try {
    if (!lines.empty() && !kvb::parse_json_if_valid(lines[0], "<fuzz config>", &config))
      config = nlohmann::json::object();
    kvb::apply_overrides(
        config, std::vector<std::string>(lines.begin() + (lines.empty() ? 0 : 1), lines.end()));
    (void)config.dump();
  } catch (const kvb::Error&) {
  }
  return 0;
}
