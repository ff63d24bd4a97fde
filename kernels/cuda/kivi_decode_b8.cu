// KIVI decode kernels for (k_bits, v_bits) = (8, 8): one file per width so nvcc builds them in
// parallel.
#include "kivi_decode.cuh"

namespace kvb::kernels::cuda {

cudaError_t launch_kivi_decode_b8(const KiviArgs& a, KvDtype dtype, int head_dim, int group,
                                  dim3 grid, cudaStream_t stream, bool tensor_cores) {
  return launch_kivi_decode<8>(a, dtype, head_dim, group, grid, stream, tensor_cores);
}

}  // namespace kvb::kernels::cuda
