#pragma once
// KIVI decode attention with phase A on tensor cores (mma.m16n8k16, fp16 in, fp32 accumulate).
// Included by kivi_decode.cuh; same arguments, plan, phase B and block merge as kivi_decode_kernel.
//
// Why: on CUDA cores the KIVI kernel spends about a dozen instructions per code (extract, convert,
// GQA-wide multiply-adds), which at 2 and 4 bits costs more time than reading the codes
//. Here the scales leave the inner products altogether:
//   score(h, j) = sum_c (q_hc * s_c) * code_jc + sum_c q_hc * min_c            (key scale s_c per
//                 channel and page: folded into q once per page, the min into a bias)
//   out(h, c)   = sum_j (p_hj * s_jG) * code_jc + sum_j p_hj * min_jG           (value scale per
//                 token and group G: folded into the softmax weights)
// so the tensor cores multiply raw integer codes (exact in fp16) by fp16 operands, and a code
// costs one shift + LOP3 + HSUB2 per pair. The fp16 operands are split into head + tail
// (mma.cuh) so nothing is lost to fp16 rounding: q*s's tail rides in the A rows 8..15 that the
// at most 8 heads of a group leave free; the weights' tail takes a second mma.
//
// Per warp (4 per block, pages p_begin + w, +4, ...; a warp owns a page at a time):
//   keys    S (16 x 8 tokens) = Qs (16: heads g, tails g + 8, x 16 channels) * codes (16 x 8), per
//           16-channel slice. A lane's key codes are WPL contiguous words of its token row; the
//           channel order inside a slice is chosen so that the two codes of each B register sit 16
//           bits apart in one word (qs follows the same order), so no shuffling of codes.
//   values  O^T (16 channels x 8 heads) += codes^T (16 x 16 tokens) * W (16 tokens x 8 heads): the
//           C fragment of the key product (head g, tokens 2t, 2t+1) is exactly the B fragment the
//           value product needs, so the softmax weights never leave their lanes. A register of
//           codes pairs two tokens of one channel: PRMT picks the right halves of two rows.
// At the end a warp hands its state (m, l, O + the min term) to the first slot of its threads
// through the slot shared memory, phase B continues from it on CUDA cores, and finish_block merges.
// Needs page_size % 16 == 0 and v_group_size % 16 == 0 (kivi_decode_tc_supported).

#include "mma.cuh"

