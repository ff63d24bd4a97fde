#include "kvb/kernels/threads.h"

#include <omp.h>

// OpenBLAS's thread controls; weak, so that a build against another BLAS links and skips them.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
extern "C" int openblas_get_num_threads() __attribute__((weak));

namespace kvb::kernels {

void set_cpu_threads(int n) {
  omp_set_num_threads(n < 1 ? 1 : n);
  if (openblas_set_num_threads) openblas_set_num_threads(1);
}

int cpu_threads() { return omp_get_max_threads(); }

int blas_threads() { return openblas_get_num_threads ? openblas_get_num_threads() : 1; }

}  // namespace kvb::kernels
