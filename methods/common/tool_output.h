#pragma once
// What the methods' offline tools (dms-train, packet-train, kvtuner-search) share on the command
// line: progress lines on stderr, each prefixed with the tool's name and all silenced by --quiet,
// and one summary object printed as JSON on stdout, where scripts read it; a trainer's summary
// starts with the adapter it wrote and the steps that trained it.

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace CLI {
class App;
}

namespace kvb {

using ProgressLog = std::function<void(const std::string&)>;

// Adds --quiet,-q ("no progress lines") to `sub`.
void add_quiet_flag(CLI::App* sub, bool* quiet);

// Writes "<tool>: <line>" to stderr per progress line; null (no progress) when `quiet`.
ProgressLog tool_progress(const std::string& tool, bool quiet);

// `summary` on stdout, indented by 2, then a newline.
void print_tool_summary(const nlohmann::json& summary);

// The summary of a tool that trained an adapter and wrote it to `path`: {"adapter": path, "steps":
// steps} with the entries of `results` (the method's own metrics and settings).
void print_trained_adapter(const std::string& path, int64_t steps, nlohmann::json results);

}  // namespace kvb
