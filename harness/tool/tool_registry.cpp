#include "harness/tool/tool_registry.h"

#include <algorithm>

#include "harness/common/error.h"

namespace kvb {

ToolRegistry& ToolRegistry::instance() {
  static ToolRegistry registry;
  return registry;
}

void ToolRegistry::add(ToolInfo info) {
  KVB_CHECK(!info.name.empty(), "tool registration: empty name");
  for (char c : info.name)
    KVB_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-', "tool name '", info.name,
              "' must match [a-z0-9-]+");
  KVB_CHECK(!info.summary.empty(), "tool '", info.name, "': empty summary");
  KVB_CHECK(static_cast<bool>(info.setup), "tool '", info.name, "': no setup function");
  auto it = tools_.find(info.name);
  KVB_CHECK(it == tools_.end(), "tool '", info.name, "' is already registered (",
            it == tools_.end() ? "" : it->second.origin, ")");
  const std::string name = info.name;
  tools_.emplace(name, std::move(info));
}

std::vector<const ToolInfo*> ToolRegistry::tools() const {
  std::vector<const ToolInfo*> out;
  for (const auto& [name, info] : tools_) out.push_back(&info);
  return out;
}

std::vector<std::string> ToolRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : tools_) out.push_back(name);
  return out;
}

void ToolRegistry::add_subcommands(CLI::App& app) const {
  for (const ToolInfo* t : tools()) t->setup(app.add_subcommand(t->name, t->summary));
}

void ToolRegistry::set_origin_of_new(const std::vector<std::string>& before, const std::string& origin) {
  for (auto& [name, info] : tools_)
    if (std::find(before.begin(), before.end(), name) == before.end()) info.origin = origin;
}

std::vector<std::string> ToolRegistry::take_registration_errors() {
  std::vector<std::string> out;
  out.swap(registration_errors_);
  return out;
}

void ToolRegistry::add_registration_error(std::string message) {
  registration_errors_.push_back(std::move(message));
}

namespace detail {

ToolRegistrar::ToolRegistrar(const char* name, const char* summary, std::function<void(CLI::App*)> setup) {
  try {
    ToolRegistry::instance().add({name, summary, std::move(setup), "builtin"});
  } catch (const std::exception& e) {
    ToolRegistry::instance().add_registration_error(e.what());
  }
}

}  // namespace detail
}  // namespace kvb
