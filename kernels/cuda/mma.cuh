#pragma once
// Warp-level tensor-core helpers (sm_80+): mma.m16n8k16 with fp16 inputs and fp32 accumulators, and
// the packing of fp16 pairs and small integer codes into its f16x2 registers. Device code only.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"; lane =
// 4 * g + t):
//   A (16 x 16, row)  a[0] = (row g,     cols 2t, 2t+1)   a[1] = (row g + 8, cols 2t, 2t+1)
//                     a[2] = (row g,     cols 2t+8, 2t+9) a[3] = (row g + 8, cols 2t+8, 2t+9)
//   B (16 x 8, col)   b[0] = (rows 2t, 2t+1, col g)       b[1] = (rows 2t+8, 2t+9, col g)
//   C, D (16 x 8)     d[0], d[1] = (row g, cols 2t, 2t+1)  d[2], d[3] = (row g + 8, same cols)
// The lower-indexed element of a pair sits in the low 16 bits of its register.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace kvb::kernels::cuda {

// d += A * B over one warp (every lane calls it, with the same control flow).
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#if KVB_CUDA_EMU
  // The host compiler cannot take PTX: the CUDA emulator (tests/cuda_emu) computes it.
  ::kvb::emu::mma_m16n8k16_f16_f32(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The same with bf16 operands (fp32 accumulators; same fragment layouts).
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2]) {
#if KVB_CUDA_EMU
  ::kvb::emu::mma_m16n8k16_bf16_f32(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Operand type T (__half or __nv_bfloat16): its mma, its packing of two floats, its head + tail.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
  if constexpr (std::is_same<T, __half>::value)
    mma_m16n8k16(d, a, b);
  else
    mma_m16n8k16_bf16(d, a, b);
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __half>::value)
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
  else
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}
template <typename T>
__device__ __forceinline__ void split2(float x, float* head, float* tail) {
  if constexpr (std::is_same<T, __half>::value)
    *head = __half2float(__float2half_rn(x));
  else
    *head = __bfloat162float(__float2bfloat16_rn(x));
  *tail = x - *head;
}

// Two floats as an f16x2 register (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// x splits into an fp16 head and an fp16 tail (x - head), so that head + tail keeps about 22
// significant bits: tensor-core products then lose nothing that fp32 accumulation would keep.
__device__ __forceinline__ void split_half(float x, float* head, float* tail) {
  *head = __half2float(__float2half_rn(x));
  *tail = x - *head;
}

// Two integer codes (< 1024) at bits [0, 10) and [16, 26) of `codes` (everything else zero) as an
// f16x2 register of their exact values: OR-ing them into the mantissa of 1024 (0x6400) and
// subtracting 1024 costs one LOP3 and one HSUB2 per pair, no integer-to-float conversion.
__device__ __forceinline__ uint32_t codes_to_half2(uint32_t codes) {
  uint32_t v = codes | 0x64006400u;
  const uint32_t k1024 = 0x64006400u;
  __half2 h =
      __hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&k1024));
  return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace kvb::kernels::cuda
