#include "harness/common/exit_status.h"

#include <ostream>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/text_escape.h"

namespace kvb {

namespace {

// A message as one bounded line: kvb::Error messages already are; LibTorch's and the standard
// library's may quote inputs (and span lines) as they like.
std::string one_line(const char* what) {
  return escape_control_bytes(bounded_text(what, Error::kMaxMessageBytes, Error::kMaxMessageBytes));
}

}  // namespace

int report_failure(const std::exception_ptr& failure, const std::string& program, std::ostream& err) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    err << program << ": error: " << e.what() << "\n";
    return kExitUserError;
  } catch (const InternalError& e) {
    err << program << ": " << one_line(e.what())
        << "\n";  // what() starts "internal error in <component>"
    return kExitInternalError;
  } catch (const std::exception& e) {
    err << program << ": internal error: " << one_line(e.what()) << "\n";
    return kExitInternalError;
  } catch (...) {
    err << program << ": internal error: an exception that is not a std::exception\n";
    return kExitInternalError;
  }
}

}  // namespace kvb
