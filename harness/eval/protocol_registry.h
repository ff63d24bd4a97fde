#pragma once
// The registry of protocols: built-in ones register from static initialisers (their files are
// linked as objects, like the methods, so the linker cannot drop them), plugins register in their
// entry point.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/eval/protocol.h"

namespace kvb {

class ProtocolRegistry {
 public:
  static ProtocolRegistry& instance();  // never destroyed

  // Throws kvb::Error on a duplicate or malformed name, or a parameter default its schema refuses.
  void add(std::unique_ptr<Protocol> protocol);
  bool has(const std::string& name) const { return protocols_.count(name) != 0; }
  // Throws kvb::Error naming `name`, with a nearest-name hint, when unknown.
  const Protocol& get(const std::string& name) const;
  const ProtocolInfo& info(const std::string& name) const;
  // The report hints of `name`; the defaults for a protocol this process does not know (a database
  // written with a plugin that is not loaded now).
  const ProtocolReport& report(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted

  void set_origin(const std::string& name, const std::string& origin);  // the plugin loader's tag

 private:
  struct Entry {
    ProtocolInfo info;
    std::unique_ptr<Protocol> protocol;
  };
  std::map<std::string, Entry> protocols_;
};

nlohmann::json protocol_info_json(const ProtocolInfo& info);

namespace detail {
struct ProtocolRegistration {
  explicit ProtocolRegistration(std::unique_ptr<Protocol> protocol);
};
}  // namespace detail

}  // namespace kvb

// One line at the end of a protocol's .cpp: KVB_REGISTER_PROTOCOL(name, ProtocolClass).
#define KVB_REGISTER_PROTOCOL(name, protocol_class)                                  \
  static const ::kvb::detail::ProtocolRegistration kvb_protocol_registration_##name( \
      std::make_unique<protocol_class>())
