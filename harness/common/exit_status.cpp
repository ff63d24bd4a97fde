#include "harness/common/exit_status.h"

#include <ostream>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"

namespace kvb {

int report_failure(const std::exception_ptr& failure, const std::string& program, std::ostream& err) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    err << program << ": error: " << e.what() << "\n";
    return kExitUserError;
  } catch (const InternalError& e) {
    err << program << ": " << e.what() << "\n";  // what() starts "internal error in <component>"
    return kExitInternalError;
  } catch (const std::exception& e) {
    err << program << ": internal error: " << e.what() << "\n";
    return kExitInternalError;
  } catch (...) {
    err << program << ": internal error: an exception that is not a std::exception\n";
    return kExitInternalError;
  }
}

}  // namespace kvb
