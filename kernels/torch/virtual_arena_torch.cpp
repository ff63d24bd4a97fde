// LibTorch side of the demand-paged KV arena (see virtual_arena_torch.h).

#include "kernels/torch/virtual_arena_torch.h"

#include <ATen/ATen.h>

#include "kernels/torch/adapter_util.h"

#if KVB_HAVE_CUDA && !KVB_CUDA_EMU
#include "virtual_memory_cuda.h"
#endif

namespace kvb::kernels {

std::unique_ptr<VirtualArena> make_virtual_arena(const c10::Device& device, size_t bytes,
                                                 size_t page_bytes, HugePages huge,
                                                 std::string* error) {
  if (device.is_cpu()) return make_host_virtual_arena(bytes, page_bytes, huge, error);
#if KVB_HAVE_CUDA && !KVB_CUDA_EMU
  if (device.is_cuda())
    return cuda::make_cuda_virtual_arena(device.has_index() ? device.index() : 0, bytes, page_bytes,
                                         error);
#endif
  *error = "device " + device.str() + " has no virtual-memory arena in this build";
  return nullptr;
}

size_t virtual_arena_min_page_bytes(const c10::Device& device, std::string* error) {
  if (device.is_cpu()) return host_os_page_bytes();
#if KVB_HAVE_CUDA && !KVB_CUDA_EMU
  if (device.is_cuda())
    return cuda::vmm_granularity_bytes(device.has_index() ? device.index() : 0, error);
#endif
  *error = "device " + device.str() + " has no virtual-memory arena in this build";
  return 0;
}

at::Tensor arena_view(const VirtualArena& arena, size_t offset, const std::vector<int64_t>& sizes,
                      c10::ScalarType dtype, const c10::Device& device) {
  int64_t elems = 1;
  for (int64_t s : sizes) elems *= s;
  const size_t bytes = static_cast<size_t>(elems) * c10::elementSize(dtype);
  check(offset <= arena.reserved_bytes() && bytes <= arena.reserved_bytes() - offset,
        "arena view of ", bytes, " bytes at ", offset, " past the ", arena.reserved_bytes(),
        "-byte reservation");
  return at::from_blob(static_cast<char*>(arena.base()) + offset, sizes,
                       at::TensorOptions().dtype(dtype).device(device));
}

}  // namespace kvb::kernels
