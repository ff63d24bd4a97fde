#pragma once
// KVB_CPU_CLONES on a CPU kernel's work-item function compiles it twice, for x86-64-v3 (AVX2, FMA,
// F16C) and for the baseline (SSE2), and picks one at load time by the CPU (GCC/Clang
// target_clones, an ifunc). Builds stay portable (no -march) while the machines that have AVX2,
// nearly all of them, run 8-wide loops. The small inline helpers the item calls (dot_f32,
// load_row, half_to_float_fast) are inlined into each clone; a helper left out of line is the
// baseline one, so no clone ever reaches an instruction its CPU lacks. Both clones compute the same
// bits: kvb_kernels is compiled with -ffp-contract=off (GCC would otherwise fuse a*b+c into FMAs in
// the AVX2 clone) and the loops vectorise without reassociation (test:
// CpuClones.PagedAttentionIsTheInOrderScalarArithmeticBitForBit). KVB_NO_CPU_CLONES turns it off.

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(KVB_NO_CPU_CLONES) && !defined(__CUDACC__)
#define KVB_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KVB_CPU_CLONES
#endif
