#include "harness/store/config_hash.h"

#include <cmath>

#include "harness/common/error.h"
#include "harness/common/sha256.h"

namespace kvb {
namespace {

// Escapes a key for a JSON pointer (RFC 6901), so error messages point at the exact value.
std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

nlohmann::json canonicalize_at(const nlohmann::json& v, const std::string& pointer) {
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      nlohmann::json out = nlohmann::json::object();
      for (auto it = v.begin(); it != v.end(); ++it) {
        out[it.key()] = canonicalize_at(it.value(), pointer + "/" + pointer_token(it.key()));
      }
      return out;
    }
    case nlohmann::json::value_t::array: {
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < v.size(); ++i) {
        out.push_back(canonicalize_at(v[i], pointer + "/" + std::to_string(i)));
      }
      return out;
    }
    case nlohmann::json::value_t::number_float: {
      const double d = v.get<double>();
      KVB_CHECK(std::isfinite(d), "config value at '", pointer.empty() ? "/" : pointer, "' is ", d,
                ": JSON configs cannot hold NaN or infinity");
      constexpr double kExactIntegerLimit = 9007199254740992.0;  // 2^53
      if (std::trunc(d) == d && std::fabs(d) < kExactIntegerLimit) {
        return nlohmann::json(static_cast<int64_t>(d));
      }
      return v;
    }
    case nlohmann::json::value_t::number_unsigned: {
      // Unsigned and signed integers print alike; store one type so equal values compare equal.
      const uint64_t u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return nlohmann::json(static_cast<int64_t>(u));
      return v;
    }
    case nlohmann::json::value_t::binary:
      KVB_FAIL("config value at '", pointer.empty() ? "/" : pointer,
               "' is binary data, which has no JSON text form");
    default:
      return v;
  }
}

}  // namespace

nlohmann::json canonicalize_json(const nlohmann::json& value) { return canonicalize_at(value, ""); }

std::string canonical_json(const nlohmann::json& value) {
  nlohmann::json canonical = canonicalize_json(value);
  try {
    return canonical.dump();
  } catch (const nlohmann::json::type_error& e) {
    // dump() throws type_error 316 on invalid UTF-8; say so in kvbench's terms.
    KVB_FAIL("config cannot be written as canonical JSON: ", e.what());
  }
}

std::string config_hash(const nlohmann::json& config) { return sha256_hex(canonical_json(config)); }

}  // namespace kvb
