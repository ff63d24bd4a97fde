# CUDA kernels compile whenever nvcc is present (CI compiles them without a GPU); nothing here needs
# a CUDA LibTorch: kernels/cuda is torch-free.
set(KVB_HAVE_CUDA OFF)
if(NOT KVB_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(CMAKE_CUDA_ARCHITECTURES ${KVB_CUDA_ARCHS})
    set(CMAKE_CUDA_STANDARD 17)
    set(KVB_HAVE_CUDA ON)
    find_package(CUDAToolkit REQUIRED)  # here too: the harness's CUDA adapters need its headers
  elseif(KVB_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVB_WITH_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "kvbench: CUDA kernels ${KVB_HAVE_CUDA}")
