#include "harness/kv/context_pass.h"

#include <set>

namespace kvb {
namespace {

std::set<std::string>& context_pass_methods() {
  static std::set<std::string> names;  // filled by static registrations, read after main starts
  return names;
}

}  // namespace

void declare_needs_context_pass(const std::string& method) { context_pass_methods().insert(method); }

bool method_needs_context_pass(const std::string& method) {
  return context_pass_methods().count(method) > 0;
}

}  // namespace kvb
