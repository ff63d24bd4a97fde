#pragma once
// Decode attention over the KIVI store (kivi_cache.h), dequantizing inside the kernel. Included by
// kivi_decode_b{2,4,8}.cu, one file per bit width so that nvcc builds them in parallel.
//
// Grid (splits, kv heads, sequences); 128 threads; splits are whole pages. Two phases per block:
//   A  pages whose keys AND values are all quantized (the bulk of a long context). Each token slot
//      owns one page at a time (NSLOT pages in flight per block step) and walks its rows UNROLL_A
//      at a time. The page's per-channel key scales fold into q once per page (qs = q * s, bias = q
//      . min), so a key costs one code-to-float and GT multiply-adds per channel; a value row has
//      one (scale, min) pair per thread when v_group_size >= CPT.
//   B  the rest of the split (pages whose values are partly in the residual, and the residual
//      tokens): one token per slot, keys and values dequantized or read from the rings. At most
//      R + page_size tokens per sequence, so this path is kept simple.

#include "decode_common.cuh"

namespace kvb::kernels::cuda {

struct KiviArgs {
  const void* q;                // [batch, hq, HD] T
  const uint8_t* kc;            // [pages, hkv, ps * HD * BITS / 8]
  const uint16_t* ks;           // [pages, hkv, HD] fp16
  const uint16_t* km;           // [pages, hkv, HD] fp16
  const uint8_t* vc;            // [pages, hkv, ps * HD * BITS / 8]
  const uint16_t* vs;           // [pages, hkv, ps, HD / vg] fp16
  const uint16_t* vm;           // [pages, hkv, ps, HD / vg] fp16
  const void* kres;             // [batch, U, hkv, HD] T
  const void* vres;             // [batch, U, hkv, HD] T
  const int32_t* page_indptr;   // [batch + 1]
  const int32_t* page_indices;  // [nnz pages]
  const int32_t* kv_lens;       // [batch]
  int hq, hkv, ps, R, U, vg, vg_shift, vgroups;
  int chunk;  // positions per split, a multiple of ps
  float scale_log2;
  DecodeOut out;
};

// Where a block's work lies: its split, kv head and sequence, the sequence's quantized extents
// (keys [0, kq), values [0, vq)), its positions [t0, t1) and, of those, the whole pages with both
// keys and values quantized [p_begin, p_end) (phase A; positions up to a_end), the rest phase B.
struct KiviBlock {
  int split, kvh, seq, group, kq, vq, t0, t1, a_end, p_begin, p_end;
  const int32_t* pages;  // the sequence's page ids
  int64_t row0;          // its first query head's row in q and o
};

__device__ __forceinline__ KiviBlock kivi_block(const KiviArgs& a) {
  KiviBlock k;
  k.split = blockIdx.x;
  k.kvh = blockIdx.y;
  k.seq = blockIdx.z;
  k.group = a.hq / a.hkv;
  const int len = a.kv_lens[k.seq];
  k.kq = len / a.U * a.U;
  k.vq = max(0, len - a.R);
  k.t0 = k.split * a.chunk;
  // The last split runs to the end, so a plan made from a too-small max_kv_len stays correct.
  k.t1 = k.split == a.out.splits - 1 ? len : min(len, k.t0 + a.chunk);
  const int both = min(k.kq, k.vq) / a.ps * a.ps;  // tokens [0, both) are fully quantized pages
  k.a_end = max(k.t0, min(k.t1, both));
  k.p_begin = k.t0 / a.ps;
  k.p_end = k.a_end / a.ps;
  k.pages = a.page_indices + a.page_indptr[k.seq];
  k.row0 = static_cast<int64_t>(k.seq) * a.hq + static_cast<int64_t>(k.kvh) * k.group;
  return k;
}

// q of the block's query heads, pre-scaled by sm_scale * log2(e), into shared memory (zeros for
// the idle lanes of a padded group). Ends with a barrier.
template <typename T, int HD, int GT>
__device__ __forceinline__ void kivi_load_q(const KiviArgs& a, int64_t row0, int group,
                                            float (&sm_q)[GT][HD]) {
  for (int i = threadIdx.x; i < GT * HD; i += kDecodeThreads) {
    const int h = i / HD, d = i % HD;
    sm_q[h][d] = h < group
                     ? to_float<T>(static_cast<const T*>(a.q)[(row0 + h) * HD + d]) * a.scale_log2
                     : 0.f;
  }
  __syncthreads();
}

// Phase B: tokens [a_end, t1) one per slot (partly quantized pages and the residual rings),
// accumulated into the thread's slot state.
template <typename T, int HD, int GT, int BITS>
__device__ __forceinline__ void kivi_phase_b(const KiviArgs& a, const float (&sm_q)[GT][HD], int b,
                                             int kvh, int a_end, int t1, int kq, int vq,
                                             const int32_t* pages, float (&m)[GT], float (&l)[GT],
                                             float (&acc)[GT][DecodeCfg<HD, GT>::CPT]) {
  using C = DecodeCfg<HD, GT>;
  constexpr int CPT = C::CPT, NV = C::NV, TPT = C::TPT, NSLOT = C::NSLOT;
  constexpr int CB = CPT * BITS / 8;
  constexpr int ROWB = HD * BITS / 8;
  const int tid = threadIdx.x, lc = tid % TPT, slot = tid / TPT;
  const int c0 = lc * CPT;
  for (int base = a_end; base < t1; base += NSLOT) {  // uniform
    const int j = base + slot;
    bool ok[1] = {j < t1};
    float kf[CPT], vf[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) kf[c] = vf[c] = 0.f;
    if (ok[0]) {
      const int slot_r = j - j / a.U * a.U;
      const int64_t ring = ((static_cast<int64_t>(b) * a.U + slot_r) * a.hkv + kvh) * HD + c0;
      const int lp = j / a.ps, r = j - lp * a.ps;
      const int64_t blk =
          (j < kq || j < vq) ? static_cast<int64_t>(__ldg(pages + lp)) * a.hkv + kvh : 0;
      if (j < kq) {
        CodeWords<CB> w;
        w.load(a.kc + blk * (a.ps * ROWB) + r * ROWB + lc * CB);
#pragma unroll
        for (int c = 0; c < CPT; ++c)
          kf[c] = fmaf(w.template code<BITS>(c), h2f_bits(__ldg(a.ks + blk * HD + c0 + c)),
                       h2f_bits(__ldg(a.km + blk * HD + c0 + c)));
      } else {
#pragma unroll
        for (int v = 0; v < NV; ++v)
          cvt8<T>(ldg16(static_cast<const T*>(a.kres) + ring + 8 * v), kf + 8 * v);
      }
      if (j < vq) {
        CodeWords<CB> w;
        w.load(a.vc + blk * (a.ps * ROWB) + r * ROWB + lc * CB);
        const int64_t mi = (blk * a.ps + r) * a.vgroups;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const int gi = (c0 + c) >> a.vg_shift;
          vf[c] = fmaf(w.template code<BITS>(c), h2f_bits(__ldg(a.vs + mi + gi)),
                       h2f_bits(__ldg(a.vm + mi + gi)));
        }
      } else {
#pragma unroll
        for (int v = 0; v < NV; ++v)
          cvt8<T>(ldg16(static_cast<const T*>(a.vres) + ring + 8 * v), vf + 8 * v);
      }
    }
    float s[1][GT];
#pragma unroll
    for (int h = 0; h < GT; ++h) {
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < CPT; ++c) dot = fmaf(sm_q[h][c0 + c], kf[c], dot);
      s[0][h] = row_sum<TPT>(dot);
    }
    softmax_update<GT, CPT, 1>(m, l, acc, s, ok, [&](int, float* f) {
#pragma unroll
      for (int c = 0; c < CPT; ++c) f[c] = vf[c];
    });
  }
}

