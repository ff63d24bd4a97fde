#include "harness/kv/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/eval/protocol_registry.h"
#include "harness/tool/tool_registry.h"

namespace kvb {

int host_plugin_abi_version() { return KVB_PLUGIN_ABI_VERSION; }

namespace {

// The file to hand dlopen: always an absolute path. A name without a slash makes dlopen search the
// library path (LD_LIBRARY_PATH, the binary's RUNPATH, the system directories), so `--plugin x.so`
// could load some other x.so than the file the user named and this check found.
std::string plugin_file(const std::string& path) {
  KVB_CHECK(file_exists(path), "--plugin ", path, ": file not found");
  char* resolved = ::realpath(path.c_str(), nullptr);
  KVB_CHECK(resolved != nullptr, "--plugin ", path, ": cannot resolve its path: ", std::strerror(errno));
  std::string out(resolved);
  std::free(resolved);
  return out;
}

}  // namespace

void load_plugin(const std::string& path) {
  const std::string file = plugin_file(path);
  // A plugin's tools (KVB_REGISTER_TOOL) register from its static initialisers, inside dlopen.
  ToolRegistry& tools = ToolRegistry::instance();
  const auto tools_before = tools.names();
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  KVB_CHECK(h != nullptr, "--plugin ", path, ": cannot load: ", dlerror());
  const auto tool_errors = tools.take_registration_errors();
  KVB_CHECK(tool_errors.empty(), "--plugin ", path, ": tool registration failed: ",
            tool_errors.empty() ? "" : tool_errors.front());
  tools.set_origin_of_new(tools_before, "plugin:" + path);
  auto abi = reinterpret_cast<int (*)()>(dlsym(h, "kvb_plugin_abi_version"));
  auto reg = reinterpret_cast<const char* (*)(MethodRegistry*)>(dlsym(h, "kvb_plugin_register"));
  KVB_CHECK(abi && reg, "--plugin ", path,
            ": not a kvbench plugin (kvb_plugin_abi_version / kvb_plugin_register missing)");
  const int v = abi();
  KVB_CHECK(v == KVB_PLUGIN_ABI_VERSION, "--plugin ", path, ": built for plugin ABI version ", v,
            " but this kvbench has ABI version ", KVB_PLUGIN_ABI_VERSION,
            "; rebuild it against this kvbench's installed headers");
  auto torch_version = reinterpret_cast<const char* (*)()>(dlsym(h, "kvb_plugin_torch_version"));
  KVB_CHECK(torch_version, "--plugin ", path, ": not a kvbench plugin (kvb_plugin_torch_version missing)");
  const std::string tv = torch_version();
  KVB_CHECK(tv == TORCH_VERSION, "--plugin ", path, ": built against LibTorch ", tv,
            " but this kvbench uses LibTorch ", TORCH_VERSION,
            "; rebuild it against this kvbench's installed package (find_package(kvbench) finds the same LibTorch)");
  // Methods and protocols registered by the plugin are tagged with their origin.
  MethodRegistry& r = MethodRegistry::instance();
  ProtocolRegistry& protocols = ProtocolRegistry::instance();
  auto before = r.names();
  auto protocols_before = protocols.names();
  const char* err = reg(&r);
  KVB_CHECK(err == nullptr, "--plugin ", path, ": registration failed: ", err ? err : "");
  for (const auto& n : r.names()) {
    if (std::find(before.begin(), before.end(), n) == before.end())
      const_cast<MethodInfo&>(r.info(n)).origin = "plugin:" + path;
  }
  for (const auto& n : protocols.names())
    if (std::find(protocols_before.begin(), protocols_before.end(), n) == protocols_before.end())
      protocols.set_origin(n, "plugin:" + path);
  // The library stays loaded for the life of the process (its factories are in the registry).
}

}  // namespace kvb
