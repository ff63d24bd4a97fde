// Edge coverage for libFuzzer from GCC. GCC instruments with -fsanitize-coverage=trace-pc (a call
// to __sanitizer_cov_trace_pc at every basic block) and trace-cmp, but not with the inline 8-bit
// counters libFuzzer reads from clang's instrumentation. This file turns the trace-pc calls into
// those counters: each (previous block, this block) pair, hashed as AFL does, bumps one byte of a
// table in the section libFuzzer scans for extra counters (__libfuzzer_extra_counters). The copy of
// libFuzzer's runtime linked here has its own (aborting) __sanitizer_cov_trace_pc made weak, so
// this definition wins (tests/fuzz_config/CMakeLists.txt).
//
// Why GCC: the config path needs the method registry, i.e. LibTorch code; building all of that with
// clang as well would double the build. This target reuses the GCC objects of the regular build and
// instruments only the config sources it compiles itself.

#include <cstddef>
#include <cstdint>

namespace {

constexpr size_t kCounters = size_t{1} << 16;  // a power of two: the hash is masked to it
thread_local uintptr_t previous_block = 0;

}  // namespace

extern "C" {

__attribute__((section("__libfuzzer_extra_counters"), used))
uint8_t kvb_fuzz_edge_counters[kCounters];

__attribute__((no_sanitize_address, no_sanitize_undefined)) void __sanitizer_cov_trace_pc() {
  const auto pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  const uintptr_t block = ((pc >> 4) ^ (pc << 8)) * 0x9E3779B97F4A7C15ull >> 48;  // 16 bits
  kvb_fuzz_edge_counters[(block ^ previous_block) & (kCounters - 1)]++;
  previous_block = block >> 1;  // shifted, so that A->B and B->A differ
}

// GCC's trace-cmp also reports float and double comparisons, which libFuzzer has no hooks for.
void __sanitizer_cov_trace_cmpf(float, float) {}
void __sanitizer_cov_trace_cmpd(double, double) {}

}  // extern "C"
