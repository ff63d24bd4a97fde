// Tools: method subcommands registered from their method folders (harness/tool/tool_registry.h),
// and a plugin's tool run through the kvbench binary, which also pins main()'s exit statuses: a user
// error exits 2 ("kvbench: error: ..."), a broken invariant exits 1 ("kvbench: internal error in
// <component>: ...").

#include <gtest/gtest.h>

#include <string>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/tool/tool_registry.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::run_kvbench;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ToolRegistry, MethodToolsAreRegisteredFromTheirFolders) {
  // kvb_tests links kvb_methods as objects, like kvbench: the tools' static registrations ran.
  std::vector<std::string> builtin;
  for (const ToolInfo* t : ToolRegistry::instance().tools())
    if (t->origin == "builtin") builtin.push_back(t->name);
  EXPECT_EQ(builtin, (std::vector<std::string>{"dms-train", "kept-indices", "kvtuner-search",
                                               "packet-train"}));
}

TEST(ToolRegistry, RefusesMalformedAndDuplicateTools) {
  ToolRegistry r;  // a private registry: the process-wide one keeps its tools
  auto setup = [](CLI::App*) {};
  r.add({"my-tool", "does a thing", setup, "builtin"});
  EXPECT_THROW(r.add({"my-tool", "again", setup, "plugin:x.so"}), Error);
  EXPECT_THROW(r.add({"My_Tool", "bad name", setup, "builtin"}), Error);
  EXPECT_THROW(r.add({"", "no name", setup, "builtin"}), Error);
  EXPECT_THROW(r.add({"no-summary", "", setup, "builtin"}), Error);
  EXPECT_THROW(r.add({"no-setup", "x", nullptr, "builtin"}), Error);
  EXPECT_EQ(r.names(), std::vector<std::string>{"my-tool"});
}

TEST(ToolRegistry, AddsOneSubcommandPerToolWithItsOptions) {
  ToolRegistry r;
  int seen = -1;
  r.add({"b-tool", "second", [&](CLI::App* sub) {
           sub->add_option("--n", seen);
         }, "builtin"});
  r.add({"a-tool", "first", [](CLI::App*) {}, "builtin"});
  CLI::App app;
  r.add_subcommands(app);
  auto subs = app.get_subcommands([](CLI::App*) { return true; });
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[0]->get_name(), "a-tool");  // by name, whatever the registration order
  EXPECT_EQ(subs[1]->get_description(), "second");
  app.parse(std::vector<std::string>{"5", "--n", "b-tool"});  // CLI11 takes the vector reversed
  EXPECT_EQ(seen, 5);
}

TEST(Tools, MethodToolsAreKvbenchSubcommands) {
  auto help = run_kvbench("--help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  for (const char* name : {"dms-train", "kvtuner-search", "packet-train", "run", "tokenize"})
    EXPECT_TRUE(contains(help.out, name)) << name << " missing from:\n" << help.out;
  auto sub = run_kvbench("kvtuner-search --help");
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  EXPECT_TRUE(contains(sub.out, "--budgets")) << sub.out;
  EXPECT_TRUE(contains(sub.out, "--model")) << sub.out;  // the shared model options
  // A tool's own user errors keep exit status 2.
  auto bad = run_kvbench("kvtuner-search --out /tmp/x.json --budgets 4,abc");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, "kvbench: error: --budgets: 'abc' is not a number")) << bad.err;
}

TEST(Tools, PluginToolRunsAndExitStatusesTellUserFromInternalErrors) {
  const std::string plugin = std::string("--plugin ") + KVB_TEST_TOOL_PLUGIN + " ";
  auto help = run_kvbench(plugin + "--help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  EXPECT_TRUE(contains(help.out, "fixture-tool")) << help.out;
  EXPECT_FALSE(contains(run_kvbench("--help").out, "fixture-tool"));  // only with the plugin

  auto ok = run_kvbench(plugin + "fixture-tool");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(contains(ok.out, "\"ok\": true")) << ok.out;
  auto eq = run_kvbench(std::string("--plugin=") + KVB_TEST_TOOL_PLUGIN + " fixture-tool");
  EXPECT_EQ(eq.exit_code, 0) << eq.err;

  auto user = run_kvbench(plugin + "fixture-tool --fail user");
  EXPECT_EQ(user.exit_code, 2) << user.err;
  EXPECT_TRUE(contains(user.err, "kvbench: error: --fail user: the input")) << user.err;
  EXPECT_FALSE(contains(user.err, "internal error")) << user.err;

  auto internal = run_kvbench(plugin + "fixture-tool --fail internal");
  EXPECT_EQ(internal.exit_code, 1) << internal.err;
  EXPECT_TRUE(contains(internal.err, "kvbench: internal error in fixture_tool: ")) << internal.err;
  EXPECT_TRUE(contains(internal.err, "the invariant this tool was told to break")) << internal.err;
  EXPECT_FALSE(contains(internal.err, "kvbench: error:")) << internal.err;
}

}  // namespace
}  // namespace kvb
