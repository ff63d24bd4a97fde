#include "harness/engine/thread_policy.h"

#include <ATen/Parallel.h>

#include "kvb/kernels/threads.h"

namespace kvb {

void apply_thread_policy(int threads) {
  if (threads > 0) at::set_num_threads(threads);
  kernels::set_cpu_threads(at::get_num_threads());
}

}  // namespace kvb
