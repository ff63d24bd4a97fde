// widen_rows (detail/widen_rows.h): an x86-64-v3 (F16C) version and a portable one, picked once by
// the CPU (cpu_clones.h's cpu_has_v3). A decode kernel calls it once per tile (a few thousand
// elements of work), so the indirect call costs nothing next to the conversion, which the portable
// fp16 path does in ~10 integer operations per 8 elements and F16C in one.

#include "kvb/kernels/detail/cpu_clones.h"
#include "kvb/kernels/detail/dtype_io.h"
#include "kvb/kernels/detail/pool_rows.h"
#include "kvb/kernels/detail/widen_rows.h"

namespace kvb::kernels::detail {

namespace {

void widen_rows_portable(const void* base, KvDtype d, const int64_t* rows, int64_t n_rows,
                         int64_t n_heads, int64_t n_cols, float* out) {
  for (int64_t i = 0; i < n_rows; ++i)
    for (int64_t h = 0; h < n_heads; ++h)
      load_row(base, d, rows[i] + h * n_cols, n_cols, out + (h * n_rows + i) * n_cols);
}

#if KVB_HAVE_CPU_V3
// Eight elements of s (fp16 or bf16) as fp32 into o, through the decode kernel's lane readers.
KVB_CPU_V3 inline void widen8(const uint16_t* s, float* o, bool f16) {
  store8(o, f16 ? F16cLanes::load8(s) : Bf16Lanes::load8(s));
}

// One token row's heads; C > 0: n_cols known at compile time (the common head dims), so the
// per-head loop unrolls whole.
template <int C>
KVB_CPU_V3 inline void widen_row(const uint16_t* s, float* o, int64_t n_heads, int64_t n_cols,
                                 int64_t o_stride, bool f16) {
  const int64_t cols = C > 0 ? C : n_cols, n8 = cols & ~int64_t{7};
  for (int64_t h = 0; h < n_heads; ++h, s += cols, o += o_stride) {
    int64_t c = 0;
    for (; c < n8; c += 8) widen8(s + c, o + c, f16);
    for (; c < cols; ++c) o[c] = f16 ? half_to_float(s[c]) : bf16_to_float(s[c]);
  }
}

KVB_CPU_V3 void widen_rows_f16c(const void* base, KvDtype d, const int64_t* rows, int64_t n_rows,
                                int64_t n_heads, int64_t n_cols, float* out) {
  const bool f16 = d == KvDtype::kF16;
  const int64_t o_stride = n_rows * n_cols;  // from one head's tile to the next
  for (int64_t i = 0; i < n_rows; ++i) {
    const uint16_t* s = static_cast<const uint16_t*>(base) + rows[i];
    float* o = out + i * n_cols;
    if (n_cols == 128)
      widen_row<128>(s, o, n_heads, n_cols, o_stride, f16);
    else if (n_cols == 64)
      widen_row<64>(s, o, n_heads, n_cols, o_stride, f16);
    else
      widen_row<0>(s, o, n_heads, n_cols, o_stride, f16);
  }
}
#endif

using WidenFn = void (*)(const void*, KvDtype, const int64_t*, int64_t, int64_t, int64_t, float*);

WidenFn pick() {
#if KVB_HAVE_CPU_V3
  if (cpu_has_v3()) return widen_rows_f16c;
#endif
  return widen_rows_portable;
}

}  // namespace

void widen_rows(const void* base, KvDtype d, const int64_t* rows, int64_t n_rows, int64_t n_heads,
                int64_t n_cols, float* out) {
  static const WidenFn chosen = pick();
  if (d == KvDtype::kF32) return widen_rows_portable(base, d, rows, n_rows, n_heads, n_cols, out);
  chosen(base, d, rows, n_rows, n_heads, n_cols, out);
}

}  // namespace kvb::kernels::detail