template <typename T, int HD, int GT, int BITS>
__global__ void __launch_bounds__(kDecodeThreads) kivi_decode_kernel(const KiviArgs a) {
  using C = DecodeCfg<HD, GT>;
  constexpr int CPT = C::CPT, NV = C::NV, TPT = C::TPT, NSLOT = C::NSLOT;
  constexpr int CB = CPT * BITS / 8;   // code bytes per thread row
  constexpr int ROWB = HD * BITS / 8;  // code bytes per token row
  constexpr int UNROLL_A = GT >= 8 ? 2 : (BITS == 2 ? 8 : 4);
  const KiviBlock B = kivi_block(a);
  const int split = B.split, kvh = B.kvh, b = B.seq, group = B.group, kq = B.kq, vq = B.vq,
            t1 = B.t1;
  const int32_t* pages = B.pages;
  const int64_t row0 = B.row0;
  const int tid = threadIdx.x, lc = tid % TPT, slot = tid / TPT;
  const int c0 = lc * CPT;  // this thread's first channel

  __shared__ float sm_q[GT][HD];
  kivi_load_q<T, HD, GT>(a, row0, group, sm_q);

  float m[GT], l[GT], acc[GT][CPT];
#pragma unroll
  for (int h = 0; h < GT; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int c = 0; c < CPT; ++c) acc[h][c] = 0.f;
  }

  // ---- phase A: whole pages with quantized keys and values ----
  const int a_end = B.a_end, p_begin = B.p_begin, p_end = B.p_end;
  for (int pb = p_begin; pb < p_end; pb += NSLOT) {  // uniform
    const int pi = pb + slot;
    const bool page_ok = pi < p_end;
    const int64_t blk = page_ok ? static_cast<int64_t>(__ldg(pages + pi)) * a.hkv + kvh : 0;
    float qs[GT][CPT], bias[GT];
    {
      float sc[CPT], mn[CPT];
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        uint4 su = make_uint4(0, 0, 0, 0), mu = make_uint4(0, 0, 0, 0);
        if (page_ok) {
          su = ldg16(a.ks + blk * HD + c0 + 8 * v);
          mu = ldg16(a.km + blk * HD + c0 + 8 * v);
        }
        cvt8<__half>(su, sc + 8 * v);
        cvt8<__half>(mu, mn + 8 * v);
      }
#pragma unroll
      for (int h = 0; h < GT; ++h) {
        bias[h] = 0.f;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const float qv = sm_q[h][c0 + c];
          qs[h][c] = qv * sc[c];
          bias[h] = fmaf(qv, mn[c], bias[h]);
        }
      }
    }
    const uint8_t* kpage = a.kc + blk * (a.ps * ROWB) + lc * CB;
    const uint8_t* vpage = a.vc + blk * (a.ps * ROWB) + lc * CB;
    const int64_t vmeta0 = blk * a.ps * a.vgroups + (c0 >> a.vg_shift);
    for (int r0 = 0; r0 < a.ps; r0 += UNROLL_A) {  // uniform
      CodeWords<CB> kw[UNROLL_A], vw[UNROLL_A];
      float vsc[UNROLL_A], vmn[UNROLL_A];
      bool ok[UNROLL_A];
#pragma unroll
      for (int u = 0; u < UNROLL_A; ++u) {
        const int r = r0 + u;
        ok[u] = page_ok && r < a.ps;
#pragma unroll
        for (int w = 0; w < CodeWords<CB>::N; ++w) kw[u].w[w] = vw[u].w[w] = 0;
        vsc[u] = vmn[u] = 0.f;
        if (ok[u]) {
          kw[u].load(kpage + r * ROWB);
          vw[u].load(vpage + r * ROWB);
          if (a.vg >= CPT) {
            vsc[u] = h2f_bits(__ldg(a.vs + vmeta0 + r * a.vgroups));
            vmn[u] = h2f_bits(__ldg(a.vm + vmeta0 + r * a.vgroups));
          }
        }
      }
      float s[UNROLL_A][GT];
#pragma unroll
      for (int u = 0; u < UNROLL_A; ++u) {
        float kf[CPT];
#pragma unroll
        for (int c = 0; c < CPT; ++c) kf[c] = kw[u].template code<BITS>(c);
#pragma unroll
        for (int h = 0; h < GT; ++h) {
          float dot = bias[h];
#pragma unroll
          for (int c = 0; c < CPT; ++c) dot = fmaf(qs[h][c], kf[c], dot);
          s[u][h] = row_sum<TPT>(dot);
        }
      }
      softmax_update<GT, CPT, UNROLL_A>(m, l, acc, s, ok, [&](int u, float* f) {
        if (a.vg >= CPT) {
#pragma unroll
          for (int c = 0; c < CPT; ++c) f[c] = fmaf(vw[u].template code<BITS>(c), vsc[u], vmn[u]);
        } else {
          const int64_t mi = blk * a.ps * a.vgroups + static_cast<int64_t>(r0 + u) * a.vgroups;
#pragma unroll
          for (int c = 0; c < CPT; ++c) {
            const int gi = (c0 + c) >> a.vg_shift;
            f[c] = fmaf(vw[u].template code<BITS>(c), h2f_bits(__ldg(a.vs + mi + gi)),
                        h2f_bits(__ldg(a.vm + mi + gi)));
          }
        }
      });
    }
  }

  kivi_phase_b<T, HD, GT, BITS>(a, sm_q, b, kvh, a_end, t1, kq, vq, pages, m, l, acc);
  finish_block<T, HD, GT>(m, l, acc, group, row0, split, a.out);
}

}  // namespace kvb::kernels::cuda

