#pragma once
// kvb::Error: the one exception type for anything a user can cause (a bad file, config key, value
// or flag). Its message names the input. The CLI prints it as one line and exits non-zero.
//
// Whatever a message quotes stays readable: every std::string part of KVB_CHECK / KVB_FAIL (names,
// paths, values: the inputs) longer than kMaxShownInputBytes is cut to its head with its length,
// and the finished message has its control bytes escaped (text_escape.h), so a NUL does not cut it,
// a newline does not split it and an escape sequence does not reach the terminal.

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "harness/common/text_escape.h"

namespace kvb {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message)
      : std::runtime_error(
            escape_control_bytes(bounded_text(message, kMaxMessageBytes, kMaxMessageBytes))) {}

  // A message built another way than concat (below) is still bounded as a whole.
  static constexpr size_t kMaxMessageBytes = 8192;
};

namespace detail {
// One part of a message: text (std::string, std::string_view) comes from inputs and is bounded;
// literals and numbers are the message's own words.
template <typename T>
void put_part(std::ostringstream& os, const T& part) {
  os << part;
}
inline void put_part(std::ostringstream& os, const std::string& part) { os << bounded_text(part); }
inline void put_part(std::ostringstream& os, std::string_view part) { os << bounded_text(part); }

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (put_part(os, args), ...);
  return os.str();
}
}  // namespace detail

}  // namespace kvb

// KVB_CHECK(cond, parts...): throw kvb::Error built from the streamed parts when cond is false.
#define KVB_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) throw ::kvb::Error(::kvb::detail::concat(__VA_ARGS__)); \
  } while (0)

// KVB_FAIL(parts...): throw unconditionally.
#define KVB_FAIL(...) throw ::kvb::Error(::kvb::detail::concat(__VA_ARGS__))
