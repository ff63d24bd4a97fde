#pragma once
// Device helpers shared by kvbench's CUDA kernels: 16-byte vector loads and conversions of
// fp16/bf16, packed-code loads, exact fp16 rounding toward -inf/+inf (the device twin of
// kvb/kernels/half.h), compile-time dispatch macros, and the configuration of the decode kernels.
// Device code only.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kvb/kernels/decode_attention.h"

namespace kvb::kernels::cuda {

constexpr int kDecodeThreads = 128;  // threads per decode block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- dispatch: runtime values to constexpr template arguments (an unsupported value returns
// cudaErrorInvalidValue from the enclosing launcher; *_supported() says why beforehand). ----
#define KVB_DISPATCH_HEAD_DIM(hd, HD, ...) \
  switch (hd) {                            \
    case 64: {                             \
      constexpr int HD = 64;               \
      __VA_ARGS__                          \
    } break;                               \
    case 128: {                            \
      constexpr int HD = 128;              \
      __VA_ARGS__                          \
    } break;                               \
    default:                               \
      return cudaErrorInvalidValue;        \
  }

#define KVB_DISPATCH_DTYPE(dt, T, ...)     \
  switch (dt) {                            \
    case ::kvb::kernels::KvDtype::kF16: {  \
      using T = __half;                    \
      __VA_ARGS__                          \
    } break;                               \
    case ::kvb::kernels::KvDtype::kBF16: { \
      using T = __nv_bfloat16;             \
      __VA_ARGS__                          \
    } break;                               \
    default:                               \
      return cudaErrorInvalidValue;        \
  }

// GQA group sizes 1..8 onto the compiled widths 1, 4, 8.
#define KVB_DISPATCH_GROUP(g, GT, ...) \
  if ((g) == 1) {                      \
    constexpr int GT = 1;              \
    __VA_ARGS__                        \
  } else if ((g) >= 2 && (g) <= 4) {   \
    constexpr int GT = 4;              \
    __VA_ARGS__                        \
  } else if ((g) >= 5 && (g) <= 8) {   \
    constexpr int GT = 8;              \
    __VA_ARGS__                        \
  } else {                             \
    return cudaErrorInvalidValue;      \
  }

// kernel<<<grid, block, smem, stream>>>(args) is written KVB_LAUNCH(grid, block, smem, stream,
// kernel)(args), so that the CPU emulator of tests/cuda_emu, which defines its own KVB_LAUNCH, can
// compile and run the same source with the host compiler.
#ifndef KVB_LAUNCH
#define KVB_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

#define KVB_CUDA_TRY(expr)                        \
  do {                                            \
    const cudaError_t kvb_err_ = (expr);          \
    if (kvb_err_ != cudaSuccess) return kvb_err_; \
  } while (0)

// Per-thread work split of the decode kernels: a thread owns CPT consecutive channels of one token
// row (two 16-byte loads for groups up to 4, one for group 8, where q and the accumulators already
// take 2 * 8 * 8 registers), TPT threads share a row, NSLOT rows are in flight per block step and
// each thread issues UNROLL rows' loads before using any.
template <int HD, int GT>
struct DecodeCfg {
  static constexpr int CPT = GT <= 4 ? 16 : 8;
  static constexpr int NV = CPT / 8;  // 16-byte fp16/bf16 vectors per thread row
  static constexpr int TPT = HD / CPT;
  static constexpr int NSLOT = kDecodeThreads / TPT;
  static constexpr int UNROLL = GT == 1 ? 8 : (GT <= 4 ? 4 : 2);
  static constexpr int TILE = NSLOT * UNROLL;
  static_assert(TPT >= 1 && TPT <= 32 && (32 % TPT) == 0, "a row's threads must sit in one warp");
};

// ---- conversions ----
template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}

// 8 fp16/bf16 values in a 16-byte vector to fp32.
template <typename T>
__device__ __forceinline__ void cvt8(const uint4& u, float* f);
template <>
__device__ __forceinline__ void cvt8<__half>(const uint4& u, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
template <>
__device__ __forceinline__ void cvt8<__nv_bfloat16>(const uint4& u, float* f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 ldg16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// NB bytes of packed codes (2, 4, 8 or 16; NB-aligned) into 32-bit words, low bytes first.
template <int NB>
struct CodeWords {
  static constexpr int N = NB >= 4 ? NB / 4 : 1;
  uint32_t w[N];
  __device__ __forceinline__ void load(const uint8_t* p) {
    if constexpr (NB == 2) {
      w[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
    } else if constexpr (NB == 4) {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    } else if constexpr (NB == 8) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = v.x;
      w[1] = v.y;
    } else {
      static_assert(NB == 16, "code bytes per thread must be 2, 4, 8 or 16");
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = v.x;
      w[1] = v.y;
      w[2] = v.z;
      w[3] = v.w;
    }
  }
  // Code c (0-based, compile-time after unrolling) as an exact float: OR-ing a code < 2^23 into the
  // mantissa of 2^23 and subtracting 2^23 avoids the slower integer-to-float conversion.
  template <int BITS>
  __device__ __forceinline__ float code(int c) const {
    const uint32_t v = (w[(c * BITS) / 32] >> ((c * BITS) % 32)) & ((1u << BITS) - 1u);
    return __uint_as_float(0x4B000000u | v) - 8388608.0f;
  }
};

// ---- fp16 rounding toward -inf / +inf, the device twin of half.h (bit-identical) ----
__device__ __forceinline__ uint16_t f2h_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float h2f_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ uint16_t half_bits_down(float f) {
  if (!(f < 65504.0f)) return 0x7bff;
  if (f <= -65504.0f) return 0xfbff;
  uint16_t h = f2h_bits(f);
  if (h2f_bits(h) > f) {
    if ((h & 0x7fffu) == 0)
      h = 0x8001;
    else
      h = (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
  }
  return h;
}

__device__ __forceinline__ uint16_t half_bits_up(float f) {
  if (!(f > -65504.0f)) return 0xfbff;
  if (f >= 65504.0f) return 0x7bff;
  uint16_t h = f2h_bits(f);
  if (h2f_bits(h) < f) {
    if ((h & 0x7fffu) == 0)
      h = 0x0001;
    else
      h = (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
  }
  return h;
}

// Host helpers (defined in decode_attention.cu).
bool aligned16(const void* p);
bool set_why(std::string* why, const std::string& msg);  // stores msg, returns msg.empty()

}  // namespace kvb::kernels::cuda
