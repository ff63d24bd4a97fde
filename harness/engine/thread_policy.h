#pragma once
// The one CPU thread policy of a kvbench process (kvb/kernels/threads.h says why one pool): LibTorch's
// intra-op threads and the kernels' OpenMP regions get the same count, the BLAS runs single-threaded
// inside them.

namespace kvb {

// threads > 0: use that many; 0: LibTorch's default (the machine's cores). Call before any work and
// again whenever a config sets its own count.
void apply_thread_policy(int threads);

}  // namespace kvb
