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
#define KVB_HAVE_CPU_V3 1
#else
#define KVB_CPU_CLONES
#define KVB_HAVE_CPU_V3 0
#endif

// A work item that needs an instruction the vector extensions cannot express (F16C's conversion)
// is a template instantiated twice by hand instead: once in a KVB_CPU_V3 function, built for
// x86-64-v3 only, and once in a plain one; the caller picks by cpu_has_v3(), the test the clones'
// resolver makes. Same arithmetic in both, so the same bits.
#if KVB_HAVE_CPU_V3
#define KVB_CPU_V3 __attribute__((target("arch=x86-64-v3")))
namespace kvb::kernels::detail {
inline bool cpu_has_v3() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v3");
}
}  // namespace kvb::kernels::detail
#endif
