#pragma once
// Pieces shared by the dense/gathered and the KIVI decode kernels: the warp reduction of a row's
// partial dot products, the online-softmax update of one token slot, and the end of a block (the
// NSLOT slot states of a block merged through shared memory, then written as the output or as one
// split's partial state). Scores are kept in log2 units (q is pre-scaled by sm_scale * log2 e), so
// exp2f does the exponentials; partial states are stored in natural units (decode_attention.h).

#include "common.cuh"
#include "kvb_cuda.cuh"

namespace kvb::kernels::cuda {

// Sum over the TPT lanes that share a row (aligned lane groups inside one warp). Every lane of the
// warp must call it (the loops around it are uniform across the block).
template <int TPT>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = TPT / 2; off >= 1; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Where a block's result goes.
struct DecodeOut {
  void* o;      // [batch, num_qo_heads, HD] T, when splits == 1
  float* ws_o;  // [batch * num_qo_heads, splits, HD] when splits > 1
  float* ws_m;  // [batch * num_qo_heads, splits]
  float* ws_l;  // [batch * num_qo_heads, splits]
  int splits;
};

// The block's slot states in shared memory (finish_block merges them; the tensor-core KIVI kernel
// also hands its warps' states to slots through them): m, l in log2 units, acc unnormalised.
template <int HD, int GT>
struct SlotSmem {
  float (*acc)[GT][HD];  // [NSLOT][GT][HD]
  float (*m)[GT];        // [NSLOT][GT]
  float (*l)[GT];        // [NSLOT][GT]
};
template <int HD, int GT>
__device__ __forceinline__ SlotSmem<HD, GT> slot_smem() {
  using C = DecodeCfg<HD, GT>;
  __shared__ float sm_acc[C::NSLOT][GT][HD];
  __shared__ float sm_m[C::NSLOT][GT];
  __shared__ float sm_l[C::NSLOT][GT];
  return SlotSmem<HD, GT>{sm_acc, sm_m, sm_l};
}

// Tensor-core decode kernels: the online-softmax step of head g = lane / 4 over this lane's 4
// scores of a 16-token tile (log2 units; -inf: no token; g's 4 lanes agree on the maximum).
// Updates m and l (this lane's part), gives the weights p, the correction of head g's running sums
// and those of heads 2t, 2t + 1 (t = lane % 4), whose O^T columns this lane holds. A tile with no
// token changes nothing.
struct TileSoftmax {
  float p[4];
  float corr, corr_even, corr_odd;
};
__device__ __forceinline__ TileSoftmax tile_softmax(const float (&sc)[4], float& m, float& l) {
  constexpr unsigned FULL = 0xffffffffu;
  const int t = threadIdx.x % 4;
  float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
  mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
  const float m_new = fmaxf(m, mx);
  const bool none = m_new == -INFINITY;
  TileSoftmax r;
  r.corr = none ? 1.f : exp2f(m - m_new);  // 0 while m is -inf
#pragma unroll
  for (int i = 0; i < 4; ++i) r.p[i] = none ? 0.f : exp2f(sc[i] - m_new);
  l = l * r.corr + ((r.p[0] + r.p[1]) + (r.p[2] + r.p[3]));
  m = m_new;
  r.corr_even = __shfl_sync(FULL, r.corr, 8 * t);
  r.corr_odd = __shfl_sync(FULL, r.corr, 8 * t + 4);
  return r;
}

// An O^T tile's columns (heads 2t, 2t + 1) scaled by their heads' corrections.
__device__ __forceinline__ void rescale_tile(float (&c)[4], const TileSoftmax& sm) {
  c[0] *= sm.corr_even;
  c[2] *= sm.corr_even;
  c[1] *= sm.corr_odd;
  c[3] *= sm.corr_odd;
}

// Tensor-core decode kernels: each warp's state goes to the first slot of its threads, and every
// thread comes back with its slot's state (the other slots start empty). A warp's state: m (head g
// = lane / 4, the same in g's 4 lanes), l (this lane's part, summed here), O^T tiles acc[mt] =
// (channels 16 mt + g, + 8) x (heads 2t, 2t + 1) with t = lane % 4 (mma.cuh's C layout), and
// optionally tile_add[mt] (this lane's part for head g, summed here) added to every channel of
// tile mt (KIVI's min term).
template <int HD, int GT>
__device__ __forceinline__ void warp_state_to_slots(float m_w, float l_w,
                                                    const float (&acc_w)[HD / 16][4],
                                                    const float* tile_add, float (&m)[GT],
                                                    float (&l)[GT],
                                                    float (&acc)[GT][DecodeCfg<HD, GT>::CPT]) {
  using C = DecodeCfg<HD, GT>;
  constexpr int NMT = HD / 16;
  constexpr unsigned FULL = 0xffffffffu;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  l_w += __shfl_xor_sync(FULL, l_w, 1);
  l_w += __shfl_xor_sync(FULL, l_w, 2);
  float add[NMT];
#pragma unroll
  for (int mt = 0; mt < NMT; ++mt) {
    add[mt] = tile_add ? tile_add[mt] : 0.f;
    add[mt] += __shfl_xor_sync(FULL, add[mt], 1);
    add[mt] += __shfl_xor_sync(FULL, add[mt], 2);
  }
  const SlotSmem<HD, GT> S = slot_smem<HD, GT>();
  const int handoff = warp * (32 / C::TPT);  // a slot whose threads are all in this warp
  if (t == 0 && g < GT) {
    S.m[handoff][g] = m_w;
    S.l[handoff][g] = l_w;
  }
#pragma unroll
  for (int mt = 0; mt < NMT; ++mt) {
    const int c = 16 * mt + g;
    if (2 * t < GT) {
      S.acc[handoff][2 * t][c] = acc_w[mt][0];
      S.acc[handoff][2 * t][c + 8] = acc_w[mt][2];
    }
    if (2 * t + 1 < GT) {
      S.acc[handoff][2 * t + 1][c] = acc_w[mt][1];
      S.acc[handoff][2 * t + 1][c + 8] = acc_w[mt][3];
    }
  }
  __syncwarp();
  if (tile_add && g < GT) {
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) S.acc[handoff][g][16 * mt + t + 4 * j] += add[mt];
  }
  __syncwarp();
  const int lc = tid % C::TPT, slot = tid / C::TPT;
  const bool handed = slot == handoff;
#pragma unroll
  for (int h = 0; h < GT; ++h) {
    m[h] = handed ? S.m[slot][h] : -INFINITY;
    l[h] = handed ? S.l[slot][h] : 0.f;
#pragma unroll
    for (int c = 0; c < C::CPT; ++c) acc[h][c] = handed ? S.acc[slot][h][lc * C::CPT + c] : 0.f;
  }
  __syncwarp();  // read before finish_block writes the slots again
}

