#pragma once
// Dense or gathered decode attention over paged fp16/bf16 KV on tensor cores (mma.m16n8k16 with
// the KV's own type, fp32 accumulate). Included by decode_attention.cu; same arguments, plan and
// block merge as dense_decode_kernel.
//
// Per warp (4 per block), 16-token tiles t0 + 16 w, + 64, ...:
//   keys    S (16 x 8 tokens) = Q (16: the group's heads in rows g, their tails in rows g + 8, x 16
//           channels) * K^T, per 16-channel slice: a B register is two consecutive channels of one
//           key row, read as they are stored.
//   values  O^T (16 channels x 8 heads) += V^T (16 x 16 tokens) * P (16 tokens x 8 heads), the
//           weights as head + tail in two mmas; the key product's C fragment is the value product's
//           B fragment; an A register pairs two tokens of one channel (PRMT of two rows' words).
// Tokens past the end of what a block scans (or of a gathered page past the sequence) score -inf
// and read as zeros. At the end each warp's state goes to a slot and finish_block merges them.
// Why: at GQA 4-8 the CUDA-core kernel issues one FMA per head per channel per token besides the
// conversions and shuffles (decode_attention.cu); here those are tensor-core work.

#include "mma.cuh"

namespace kvb::kernels::cuda {

template <typename T, int HD, int GT>
__global__ void __launch_bounds__(kDecodeThreads) dense_decode_tc_kernel(const DenseArgs a) {
  using C = DecodeCfg<HD, GT>;
  constexpr int CPT = C::CPT;
  constexpr int NSL = HD / 16;  // 16-channel slices (keys) and tiles (values)
  static_assert(GT <= 8, "a group's heads must fit the 8 columns of the value product");
  const DenseBlock B = dense_block(a);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const uint8_t* kbase = static_cast<const uint8_t*>(a.k) + B.kvh * HD * sizeof(T);
  const uint8_t* vbase = static_cast<const uint8_t*>(a.v) + B.kvh * HD * sizeof(T);
  auto word = [](const uint8_t* base, int64_t row, int c) {  // channels c, c + 1 of a row
    return __ldg(reinterpret_cast<const unsigned int*>(base + (row + c) * sizeof(T)));
  };

  // q of head g (pre-scaled to log2 units) as head + tail pairs: A rows g and g + 8.
  uint32_t aq[NSL][4];
  {
    const T* qp = static_cast<const T*>(a.q) + (B.row0 + (g < B.group ? g : 0)) * HD;
#pragma unroll
    for (int s = 0; s < NSL; ++s) {
      float head[4], tail[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = 16 * s + 2 * t + (i & 1) + 8 * (i >> 1);
        const float qv = g < B.group ? to_float<T>(__ldg(qp + c)) * a.scale_log2 : 0.f;
        split2<T>(qv, &head[i], &tail[i]);
      }
      aq[s][0] = pack2<T>(head[0], head[1]);
      aq[s][1] = pack2<T>(tail[0], tail[1]);
      aq[s][2] = pack2<T>(head[2], head[3]);
      aq[s][3] = pack2<T>(tail[2], tail[3]);
    }
  }

  float m_w = -INFINITY, l_w = 0.f;  // head g
  float acc_w[NSL][4];               // (channels 16mt + g, + 8) x (heads 2t, 2t + 1)
#pragma unroll
  for (int mt = 0; mt < NSL; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc_w[mt][i] = 0.f;
  for (int base = B.t0 + 16 * warp; base < B.t1; base += 16 * (kDecodeThreads / 32)) {  // uniform
    auto row_of = [&](int j) -> int64_t { return j < B.t1 ? dense_row<HD>(a, B, j) : -1; };
    // Scores of head g for tokens base + {2t, 2t + 1, 8 + 2t, 9 + 2t}.
    float sc[4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int64_t kr = row_of(base + 8 * nt + g);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < NSL; ++s) {
        uint32_t bk[2] = {0u, 0u};
        if (kr >= 0) {
          bk[0] = word(kbase, kr, 16 * s + 2 * t);
          bk[1] = word(kbase, kr, 16 * s + 2 * t + 8);
        }
        mma_16816<T>(d, aq[s], bk);
      }
      sc[2 * nt] = d[0] + d[2];  // head + tail rows
      sc[2 * nt + 1] = d[1] + d[3];
    }
    const int tok[4] = {base + 2 * t, base + 2 * t + 1, base + 8 + 2 * t, base + 9 + 2 * t};
    int64_t vr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      vr[i] = row_of(tok[i]);
      if (vr[i] < 0) sc[i] = -INFINITY;
    }
    const TileSoftmax sm = tile_softmax(sc, m_w, l_w);
    float head[4], tail[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) split2<T>(sm.p[i], &head[i], &tail[i]);
    const uint32_t wh[2] = {pack2<T>(head[0], head[1]), pack2<T>(head[2], head[3])};
    const uint32_t wt[2] = {pack2<T>(tail[0], tail[1]), pack2<T>(tail[2], tail[3])};
#pragma unroll
    for (int mt = 0; mt < NSL; ++mt) {
      rescale_tile(acc_w[mt], sm);
      // V^T (channels 16mt + g, + 8) x (tokens 2t, 2t + 1 | 2t + 8, 2t + 9)
      uint32_t av[4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int c = 16 * mt + g + 8 * hh;
          const int64_t r1 = vr[2 * kk], r2 = vr[2 * kk + 1];
          const uint32_t w1 = r1 >= 0 ? word(vbase, r1, c & ~1) : 0u;
          const uint32_t w2 = r2 >= 0 ? word(vbase, r2, c & ~1) : 0u;
          av[2 * kk + hh] = __byte_perm(w1, w2, (c & 1) ? 0x7632u : 0x5410u);
        }
      mma_16816<T>(acc_w[mt], av, wh);
      mma_16816<T>(acc_w[mt], av, wt);
    }
  }
  float m[GT], l[GT], acc[GT][CPT];
  warp_state_to_slots<HD, GT>(m_w, l_w, acc_w, nullptr, m, l, acc);
  finish_block<T, HD, GT>(m, l, acc, B.group, B.row0, B.split, a.out);
}

}  // namespace kvb::kernels::cuda
