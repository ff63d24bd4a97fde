#pragma once
// A method's listing (what `kvbench methods` shows and the registry validates against) in one
// expression, for the methods that register a MethodInfo themselves; caps and a target check are
// set on the result by the methods that have them.

#include <string>
#include <utility>
#include <vector>

#include "harness/common/params.h"
#include "harness/kv/method.h"

namespace kvb {

// paper: the citation, "" for an engineering baseline; params: the schema, in listing order.
inline MethodInfo method_listing(std::string name, std::string summary, std::string paper = "",
                                 std::vector<ParamSpec> params = {}) {
  MethodInfo m;
  m.name = std::move(name);
  m.summary = std::move(summary);
  m.paper = std::move(paper);
  m.params = std::move(params);
  return m;
}

}  // namespace kvb
