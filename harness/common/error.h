#pragma once
// kvb::Error: the one exception type for anything a user can cause (a bad file, config key, value or
// flag). Its message names the input. The CLI prints it as one line and exits non-zero.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvb {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
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
