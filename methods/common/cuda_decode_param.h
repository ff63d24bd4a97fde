#pragma once
// The `cuda_decode` parameter of the stores that have CUDA decode kernels (paged, kivi's kernel
// store): one name table for the kernel choice, whichever store's enum it selects (each names its
// values kCudaCores, kTensorCores, kAuto).

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "harness/common/params.h"

namespace kvb {

template <typename Kernel>
inline constexpr EnumName<Kernel> kCudaDecodeKernels[3] = {{Kernel::kCudaCores, "cuda_cores"},
                                                           {Kernel::kTensorCores, "tensor_cores"},
                                                           {Kernel::kAuto, "auto"}};

// Default cuda_cores; `doc` says what the other kernels are for this store.
template <typename Kernel>
ParamSpec cuda_decode_param(std::string doc) {
  return enum_param("cuda_decode", kCudaDecodeKernels<Kernel>, Kernel::kCudaCores, std::move(doc));
}

template <typename Kernel>
Kernel parse_cuda_decode(const nlohmann::json& resolved) {
  return param_enum(resolved, "cuda_decode", kCudaDecodeKernels<Kernel>);
}

}  // namespace kvb
