#pragma once
// What the LibTorch adapters of kernels/torch share: their argument check, and the mapping of
// LibTorch dtypes to the kernels' KvDtype. The adapters are called only by kvbench's own stores with
// tensors those stores built, so a failed check is a bug there, never a user's input: it throws
// kvb::InternalError (harness/common/internal_error.h, in the torch-free core below this layer) naming
// "kernels/torch". The torch-free kernels under kernels/ include no harness header at all.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "harness/common/internal_error.h"
#include "kvb/kernels/decode_attention.h"

namespace kvb::kernels {

// The caller's file and line come from the builtins GCC and Clang both have (check is a function,
// not a macro, so __FILE__ would name this header).
template <typename... Args>
struct check {
  explicit check(bool ok, const Args&... parts, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
    if (ok) return;
    throw ::kvb::InternalError("kernels/torch", ::kvb::detail::concat(parts...), file, line);
  }
};
template <typename... Args>
check(bool, const Args&...) -> check<Args...>;

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
