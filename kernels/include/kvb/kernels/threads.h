#pragma once
// The CPU thread policy: one OpenMP pool for everything. The kernels and the engine's matmuls split
// their own work over OpenMP threads and call the BLAS single-threaded, because a second pool (the
// pthread OpenBLAS that Debian links) spinning beside OpenMP's costs a time slice per hand-over once
// the threads outnumber the cores: on 2 cores a SmolLM2 decode step took 500 ms with both pools
// against 90 ms with one.

namespace kvb::kernels {

// Threads for the CPU kernels from now on (n >= 1); holds the BLAS at one thread.
void set_cpu_threads(int n);
// The OpenMP threads a parallel region gets (omp_get_max_threads).
int cpu_threads();
// The BLAS's own thread count (1 under this policy; 1 when the BLAS cannot say).
int blas_threads();

// Work (in multiply-adds) below which a region stays on one thread: an OpenMP fork/join costs a few
// microseconds, about what 100K multiply-adds cost one core.
constexpr double kMinParallelMacs = 1 << 17;

}  // namespace kvb::kernels
