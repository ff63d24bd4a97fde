#pragma once
// Built-in word lists for the synthetic tasks' "adjective-noun" keys and values.

#include <string>
#include <vector>

namespace kvb {

// Distinct lower-case ASCII words, in a fixed order (no word is in both lists).
const std::vector<std::string>& key_adjectives();
const std::vector<std::string>& key_nouns();

}  // namespace kvb