// Merges the block's slot states (m, l in log2 units; acc unnormalised) and writes query heads
// [row0, row0 + group) of this split. Called by every thread of the block.
template <typename T, int HD, int GT>
__device__ __forceinline__ void finish_block(const float (&m)[GT], const float (&l)[GT],
                                             const float (&acc)[GT][DecodeCfg<HD, GT>::CPT],
                                             int group, int64_t row0, int split,
                                             const DecodeOut& out) {
  using C = DecodeCfg<HD, GT>;
  const SlotSmem<HD, GT> S = slot_smem<HD, GT>();
  float(*sm_acc)[GT][HD] = S.acc;
  float(*sm_m)[GT] = S.m;
  float(*sm_l)[GT] = S.l;
  const int tid = threadIdx.x, lc = tid % C::TPT, slot = tid / C::TPT;
#pragma unroll
  for (int h = 0; h < GT; ++h) {
    if (lc == 0) {
      sm_m[slot][h] = m[h];
      sm_l[slot][h] = l[h];
    }
#pragma unroll
    for (int c = 0; c < C::CPT; ++c) sm_acc[slot][h][lc * C::CPT + c] = acc[h][c];
  }
  __syncthreads();
  for (int idx = tid; idx < group * HD; idx += kDecodeThreads) {
    const int h = idx / HD, d = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < C::NSLOT; ++s) M = fmaxf(M, sm_m[s][h]);
    float L = 0.f, O = 0.f;
    if (M > -INFINITY) {
#pragma unroll
      for (int s = 0; s < C::NSLOT; ++s) {
        const float w = exp2f(sm_m[s][h] - M);  // an empty slot (-inf) weighs 0
        L += w * sm_l[s][h];
        O += w * sm_acc[s][h][d];
      }
    }
    const float val = L > 0.f ? O / L : 0.f;
    const int64_t row = row0 + h;
    if (out.splits == 1) {
      static_cast<T*>(out.o)[row * HD + d] = from_float<T>(val);
    } else {
      out.ws_o[(row * out.splits + split) * HD + d] = val;
      if (d == 0) {
        out.ws_m[row * out.splits + split] = L > 0.f ? M * kLn2 : -INFINITY;
        out.ws_l[row * out.splits + split] = L;
      }
    }
  }
}

