#pragma once
// The one way kvbench parses JSON it did not write itself in this process: configs, model files,
// JSONL data, request traces, and the JSON columns of a results database (which anyone may edit).
// nlohmann's parser is iterative, but destroying, dumping and walking a document recurse, so a few
// kilobytes of "[[[[..." would overflow the stack later; the parse refuses such nesting up front.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kvb {

// Deeper than any file kvbench reads legitimately (its own configs nest 4-5 levels, safetensors
// headers 3) and far shallower than what exhausts a thread's stack.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text`; throws kvb::Error "<source>: not valid JSON: <nlohmann's message, with the position>"
// on a syntax error, or
// nesting deeper than `max_depth`.
nlohmann::json parse_json(std::string_view text, const std::string& source,
                          int max_depth = kMaxJsonDepth);

// The same for text that may be JSON or a bare word (`--set key=value`): false on a syntax error,
// leaving *out alone; nesting deeper than `max_depth` still throws.
bool parse_json_if_valid(std::string_view text, const std::string& source, nlohmann::json* out,
                         int max_depth = kMaxJsonDepth);

}  // namespace kvb
