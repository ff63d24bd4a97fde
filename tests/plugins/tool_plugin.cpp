// A plugin that adds a tool (a kvbench subcommand) and no method, for tests/harness/test_tools.cpp:
// `kvbench --plugin libkvb_test_tool_plugin.so fixture-tool --fail user|internal|none`. Its callback
// fails the way it is told, so that the test sees the binary's exit status for a user error (2) and
// for a broken invariant (1, naming the component) through the real main().

#include <iostream>
#include <memory>
#include <string>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/plugin.h"
#include "harness/tool/tool_registry.h"

namespace {

void setup_fixture_tool(CLI::App* sub) {
  auto fail = std::make_shared<std::string>("none");
  sub->add_option("--fail", *fail, "none | user | internal")
      ->check(CLI::IsMember({"none", "user", "internal"}))
      ->capture_default_str();
  sub->callback([fail] {
    KVB_CHECK(*fail != "user", "--fail user: the input this tool was given is wrong");
    KVB_ASSERT(*fail != "internal", "fixture_tool", "the invariant this tool was told to break");
    std::cout << "{\"tool\": \"fixture-tool\", \"ok\": true}\n";
  });
}

}  // namespace

KVB_REGISTER_TOOL("fixture-tool", "a test plugin's tool: succeeds or fails as --fail says",
                  setup_fixture_tool);

KVB_PLUGIN_ENTRY(registry) { (void)registry; }  // no methods: a tool-only plugin
