#pragma once
// Out-of-tree methods and protocols: a shared library built against kvbench's installed headers (CMake package
// `kvbench`, target kvbench::plugin) that exports two C functions:
//
//   extern "C" int kvb_plugin_abi_version();                       // must return KVB_PLUGIN_ABI_VERSION
//   extern "C" const char* kvb_plugin_torch_version();             // the LibTorch it was built with
//   extern "C" const char* kvb_plugin_register(kvb::MethodRegistry* registry);  // nullptr or an error
//
// KVB_PLUGIN_ENTRY(body) writes all three. The body adds methods to `registry` and protocols to
// kvb::ProtocolRegistry::instance() (harness/eval/protocol_registry.h):
//
//   KVB_PLUGIN_ENTRY(registry) {
//     registry->add(my_method_info(), make_my_method);
//     kvb::ProtocolRegistry::instance().add(my_protocol());
//   }
//
// A plugin may also add kvbench subcommands with KVB_REGISTER_TOOL (harness/tool/tool_registry.h):
// kvbench loads the plugins named before the subcommand first, so their tools parse like the
// built-in ones. Exceptions never cross the boundary. The ABI version changes whenever KvCache,
// LayerInput, StepBatch, Footprint, MethodInfo, ParamSpec, CacheContext, Protocol, ProtocolInfo, an
// existing capability interface (harness/kv/*: QuestionAwareCache, LookaheadCache, ...) or the
// registries change layout; adding a capability interface does not. The LibTorch version must be
// kvbench's own (tensors cross the boundary: a plugin built against another LibTorch would crash at
// its first call instead of being refused).

#include <torch/version.h>  // TORCH_VERSION

#include <string>

#include "harness/eval/protocol_registry.h"
#include "harness/kv/method_registry.h"

// The ABI version this header describes. (Defining it differently when building a plugin is how the
// tests make a plugin "built for another ABI version"; kvbench itself always uses this value.)
#ifndef KVB_PLUGIN_ABI_VERSION
#define KVB_PLUGIN_ABI_VERSION 7
#endif
// Likewise for the LibTorch version a plugin reports (the tests' "built against another LibTorch").
#ifndef KVB_PLUGIN_TORCH_VERSION
#define KVB_PLUGIN_TORCH_VERSION TORCH_VERSION
#endif

#define KVB_PLUGIN_ENTRY(registry_var)                                                  \
  static void kvb_plugin_register_impl(::kvb::MethodRegistry* registry_var);              \
  extern "C" __attribute__((visibility("default"))) int kvb_plugin_abi_version() {      \
    return KVB_PLUGIN_ABI_VERSION;                                                      \
  }                                                                                     \
  extern "C" __attribute__((visibility("default"))) const char* kvb_plugin_torch_version() { \
    return KVB_PLUGIN_TORCH_VERSION;                                                    \
  }                                                                                     \
  extern "C" __attribute__((visibility("default"))) const char* kvb_plugin_register(    \
      ::kvb::MethodRegistry* registry) {                                                \
    static std::string error;                                                           \
    try {                                                                               \
      kvb_plugin_register_impl(registry);                                               \
      return nullptr;                                                                   \
    } catch (const std::exception& e) {                                                 \
      error = e.what();                                                                 \
      return error.c_str();                                                             \
    }                                                                                   \
  }                                                                                     \
  static void kvb_plugin_register_impl(::kvb::MethodRegistry* registry_var)

namespace kvb {

// dlopens `path`, checks its ABI and LibTorch versions and registers its methods and protocols
// (their origin says plugin:<path>). Throws kvb::Error naming the path on a missing file, a missing entry point, an ABI
// or LibTorch mismatch or a registration error.
void load_plugin(const std::string& path);
int host_plugin_abi_version();

}  // namespace kvb
