#pragma once
// The CUDA emulator's stand-in for the toolkit's <cuda_runtime_api.h> (tests/cuda_emu/kvb_cuda_emu.h).
#include "../kvb_cuda_emu.h"
