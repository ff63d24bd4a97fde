# cmake -DIN=<.cu or .cuh> -DOUT=<file> -P emu_rewrite.cmake
# Copies a CUDA source for the emulator, adding after every `__shared__ T name[...];` a call that
# fills the array with 0xff bytes when the block's first thread reaches it (kvb_cuda_emu.h,
# shared_declared). A plain `static` would keep the previous block's values, and GCC ignores a
# section attribute on the static locals of templates, so the declarations are marked in the source.
# The #line directive keeps diagnostics and __FILE__ on the original file.
file(READ "${IN}" text)
string(REGEX REPLACE "__shared__ ([A-Za-z_0-9:]+) ([A-Za-z_0-9]+)([^;]*);"
  "__shared__ \\1 \\2\\3; ::kvb::emu::shared_declared(\\2, sizeof(\\2));" text "${text}")
set(text "#line 1 \"${IN}\"\n${text}")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
