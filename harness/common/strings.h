#pragma once
// Small string helpers shared by config validation and the CLI.

#include <string>
#include <string_view>
#include <vector>

namespace kvb {

// Levenshtein distance, for "did you mean" hints.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name`, or "" when none is plausibly a typo of it.
std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" or "" — ready to append to an error message.
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& parts, std::string_view sep);
// Pieces between separators, empty ones kept ("a,,b" -> a, "", b; "" -> one empty piece).
std::vector<std::string> split(std::string_view s, char sep);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);

}  // namespace kvb
