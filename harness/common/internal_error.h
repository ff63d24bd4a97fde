#pragma once
// kvb::InternalError: a broken invariant of kvbench's own code or of a plugin (a tensor of the wrong
// shape between two of our components, a sequence id a store never saw, a DB migration list out of
// order). No input can cause it, so instead of naming an input (what kvb::Error, harness/common/
// error.h, does for a user's mistake) the message names the component that failed. Raised by
// KVB_ASSERT / KVB_UNREACHABLE; the CLI prints "internal error in <component>: ..." and exits 1, where
// a user error exits 2 (harness/common/exit_status.h).
//
// InternalError is deliberately not a kvb::Error: code that catches user errors to add context or to
// fall back (`catch (const kvb::Error&)`) must not swallow a bug.
// Torch-free: part of kvb_base.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "harness/common/error.h"  // detail::concat

namespace kvb {

class InternalError : public std::logic_error {
 public:
  // what() is "internal error in <component>: <message> (<file>:<line>)".
  InternalError(std::string component, const std::string& message, const char* file, int line)
      : std::logic_error(format(component, message, file, line)), component_(std::move(component)) {}
  const std::string& component() const { return component_; }

 private:
  static std::string format(const std::string& component, const std::string& message, const char* file,
                            int line) {
    std::ostringstream os;
    os << "internal error in " << component << ": " << message << " (" << file << ":" << line << ")";
    return os.str();
  }
  std::string component_;
};

}  // namespace kvb

// KVB_ASSERT(cond, component, parts...): an invariant of kvbench's own code. Throws
// kvb::InternalError naming `component` (a short name such as "engine" or "results_db") and the
// failed condition. Always on (not an assert(): Release builds are the ones that run benchmarks).
#define KVB_ASSERT(cond, component, ...)                                                      \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::kvb::InternalError(component,                                                   \
                                 ::kvb::detail::concat("assertion `" #cond "` failed: ", __VA_ARGS__), \
                                 __FILE__, __LINE__);                                         \
  } while (0)

// KVB_UNREACHABLE(component, parts...): an internal error, unconditionally (a switch over all cases
// that fell through, a state no caller can reach).
#define KVB_UNREACHABLE(component, ...) \
  throw ::kvb::InternalError(component, ::kvb::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
