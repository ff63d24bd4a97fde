#pragma once
// Out-of-tree methods: a shared library built against kvbench's installed headers (CMake package
// `kvbench`, target kvbench::plugin) that exports two C functions:
//
//   extern "C" int kvb_plugin_abi_version();                       // must return KVB_PLUGIN_ABI_VERSION
//   extern "C" const char* kvb_plugin_register(kvb::MethodRegistry* registry);  // nullptr or an error
//
// KVB_PLUGIN_ENTRY(body) writes both. Exceptions never cross the boundary. The ABI version changes
// whenever KvCache, LayerInput, StepBatch, Footprint, MethodInfo or the registry change layout.

#include <string>

#include "harness/kv/method_registry.h"

// The ABI version this header describes. (Defining it differently when building a plugin is how the
// tests make a plugin "built for another ABI version"; kvbench itself always uses this value.)
#ifndef KVB_PLUGIN_ABI_VERSION
#define KVB_PLUGIN_ABI_VERSION 1
#endif

#define KVB_PLUGIN_ENTRY(registry_var)                                                  \
  static void kvb_plugin_register_impl(::kvb::MethodRegistry* registry_var);              \
  extern "C" __attribute__((visibility("default"))) int kvb_plugin_abi_version() {      \
    return KVB_PLUGIN_ABI_VERSION;                                                      \
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

// dlopens `path`, checks its ABI version and registers its methods (their origin says plugin:<path>).
// Throws kvb::Error naming the path on a missing file, a missing entry point, an ABI mismatch or a
// registration error.
void load_plugin(const std::string& path);
int host_plugin_abi_version();

}  // namespace kvb
