#pragma once
// A decode tile's K or V rows read straight from the cache pages, fp16/bf16 widened to fp32 in
// registers eight channels at a time (fp32 pages read as they are): the row accessor of
// tile_attention.h's products, so that a tile is never written out as fp32 and read back. The
// conversions are exact, so every version gives the same bits: fp16 through F16C's one instruction
// in code built for x86-64-v3 (F16cLanes; cpu_clones.h's KVB_CPU_V3), otherwise through
// half_to_float_fast's bit arithmetic on eight lanes (F16Lanes); bf16 is its 16 bits moved to the
// top of an fp32 (Bf16Lanes). Internal: not part of the kernel API.

#include <cstdint>
#include <cstring>

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/simd8.h"

#if KVB_HAVE_CPU_V3
#include <immintrin.h>
#endif

namespace kvb::kernels::detail {

typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

KVB_SIMD_INLINE u32x8 widen_u16x8(const uint16_t* s) {
  u16x8 h;
  std::memcpy(&h, s, sizeof h);  // unaligned
  return __builtin_convertvector(h, u32x8);
}

KVB_SIMD_INLINE f32x8 bits_f32x8(const u32x8& u) {
  f32x8 f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct F32Lanes {
  using Elem = float;
  static KVB_SIMD_INLINE f32x8 load8(const float* s) { return detail::load8(s); }
  static KVB_SIMD_INLINE float load1(const float* s) { return *s; }
};

struct Bf16Lanes {
  using Elem = uint16_t;
  static KVB_SIMD_INLINE f32x8 load8(const uint16_t* s) { return bits_f32x8(widen_u16x8(s) << 16); }
  static KVB_SIMD_INLINE float load1(const uint16_t* s) { return bf16_to_float(*s); }
};

// half_to_float_fast (dtype_io.h) lane by lane.
struct F16Lanes {
  using Elem = uint16_t;
  static KVB_SIMD_INLINE f32x8 load8(const uint16_t* s) {
    const u32x8 h = widen_u16x8(s);
    const u32x8 em = h & 0x7fffu;
    const u32x8 sign = (h & 0x8000u) << 16;
    const f32x8 scaled = bits_f32x8(em << 13) * 5.192296858534828e33f;  // 2^112
    u32x8 finite;
    std::memcpy(&finite, &scaled, sizeof finite);
    finite |= sign;
    const u32x8 special = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
    const u32x8 pick = (u32x8)(em >= 0x7c00u);  // all ones for inf / NaN
    return bits_f32x8((special & pick) | (finite & ~pick));
  }
  static KVB_SIMD_INLINE float load1(const uint16_t* s) { return half_to_float_fast(*s); }
};

#if KVB_HAVE_CPU_V3
// F16C. Not always_inline (its target is wider than the template that calls it); it is inlined
// once that template is, into a KVB_CPU_V3 function, and must only be reached from one.
struct F16cLanes {
  using Elem = uint16_t;
  static inline __attribute__((target("avx2,f16c"))) f32x8 load8(const uint16_t* s) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  }
  static KVB_SIMD_INLINE float load1(const uint16_t* s) { return half_to_float_fast(*s); }
};
#endif

// Rows i of a tile: pool element offsets rows[i] (a token's kv head 0) plus off (the kv head's
// channels), read as fp32 through Lanes.
template <class Lanes>
struct PoolRows {
  using Elem = typename Lanes::Elem;
  const Elem* base;     // the pool
  const int64_t* rows;  // [tile rows] element offsets
  int64_t off;
  KVB_SIMD_INLINE const Elem* row(int64_t i) const { return base + rows[i] + off; }
  static KVB_SIMD_INLINE f32x8 load8(const Elem* r) { return Lanes::load8(r); }
  static KVB_SIMD_INLINE float load1(const Elem* r) { return Lanes::load1(r); }
  KVB_SIMD_INLINE PoolRows from(int64_t i) const { return {base, rows + i, off}; }
};

}  // namespace kvb::kernels::detail
