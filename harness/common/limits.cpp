#include "harness/common/limits.h"

#include "harness/common/error.h"

namespace kvb {

void check_thread_count(int64_t n, const std::string& what, bool allow_default) {
  const int64_t lo = allow_default ? 0 : 1;
  KVB_CHECK(n >= lo && n <= kMaxThreads, what, ": ", n, " threads is outside [", lo, ", ",
            kMaxThreads, "]", allow_default ? " (0: LibTorch's default)" : "");
}

}  // namespace kvb
