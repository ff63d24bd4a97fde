#pragma once
// An 8-lane fp32 vector for the register-blocked loops of the CPU kernels: a GCC/Clang vector
// extension, so that one source compiles to one AVX instruction per operation in the AVX2 clone
// (cpu_clones.h) and to two SSE instructions in the baseline clone, with the same lane arithmetic
// and therefore the same bits in both (no FMA: kvb_kernels is built with -ffp-contract=off).
// Internal: not part of the kernel API. The helpers are always inlined, so that a 32-byte vector
// never crosses a call between code built for different targets (their ABIs differ).

#include <cstdint>
#include <cstring>

#define KVB_SIMD_INLINE inline __attribute__((always_inline))
// On a lambda inside a cloned work item: a lambda is a function of its own, built for the baseline
// target, so one left out of line would run baseline code inside the AVX2 clone.
#define KVB_SIMD_INLINE_LAMBDA __attribute__((always_inline))

// GCC notes that a 32-byte vector passed by value to a function built without AVX changes the
// ABI; these helpers are never called (always inlined), so that cannot happen. The note comes at
// each use, some of them at the end of the including file, so it stays off for the whole file.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvb::kernels::detail {

typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

KVB_SIMD_INLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);  // unaligned
  return v;
}
KVB_SIMD_INLINE void store8(float* p, const f32x8& v) { std::memcpy(p, &v, sizeof v); }
// x in every lane. (Through a plain loop, which the vectoriser turns into one broadcast in the
// clone; a vector initialiser {x, ..., x} is split into 16-byte halves, each built with inserts,
// before the clone's AVX2 is known.)
KVB_SIMD_INLINE f32x8 splat8(float x) {
  alignas(32) float t[8];
  for (int k = 0; k < 8; ++k) t[k] = x;
  return load8(t);
}

// Lane sums of eight vectors: r[i] = ((a_i[0] + a_i[1]) + (a_i[2] + a_i[3])) + ((a_i[4] +
// a_i[5]) + (a_i[6] + a_i[7])), the pairwise tree of dot_f32 (dtype_io.h), as two rounds of
// horizontal adds and one add of the two 128-bit halves.
KVB_SIMD_INLINE f32x8 hadd8(const f32x8& a, const f32x8& b) {
  return __builtin_shuffle(a, b, i32x8{0, 2, 8, 10, 4, 6, 12, 14}) +
         __builtin_shuffle(a, b, i32x8{1, 3, 9, 11, 5, 7, 13, 15});
}
KVB_SIMD_INLINE f32x8 lane_sums8(const f32x8* a) {
  const f32x8 t0 = hadd8(a[0], a[1]), t1 = hadd8(a[2], a[3]);
  const f32x8 t2 = hadd8(a[4], a[5]), t3 = hadd8(a[6], a[7]);
  const f32x8 u0 = hadd8(t0, t1), u1 = hadd8(t2, t3);
  // u0 = [a0 a1 a2 a3 (low-half sums) | a0 a1 a2 a3 (high-half sums)], u1 likewise for a4..a7.
  return __builtin_shuffle(u0, u1, i32x8{0, 1, 2, 3, 8, 9, 10, 11}) +
         __builtin_shuffle(u0, u1, i32x8{4, 5, 6, 7, 12, 13, 14, 15});
}

}  // namespace kvb::kernels::detail
