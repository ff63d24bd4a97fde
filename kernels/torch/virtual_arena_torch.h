#pragma once
// LibTorch side of the demand-paged KV arena (kvb/kernels/virtual_memory.h): the arena for a
// tensor device (the host mmap arena on CPU, CUDA's virtual memory API on CUDA) and tensor views
// of its reserved range. The one place where the arena meets tensors.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "kvb/kernels/virtual_memory.h"

namespace kvb::kernels {

// Null with *error set when the device has no arena (no CUDA build, no driver, an unsupported page
// size) or the reservation fails.
std::unique_ptr<VirtualArena> make_virtual_arena(const c10::Device& device, size_t bytes,
                                                 size_t page_bytes, HugePages huge,
                                                 std::string* error);

// The smallest page the device's arena maps: the OS page on the host, the VMM granularity on
// CUDA; 0 with *error set where there is none.
size_t virtual_arena_min_page_bytes(const c10::Device& device, std::string* error);

// A tensor over the arena's range starting at byte `offset`: `sizes` contiguous elements of
// `dtype` on `device` (the arena's device), not owning the memory. Only committed pages may be
// touched through it.
at::Tensor arena_view(const VirtualArena& arena, size_t offset, const std::vector<int64_t>& sizes,
                      c10::ScalarType dtype, const c10::Device& device);

}  // namespace kvb::kernels
