# Warnings for kvbench's own code (not for third-party headers).
add_library(kvb_warnings INTERFACE)
target_compile_options(kvb_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
option(KVB_WERROR "Treat warnings as errors" OFF)
if(KVB_WERROR)
  target_compile_options(kvb_warnings INTERFACE -Werror)
endif()
# Torch's own flags arrive as one string; split them so target_compile_options can use them.
separate_arguments(TORCH_CXX_FLAGS_LIST UNIX_COMMAND "${TORCH_CXX_FLAGS}")
