#pragma once
// The one rule for names in kvbench's registries (methods, protocols): non-empty, [a-z0-9_]+, so a
// name is a config value, a file-name part and a SQL literal without quoting. `kind` names the
// registry in the message ("method", "protocol").

#include <string>

#include "harness/common/error.h"

namespace kvb {

inline void check_registry_name(const std::string& kind, const std::string& name) {
  KVB_CHECK(!name.empty(), kind, " registration: empty name");
  for (char c : name)
    KVB_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_', kind, " name '", name,
              "' must match [a-z0-9_]+");
}

}  // namespace kvb
