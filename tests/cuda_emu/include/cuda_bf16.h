#pragma once
// The CUDA emulator's stand-in for the toolkit's <cuda_bf16.h> (tests/cuda_emu/kvb_cuda_emu.h).
#include "../kvb_cuda_emu.h"
