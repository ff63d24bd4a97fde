#pragma once
// The CUDA twin of the demand-paged KV arena (kvb/kernels/virtual_memory.h), vAttention's
// mechanism: cuMemAddressReserve reserves the range, each committed page is a physical allocation
// (cuMemCreate, pinned device memory) mapped with cuMemMap and opened with cuMemSetAccess, and a
// decommitted page is unmapped and released. Unmodified kernels then read the range as ordinary
// device memory.
//
// The driver API is reached through cudart's cudaGetDriverEntryPointByVersion, so nothing links
// libcuda: a binary built with these sources starts on a machine without a GPU driver, and
// make_cuda_virtual_arena answers there with an error instead.
//
// Page size: a multiple of the device's allocation granularity (2 MiB on current GPUs);
// vAttention's 64/128/256 KiB pages need the authors' patched UVM driver and are refused here,
// naming the granularity.

#include <cstddef>
#include <memory>
#include <string>

#include "kvb/kernels/virtual_memory.h"

namespace kvb::kernels::cuda {

// The device's minimum physical allocation granularity in bytes, or 0 with *error set.
size_t vmm_granularity_bytes(int device, std::string* error);

// Reserves `bytes` (rounded up to page_bytes) of device address space on `device`. Null with
// *error set when there is no driver or device, the device lacks VMM support, or page_bytes is
// not a multiple of the granularity.
std::unique_ptr<VirtualArena> make_cuda_virtual_arena(int device, size_t bytes, size_t page_bytes,
                                                      std::string* error);

}  // namespace kvb::kernels::cuda