namespace kvb::kernels::cuda {

// NW words from p (4-byte aligned; 16-byte aligned when NW >= 4).
template <int NW>
__device__ __forceinline__ void load_words(uint32_t (&w)[NW], const uint8_t* p) {
  if constexpr (NW == 1) {
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  } else if constexpr (NW == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(NW % 4 == 0, "1, 2 or a multiple of 4 words");
#pragma unroll
    for (int i = 0; i < NW / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  }
}

__device__ __forceinline__ uint32_t ldg_word(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

template <typename T, int HD, int GT, int BITS>
__global__ void __launch_bounds__(kDecodeThreads) kivi_decode_tc_kernel(const KiviArgs a) {
  using C = DecodeCfg<HD, GT>;
  constexpr int CPT = C::CPT;
  constexpr int ROWB = HD * BITS / 8;   // code bytes per token row
  constexpr int WPL = HD * BITS / 128;  // key code words per lane (lane t: words [t*WPL, +WPL))
  constexpr int NSL = HD / 16;          // 16-channel slices of the key product
  constexpr int SPW = 8 / BITS;         // slices per code word
  constexpr int CPW = 32 / BITS;        // channels per code word
  constexpr int CPH = 16 / BITS;        // channels per 16-bit half word
  constexpr int NMT = HD / 16;          // 16-channel tiles of the value product
  constexpr uint32_t MASK = ((1u << BITS) - 1u) * 0x00010001u;
  constexpr unsigned FULL = 0xffffffffu;
  static_assert(GT <= 8, "a group's heads must fit the 8 columns of the value product");
  const KiviBlock B = kivi_block(a);
  const int split = B.split, kvh = B.kvh, b = B.seq, group = B.group, kq = B.kq, vq = B.vq,
            t1 = B.t1;
  const int32_t* pages = B.pages;
  const int64_t row0 = B.row0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  __shared__ float sm_q[GT][HD];
  kivi_load_q<T, HD, GT>(a, row0, group, sm_q);

  // ---- phase A on tensor cores ----
  const int a_end = B.a_end, p_begin = B.p_begin, p_end = B.p_end;
  float m_a = -INFINITY, l_a = 0.f;  // head g: m shared by the lanes of g, l this lane's part
  float acc_a[NMT][4];               // O^T tiles: (channels 16mt + g, +8) x (heads 2t, 2t + 1)
  float mterm[NMT];                  // head g: sum_j p_j * min_{j, group of tile mt}, lane's part
#pragma unroll
  for (int mt = 0; mt < NMT; ++mt) {
    mterm[mt] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc_a[mt][i] = 0.f;
  }
  for (int pi = p_begin + warp; pi < p_end; pi += kDecodeThreads / 32) {  // uniform per warp
    const int64_t blk = static_cast<int64_t>(__ldg(pages + pi)) * a.hkv + kvh;
    // Qs (head g in rows g, its tail in rows g + 8) in this lane's channel order; bias = q . min.
    uint32_t aq[NSL][4];
    float bias = 0.f;
#pragma unroll
    for (int s = 0; s < NSL; ++s) {
      const int word = t * WPL + (s * BITS) / 8;
      const int p0 = 2 * (s % SPW);
      const int ch[4] = {word * CPW + p0, word * CPW + p0 + CPH, word * CPW + p0 + 1,
                         word * CPW + p0 + 1 + CPH};
      float head[4], tail[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float qv = g < GT ? sm_q[g][ch[i]] : 0.f;
        const float sc = h2f_bits(__ldg(a.ks + blk * HD + ch[i]));
        bias = fmaf(qv, h2f_bits(__ldg(a.km + blk * HD + ch[i])), bias);
        split_half(qv * sc, &head[i], &tail[i]);
      }
      aq[s][0] = pack_half2(head[0], head[1]);
      aq[s][1] = pack_half2(tail[0], tail[1]);
      aq[s][2] = pack_half2(head[2], head[3]);
      aq[s][3] = pack_half2(tail[2], tail[3]);
    }
    bias += __shfl_xor_sync(FULL, bias, 1);
    bias += __shfl_xor_sync(FULL, bias, 2);
    const uint8_t* kpage = a.kc + blk * (a.ps * ROWB);
    const uint8_t* vpage = a.vc + blk * (a.ps * ROWB);
    const uint16_t* vsp = a.vs + blk * a.ps * a.vgroups;
    const uint16_t* vmp = a.vm + blk * a.ps * a.vgroups;
    for (int r0 = 0; r0 < a.ps; r0 += 16) {  // uniform
      // Scores of head g for tokens r0 + {2t, 2t + 1, 8 + 2t, 9 + 2t}.
      float sc[4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t kw[WPL];
        load_words<WPL>(kw, kpage + (r0 + 8 * nt + g) * ROWB + t * WPL * 4);
        float d[4] = {bias, bias, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < NSL; ++s) {
          const uint32_t w = kw[(s * BITS) / 8];
          const int p0 = 2 * (s % SPW);
          const uint32_t bk[2] = {codes_to_half2((w >> (p0 * BITS)) & MASK),
                                  codes_to_half2((w >> ((p0 + 1) * BITS)) & MASK)};
          mma_m16n8k16(d, aq[s], bk);
        }
        sc[2 * nt] = d[0] + d[2];  // head + tail rows
        sc[2 * nt + 1] = d[1] + d[3];
      }
      const TileSoftmax sm = tile_softmax(sc, m_a, l_a);
      const float(&p)[4] = sm.p;
      const float corr = sm.corr;
      const int rows[4] = {r0 + 2 * t, r0 + 2 * t + 1, r0 + 8 + 2 * t, r0 + 9 + 2 * t};
      int cur_group = -1;
      uint32_t wh[2] = {0, 0}, wt[2] = {0, 0};
      float msum = 0.f;
#pragma unroll
      for (int mt = 0; mt < NMT; ++mt) {
        rescale_tile(acc_a[mt], sm);
        const int G = (16 * mt) >> a.vg_shift;  // a tile lies in one value group (vg % 16 == 0)
        if (G != cur_group) {                   // uniform
          cur_group = G;
          float w[4], head[4], tail[4];
          msum = 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            w[i] = p[i] * h2f_bits(__ldg(vsp + rows[i] * a.vgroups + G));
            msum = fmaf(p[i], h2f_bits(__ldg(vmp + rows[i] * a.vgroups + G)), msum);
            split_half(w[i], &head[i], &tail[i]);
          }
          wh[0] = pack_half2(head[0], head[1]);
          wh[1] = pack_half2(head[2], head[3]);
          wt[0] = pack_half2(tail[0], tail[1]);
          wt[1] = pack_half2(tail[2], tail[3]);
        }
        mterm[mt] = mterm[mt] * corr + msum;
        // codes^T (channels 16mt + g, + 8) x (tokens 2t, 2t + 1 | 2t + 8, 2t + 9)
        uint32_t av[4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int c = 16 * mt + g + 8 * hh;
            const int off = (c % CPW) * BITS;
            const uint32_t w1 = ldg_word(vpage + rows[2 * kk] * ROWB + 4 * (c / CPW));
            const uint32_t w2 = ldg_word(vpage + rows[2 * kk + 1] * ROWB + 4 * (c / CPW));
            const uint32_t x = __byte_perm(w1, w2, off < 16 ? 0x5410u : 0x7632u);
            av[2 * kk + hh] = codes_to_half2((x >> (off & 15)) & MASK);
          }
        mma_m16n8k16(acc_a[mt], av, wh);
        mma_m16n8k16(acc_a[mt], av, wt);
      }
    }
  }
  // Hand each warp's state to the first slot of its threads; phase B continues from it.
  float m[GT], l[GT], acc[GT][CPT];
  warp_state_to_slots<HD, GT>(m_a, l_a, acc_a, mterm, m, l, acc);
  kivi_phase_b<T, HD, GT, BITS>(a, sm_q, b, kvh, a_end, t1, kq, vq, pages, m, l, acc);
  finish_block<T, HD, GT>(m, l, acc, group, row0, split, a.out);
}

}  // namespace kvb::kernels::cuda
