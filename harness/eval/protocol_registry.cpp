#include "harness/eval/protocol_registry.h"

#include "harness/common/error.h"
#include "harness/common/registry_name.h"
#include "harness/common/strings.h"

namespace kvb {

ProtocolRegistry& ProtocolRegistry::instance() {
  static ProtocolRegistry* r = new ProtocolRegistry();  // outlives every static destructor
  return *r;
}

void ProtocolRegistry::add(std::unique_ptr<Protocol> protocol) {
  KVB_CHECK(protocol != nullptr, "protocol registration: no protocol");
  ProtocolInfo info = protocol->info();
  check_registry_name("protocol", info.name);
  auto it = protocols_.find(info.name);
  KVB_CHECK(it == protocols_.end(), "protocol '", info.name, "' is registered twice (",
            it == protocols_.end() ? "" : it->second.info.origin, " and ", info.origin, ")");
  // Every default must satisfy its own schema: a broken schema fails at registration, not in a
  // grid.
  resolve_params(info.params, nlohmann::json::object(), "protocol " + info.name);
  const std::string name = info.name;
  protocols_.emplace(name, Entry{std::move(info), std::move(protocol)});
}

const Protocol& ProtocolRegistry::get(const std::string& name) const {
  auto it = protocols_.find(name);
  KVB_CHECK(it != protocols_.end(), "protocol.name: unknown protocol '", name, "'",
            did_you_mean(name, names()), "; known: ", join(names(), ", ").c_str());
  return *it->second.protocol;
}

const ProtocolInfo& ProtocolRegistry::info(const std::string& name) const {
  get(name);  // unknown -> error with hint
  return protocols_.at(name).info;
}

const ProtocolReport& ProtocolRegistry::report(const std::string& name) const {
  static const ProtocolReport unknown;
  auto it = protocols_.find(name);
  return it == protocols_.end() ? unknown : it->second.info.report;
}

std::vector<std::string> ProtocolRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& kv : protocols_) out.push_back(kv.first);
  return out;
}

void ProtocolRegistry::set_origin(const std::string& name, const std::string& origin) {
  get(name);
  protocols_.at(name).info.origin = origin;
}

nlohmann::json protocol_info_json(const ProtocolInfo& info) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : info.params) params.push_back(param_spec_json(p));
  return {{"name", info.name},     {"summary", info.summary},
          {"origin", info.origin}, {"needs_tokenizer", info.needs_tokenizer},
          {"params", params},      {"default_metric", info.report.default_metric}};
}

detail::ProtocolRegistration::ProtocolRegistration(std::unique_ptr<Protocol> protocol) {
  ProtocolRegistry::instance().add(std::move(protocol));
}

}  // namespace kvb