#include "kivi_decode_tc.cuh"

namespace kvb::kernels::cuda {

// One bit width's launcher (kivi_decode_b{2,4,8}.cu): dispatches dtype, head_dim and group, on
// CUDA cores or (tensor_cores) with phase A on tensor cores.
template <int BITS>
cudaError_t launch_kivi_decode(const KiviArgs& a, KvDtype dtype, int head_dim, int group, dim3 grid,
                               cudaStream_t stream, bool tensor_cores) {
  KVB_DISPATCH_DTYPE(
      dtype, T, KVB_DISPATCH_HEAD_DIM(head_dim, HD, KVB_DISPATCH_GROUP(group, GT, {
                                        if (tensor_cores)
                                          KVB_LAUNCH(grid, kDecodeThreads, 0, stream,
                                                     kivi_decode_tc_kernel<T, HD, GT, BITS>)
                                        (a);
                                        else KVB_LAUNCH(grid, kDecodeThreads, 0, stream,
                                                        kivi_decode_kernel<T, HD, GT, BITS>)(a);
                                      })));
  return cudaGetLastError();
}

cudaError_t launch_kivi_decode_b2(const KiviArgs& a, KvDtype dtype, int head_dim, int group,
                                  dim3 grid, cudaStream_t stream, bool tensor_cores);
cudaError_t launch_kivi_decode_b4(const KiviArgs& a, KvDtype dtype, int head_dim, int group,
                                  dim3 grid, cudaStream_t stream, bool tensor_cores);
cudaError_t launch_kivi_decode_b8(const KiviArgs& a, KvDtype dtype, int head_dim, int group,
                                  dim3 grid, cudaStream_t stream, bool tensor_cores);

}  // namespace kvb::kernels::cuda
