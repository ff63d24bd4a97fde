#pragma once
// What the LibTorch adapters of kernels/torch share: kernels/ includes no harness header, so their
// errors are std::invalid_argument (the harness reports any std::exception with its message), and
// the mapping of LibTorch dtypes to the kernels' KvDtype.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <sstream>
#include <stdexcept>

#include "kvb/kernels/decode_attention.h"

namespace kvb::kernels {

template <typename... Args>
void check(bool ok, const Args&... parts) {
  if (ok) return;
  std::ostringstream os;
  (os << ... << parts);
  throw std::invalid_argument(os.str());
}

// Which kernels serve tensors on `d`: the host ones (kernels/cpu) or the CUDA launchers. Only
// under the CUDA emulator (tests/cuda_emu builds these adapters a second time, with KVB_CUDA_EMU)
// can a test send CPU tensors down the CUDA branch: there, device pointers are host pointers.
#if KVB_CUDA_EMU
inline bool& emulated_cuda_on_cpu() {
  static bool on = false;
  return on;
}
inline bool host_kernels(const c10::Device& d) { return d.is_cpu() && !emulated_cuda_on_cpu(); }
inline bool cuda_kernels(const c10::Device& d) {
  return d.is_cuda() || (d.is_cpu() && emulated_cuda_on_cpu());
}
#else
inline bool host_kernels(const c10::Device& d) { return d.is_cpu(); }
inline bool cuda_kernels(const c10::Device& d) { return d.is_cuda(); }
#endif

// fp16, bf16, fp32 -> KvDtype; false for any other dtype.
inline bool to_kv_dtype(c10::ScalarType t, KvDtype* out) {
  switch (t) {
    case c10::kHalf:
      *out = KvDtype::kF16;
      return true;
    case c10::kBFloat16:
      *out = KvDtype::kBF16;
      return true;
    case c10::kFloat:
      *out = KvDtype::kF32;
      return true;
    default:
      return false;
  }
}

}  // namespace kvb::kernels
