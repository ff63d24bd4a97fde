#pragma once
// An enum's names in one table, read both ways, so that printing a value and parsing its name
// cannot disagree and a new value is one row.

#include <cstddef>
#include <string>

#include "harness/common/error.h"

namespace kvb {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// "?" for a value the table lacks.
template <typename E, std::size_t N>
const char* enum_name(const EnumName<E> (&names)[N], E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}

// Throws kvb::Error "unknown <what> '<s>' (allowed: <the names in table order>)".
template <typename E, std::size_t N>
E parse_enum(const EnumName<E> (&names)[N], const std::string& s, const char* what) {
  std::string allowed;
  for (const auto& n : names) {
    if (s == n.name) return n.value;
    allowed += (allowed.empty() ? "" : ", ") + std::string(n.name);
  }
  KVB_FAIL("unknown ", what, " '", s, "' (allowed: ", allowed, ")");
}

}  // namespace kvb
