// widen_rows (detail/widen_rows.h): an F16C/AVX2 version and a portable one, picked once by the
// CPU. A decode kernel calls it once per tile and kv head (a few thousand rows of work), so the
// indirect call costs nothing next to the conversion, which the portable fp16 path does in ~10
// integer operations per 8 elements and F16C in one.

#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/widen_rows.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVB_HAVE_F16C_PATH 1
#else
#define KVB_HAVE_F16C_PATH 0
#endif

namespace kvb::kernels::detail {

namespace {

void widen_rows_portable(const void* base, KvDtype d, const int64_t* rows, int64_t n_rows,
                         int64_t n_heads, int64_t n_cols, float* out) {
  for (int64_t i = 0; i < n_rows; ++i)
    for (int64_t h = 0; h < n_heads; ++h)
      load_row(base, d, rows[i] + h * n_cols, n_cols, out + (h * n_rows + i) * n_cols);
}

#if KVB_HAVE_F16C_PATH
__attribute__((target("avx2,f16c"))) void widen_rows_f16c(const void* base, KvDtype d,
                                                          const int64_t* rows, int64_t n_rows,
                                                          int64_t n_heads, int64_t n_cols,
                                                          float* out) {
  const int64_t n8 = n_cols & ~int64_t{7};
  for (int64_t i = 0; i < n_rows; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const uint16_t* s = static_cast<const uint16_t*>(base) + rows[i] + h * n_cols;
      float* o = out + (h * n_rows + i) * n_cols;
      int64_t c = 0;
      if (d == KvDtype::kF16) {
#pragma GCC unroll 4
        for (; c < n8; c += 8)
          _mm256_storeu_ps(
              o + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c))));
        for (; c < n_cols; ++c) o[c] = half_to_float(s[c]);
      } else {  // bf16: the 16 bits are the top of an fp32
#pragma GCC unroll 4
        for (; c < n8; c += 8) {
          const __m256i w =
              _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c)));
          _mm256_storeu_ps(o + c, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        for (; c < n_cols; ++c) o[c] = bf16_to_float(s[c]);
      }
    }
}
#endif

using WidenFn = void (*)(const void*, KvDtype, const int64_t*, int64_t, int64_t, int64_t, float*);

WidenFn pick() {
#if KVB_HAVE_F16C_PATH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return widen_rows_f16c;
#endif
  return widen_rows_portable;
}

WidenFn chosen() {
  static const WidenFn fn = pick();
  return fn;
}

}  // namespace

void widen_rows(const void* base, KvDtype d, const int64_t* rows, int64_t n_rows, int64_t n_heads,
                int64_t n_cols, float* out) {
  if (d == KvDtype::kF32) return widen_rows_portable(base, d, rows, n_rows, n_heads, n_cols, out);
  chosen()(base, d, rows, n_rows, n_heads, n_cols, out);
}

bool widen_rows_uses_f16c() {
#if KVB_HAVE_F16C_PATH
  return chosen() == widen_rows_f16c;
#else
  return false;
#endif
}

}  // namespace kvb::kernels::detail
