#pragma once
// How a command-line program turns the exception that ended it into one line on stderr and an exit
// status, so that a user can tell their own mistake from a bug (harness/common/error.h,
// harness/common/internal_error.h):
//
//   kvb::Error            "<program>: error: <message>"                      exit 2 (the user's input)
//   kvb::InternalError    "<program>: internal error in <component>: ..."    exit 1 (a bug)
//   any other exception   "<program>: internal error: <what()>"              exit 1 (LibTorch, std)
//
// Torch-free: part of kvb_base.

#include <exception>
#include <iosfwd>
#include <string>

namespace kvb {

constexpr int kExitInternalError = 1;
constexpr int kExitUserError = 2;

// Prints `failure` (non-null) to `err` as above and returns the exit status.
int report_failure(const std::exception_ptr& failure, const std::string& program, std::ostream& err);

}  // namespace kvb