// Online-softmax update of one slot with UNROLL scores s (log2 units; ok[u] false = no token) and
// the matching values, converted on demand by vals(u, f) into f[CPT]. All lanes of a slot agree on
// s and ok, so m and l stay identical across them.
template <int GT, int CPT, int UNROLL, typename ValFn>
__device__ __forceinline__ void softmax_update(float (&m)[GT], float (&l)[GT],
                                               float (&acc)[GT][CPT], const float (&s)[UNROLL][GT],
                                               const bool (&ok)[UNROLL], ValFn&& vals) {
  float p[UNROLL][GT];
#pragma unroll
  for (int h = 0; h < GT; ++h) {
    float mx = m[h];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (ok[u]) mx = fmaxf(mx, s[u][h]);
    const float corr = mx == -INFINITY ? 1.f : exp2f(m[h] - mx);
    float sum = l[h] * corr;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      p[u][h] = ok[u] ? exp2f(s[u][h] - mx) : 0.f;
      sum += p[u][h];
    }
#pragma unroll
    for (int c = 0; c < CPT; ++c) acc[h][c] *= corr;
    l[h] = sum;
    m[h] = mx;
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    if (!ok[u]) continue;
    float f[CPT];
    vals(u, f);
#pragma unroll
    for (int h = 0; h < GT; ++h)
#pragma unroll
      for (int c = 0; c < CPT; ++c) acc[h][c] = fmaf(p[u][h], f[c], acc[h][c]);
  }
}

// The merge of split partial states into the output (decode_attention.h's AttentionMergeParams
// semantics; m in natural units). One block per row, threads over channels.
template <typename TO>
__global__ void merge_states_kernel(const float* __restrict__ po,  // [rows, S, D]
                                    const float* __restrict__ pm,  // [rows, S]
                                    const float* __restrict__ pl,  // [rows, S]
                                    TO* __restrict__ o,            // [rows, D]
                                    float* __restrict__ lse,       // [rows] or null
                                    int S, int D) {
  const int64_t r = blockIdx.x;
  const float* m = pm + r * S;
  const float* l = pl + r * S;
  float M = -INFINITY;
  for (int s = 0; s < S; ++s)
    if (l[s] > 0.f) M = fmaxf(M, m[s]);
  float W = 0.f;
  if (M > -INFINITY)
    for (int s = 0; s < S; ++s)
      if (l[s] > 0.f) W += l[s] * expf(m[s] - M);
  const float inv = W > 0.f ? 1.f / W : 0.f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    if (M > -INFINITY)
      for (int s = 0; s < S; ++s)
        if (l[s] > 0.f) acc += l[s] * expf(m[s] - M) * po[(r * S + s) * D + d];
    o[r * D + d] = from_float<TO>(acc * inv);
  }
  if (lse && threadIdx.x == 0) lse[r] = W > 0.f ? M + logf(W) : -INFINITY;
}

// Launches the merge of a split decode's workspace into o (dtype T, [rows, HD]).
template <typename T>
cudaError_t launch_split_merge(const DecodeOut& out, int64_t rows, int hd, cudaStream_t stream) {
  KVB_LAUNCH(static_cast<unsigned>(rows), hd, 0, stream, merge_states_kernel<T>)
  (out.ws_o, out.ws_m, out.ws_l, static_cast<T*>(out.o), nullptr, out.splits, hd);
  return cudaGetLastError();
}

// Split plan shared by both decode launchers: chunks are multiples of `granule` positions and, when
// the planner chooses, at least `min_chunk` long.
DecodePlan plan_splits(int64_t batch, int64_t kv_heads, int64_t qo_heads, int64_t hd,
                       int64_t max_len, int32_t granule, int32_t min_chunk, int32_t requested,
                       int num_sms);

// Workspace of a split launch: partial o [rows, splits, hd], then m and l [rows, splits], each
// 256-byte aligned.
inline size_t split_workspace_bytes(int64_t rows, int64_t splits, int64_t hd) {
  auto up = [](int64_t x) { return (x + 255) / 256 * 256; };
  return splits > 1 ? static_cast<size_t>(up(rows * splits * hd * 4) + 2 * up(rows * splits * 4))
                    : 0;
}

inline DecodeOut split_out(void* o, void* ws, int64_t rows, int splits, int hd) {
  DecodeOut out{o, nullptr, nullptr, nullptr, splits};
  if (splits > 1) {
    auto up = [](int64_t x) { return (x + 255) / 256 * 256; };
    char* base = static_cast<char*>(ws);
    out.ws_o = reinterpret_cast<float*>(base);
    out.ws_m = reinterpret_cast<float*>(base + up(rows * splits * hd * 4));
    out.ws_l = reinterpret_cast<float*>(base + up(rows * splits * hd * 4) + up(rows * splits * 4));
  }
  return out;
}

inline int ps_shift_of(int ps) {
  if (ps <= 0 || (ps & (ps - 1)) != 0) return -1;
  int s = 0;
  while ((1 << s) < ps) ++s;
  return s;
}

}  // namespace kvb::kernels::cuda
