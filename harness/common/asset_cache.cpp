#include "harness/common/asset_cache.h"

#include <cstdlib>

namespace kvb {

std::string kvb_asset_cache_dir() {
  if (const char* env = std::getenv("KVBENCH_CACHE"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kvbench";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kvbench";
  return "";
}

}  // namespace kvb
