#pragma once
// Canonical JSON and the config hash that identifies a run in the results DB. Two configs that mean
// the same thing must hash the same, on any machine and any build: key order never matters
// (nlohmann::json keeps object keys sorted), and a number is written the same way whether it
// arrived as 1, 1.0 or 1e0.

#include <nlohmann/json.hpp>
#include <string>

namespace kvb {

// A copy of `value` with numbers normalised: a floating-point number with an integral value whose
// magnitude is below 2^53 becomes an integer (1.0 -> 1, -0.0 -> 0), as RFC 8785 writes numbers.
// Throws kvb::Error, naming the JSON pointer of the value, for NaN or infinity: JSON cannot hold
// them and nlohmann would silently write null.
nlohmann::json canonicalize_json(const nlohmann::json& value);

// The canonical text: canonicalize_json(value) dumped compactly (no spaces, sorted keys, UTF-8 kept
// as is, floats in shortest round-trip form). Also throws kvb::Error for strings that are not
// UTF-8.
std::string canonical_json(const nlohmann::json& value);

// sha256_hex(canonical_json(config)): 64 lower-case hex characters.
std::string config_hash(const nlohmann::json& config);

}  // namespace kvb
