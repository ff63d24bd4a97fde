// Decode attention over paged fp16/bf16 KV, dense or gathered (decode_attention.h), split-K with a
// merge of partial softmax states, and the standalone merge launcher.
//
// Grid (splits, kv heads, sequences); 128 threads. Each block serves the whole query group of its
// kv head from one read of each K/V row: TPT threads share a row (CPT channels each, 16-byte
// loads), NSLOT rows are in flight per step and every thread issues UNROLL rows' loads before it
// uses any. Scores are reduced across a row's lanes with shuffles, each slot keeps its own
// online-softmax state, and the block merges its slots at the end (decode_common.cuh).

#include <algorithm>
#include <climits>

#include "decode_common.cuh"

namespace kvb::kernels::cuda {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool set_why(std::string* why, const std::string& msg) {
  if (why) *why = msg;
  return msg.empty();
}

int device_sm_count() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 0;
  }
  if (cache[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    cache[dev] = n;
  }
  return cache[dev];
}

DecodePlan plan_splits(int64_t batch, int64_t kv_heads, int64_t qo_heads, int64_t hd,
                       int64_t max_len, int32_t granule, int32_t min_chunk, int32_t requested,
                       int num_sms) {
  DecodePlan plan;
  plan.num_splits = 1;
  plan.chunk = INT32_MAX;
  if (max_len <= 0 || batch <= 0) return plan;
  const int64_t units = (max_len + granule - 1) / granule;
  int64_t splits;
  if (requested > 0) {
    splits = std::min<int64_t>(requested, units);
  } else {
    if (num_sms <= 0) num_sms = device_sm_count();
    if (num_sms <= 0) num_sms = 132;
    const int64_t blocks = std::max<int64_t>(1, batch * kv_heads);
    const int64_t want = (2 * num_sms + blocks - 1) / blocks;
    const int64_t by_len = std::max<int64_t>(1, max_len / std::max(min_chunk, granule));
    splits = std::min<int64_t>({want, by_len, 256});
  }
  splits = std::max<int64_t>(1, splits);
  int64_t chunk = (max_len + splits - 1) / splits;
  chunk = (chunk + granule - 1) / granule * granule;
  splits = (max_len + chunk - 1) / chunk;
  plan.num_splits = static_cast<int32_t>(splits);
  plan.chunk = splits > 1 ? static_cast<int32_t>(chunk) : INT32_MAX;
  plan.workspace_bytes = split_workspace_bytes(batch * qo_heads, splits, hd);
  return plan;
}

namespace {

struct DenseArgs {
  const void* q;                // [batch, hq, HD]
  const void* k;                // [pages, ps, hkv, HD]
  const void* v;                // [pages, ps, hkv, HD]
  const int32_t* page_indptr;   // [batch + 1]
  const int32_t* page_indices;  // [nnz pages]
  const int32_t* kv_lens;       // [batch]
  const int32_t* g_indptr;      // [batch + 1] (gather modes)
  const int32_t* g_idx;         // gather lists
  int mode;                     // GatherMode
  int hq, hkv, ps, ps_shift;
  int chunk;         // positions per split
  float scale_log2;  // sm_scale * log2(e)
  DecodeOut out;
};

// Where a block's work lies: its split, kv head and sequence, the positions [t0, t1) of what it
// scans (the sequence, or its gathered tokens / pages), and the sequence's lists.
struct DenseBlock {
  int split, kvh, seq, group, len, t0, t1;
  const int32_t* gl;     // the sequence's gather list (gather modes)
  const int32_t* pages;  // its page ids
  int64_t row0;          // its first query head's row in q and o
};

__device__ __forceinline__ DenseBlock dense_block(const DenseArgs& a) {
  DenseBlock k;
  k.split = blockIdx.x;
  k.kvh = blockIdx.y;
  k.seq = blockIdx.z;
  k.group = a.hq / a.hkv;
  k.len = a.kv_lens[k.seq];
  int scan = k.len;
  k.gl = nullptr;
  if (a.mode != static_cast<int>(GatherMode::kNone)) {
    const int g0 = a.g_indptr[k.seq];
    scan = a.g_indptr[k.seq + 1] - g0;
    k.gl = a.g_idx + g0;
    if (a.mode == static_cast<int>(GatherMode::kPages)) scan *= a.ps;
  }
  k.t0 = k.split * a.chunk;
  // The last split runs to the end, so a plan made from a too-small max_scan_len stays correct.
  k.t1 = k.split == a.out.splits - 1 ? scan : min(scan, k.t0 + a.chunk);
  k.pages = a.page_indices + a.page_indptr[k.seq];
  k.row0 = static_cast<int64_t>(k.seq) * a.hq + static_cast<int64_t>(k.kvh) * k.group;
  return k;
}

// The element offset of scanned position j's K/V row (kv head 0; j < t1), or -1 when j names no
// token (the tail of a gathered page past the sequence's end).
template <int HD>
__device__ __forceinline__ int64_t dense_row(const DenseArgs& a, const DenseBlock& B, int j) {
  auto div_ps = [&](int x) { return a.ps_shift >= 0 ? (x >> a.ps_shift) : x / a.ps; };
  int pos = j;
  if (a.mode == static_cast<int>(GatherMode::kTokens)) {
    pos = __ldg(B.gl + j);
  } else if (a.mode == static_cast<int>(GatherMode::kPages)) {
    const int sp = div_ps(j);
    pos = __ldg(B.gl + sp) * a.ps + (j - sp * a.ps);
    if (pos >= B.len) return -1;
  }
  const int lp = div_ps(pos);
  return (static_cast<int64_t>(__ldg(B.pages + lp)) * a.ps + (pos - lp * a.ps)) *
         (static_cast<int64_t>(a.hkv) * HD);
}

template <typename T, int HD, int GT>
__global__ void __launch_bounds__(kDecodeThreads) dense_decode_kernel(const DenseArgs a) {
  using C = DecodeCfg<HD, GT>;
  constexpr int CPT = C::CPT, NV = C::NV, TPT = C::TPT, NSLOT = C::NSLOT, UNROLL = C::UNROLL;
  const DenseBlock B = dense_block(a);
  const int split = B.split, group = B.group, t0 = B.t0, t1 = B.t1;
  const int64_t row0 = B.row0;
  const int tid = threadIdx.x, lc = tid % TPT, slot = tid / TPT;
  const T* kbase = static_cast<const T*>(a.k) + B.kvh * HD + lc * CPT;
  const T* vbase = static_cast<const T*>(a.v) + B.kvh * HD + lc * CPT;

  float q[GT][CPT];
#pragma unroll
  for (int h = 0; h < GT; ++h) {
    if (h < group) {
      const T* qp = static_cast<const T*>(a.q) + (row0 + h) * HD + lc * CPT;
#pragma unroll
      for (int v = 0; v < NV; ++v) cvt8<T>(ldg16(qp + 8 * v), &q[h][8 * v]);
#pragma unroll
      for (int c = 0; c < CPT; ++c) q[h][c] *= a.scale_log2;
    } else {
#pragma unroll
      for (int c = 0; c < CPT; ++c) q[h][c] = 0.f;
    }
  }
  float m[GT], l[GT], acc[GT][CPT];
#pragma unroll
  for (int h = 0; h < GT; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int c = 0; c < CPT; ++c) acc[h][c] = 0.f;
  }

  for (int base = t0; base < t1; base += C::TILE) {  // uniform across the block
    uint4 kr[UNROLL][NV], vr[UNROLL][NV];
    bool ok[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = base + u * NSLOT + slot;
      ok[u] = false;
#pragma unroll
      for (int v = 0; v < NV; ++v) kr[u][v] = vr[u][v] = make_uint4(0, 0, 0, 0);
      if (j < t1) {
        const int64_t row = dense_row<HD>(a, B, j);
        if (row >= 0) {
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            kr[u][v] = ldg16(kbase + row + 8 * v);
            vr[u][v] = ldg16(vbase + row + 8 * v);
          }
          ok[u] = true;
        }
      }
    }
    float s[UNROLL][GT];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float kf[CPT];
#pragma unroll
      for (int v = 0; v < NV; ++v) cvt8<T>(kr[u][v], kf + 8 * v);
#pragma unroll
      for (int h = 0; h < GT; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < CPT; ++c) dot = fmaf(q[h][c], kf[c], dot);
        s[u][h] = row_sum<TPT>(dot);
      }
    }
    softmax_update<GT, CPT, UNROLL>(m, l, acc, s, ok, [&](int u, float* f) {
#pragma unroll
      for (int v = 0; v < NV; ++v) cvt8<T>(vr[u][v], f + 8 * v);
    });
  }
  finish_block<T, HD, GT>(m, l, acc, group, row0, split, a.out);
}

}  // namespace

}  // namespace kvb::kernels::cuda

#include "decode_tc.cuh"

namespace kvb::kernels::cuda {

DecodePlan decode_attention_plan(const DecodeAttentionParams& p, int32_t requested_splits,
                                 int num_sms) {
  return plan_splits(p.batch_size, p.num_kv_heads, p.num_qo_heads, p.head_dim, p.max_scan_len,
                     /*granule=*/64, /*min_chunk=*/256, requested_splits, num_sms);
}

bool decode_attention_supported(const DecodeAttentionParams& p, std::string* why) {
  if (p.dtype != KvDtype::kF16 && p.dtype != KvDtype::kBF16)
    return set_why(why,
                   std::string("dtype ") + kv_dtype_name(p.dtype) + " not compiled (fp16, bf16)");
  if (p.head_dim != 64 && p.head_dim != 128)
    return set_why(why, "head_dim " + std::to_string(p.head_dim) + " not compiled (64, 128)");
  if (p.num_kv_heads <= 0 || p.num_qo_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0)
    return set_why(why, "num_qo_heads must be a positive multiple of num_kv_heads");
  const int g = p.num_qo_heads / p.num_kv_heads;
  if (g > 8) return set_why(why, "GQA group " + std::to_string(g) + " above 8 not compiled");
  if (p.page_size <= 0) return set_why(why, "page_size must be positive");
  if (p.batch_size < 0 || p.batch_size > 65535 || p.num_kv_heads > 65535)
    return set_why(why, "batch_size and num_kv_heads must be in [0, 65535]");
  if (!p.q || !p.o || !p.k_pages || !p.v_pages || !p.page_indptr || !p.page_indices || !p.kv_lens)
    return set_why(why, "null pointer");
  if (!aligned16(p.q) || !aligned16(p.k_pages) || !aligned16(p.v_pages))
    return set_why(why, "q, k_pages and v_pages must be 16-byte aligned");
  if (p.gather != GatherMode::kNone && p.gather != GatherMode::kTokens &&
      p.gather != GatherMode::kPages)
    return set_why(why, "unknown gather mode");
  if (p.gather != GatherMode::kNone && (!p.gather_indptr || !p.gather_indices))
    return set_why(why, "gather mode without gather_indptr / gather_indices");
  return set_why(why, "");
}

cudaError_t decode_attention_cuda(const DecodeAttentionParams& p, const DecodePlan& plan,
                                  void* workspace, cudaStream_t stream, DecodeKernel kernel) {
  if (!decode_attention_supported(p, nullptr)) return cudaErrorInvalidValue;
  if (p.batch_size == 0) return cudaSuccess;
  const int64_t rows = static_cast<int64_t>(p.batch_size) * p.num_qo_heads;
  if (plan.num_splits < 1 || plan.chunk < 1) return cudaErrorInvalidValue;
  if (plan.num_splits > 1 &&
      (!workspace ||
       plan.workspace_bytes < split_workspace_bytes(rows, plan.num_splits, p.head_dim)))
    return cudaErrorInvalidValue;
  DenseArgs a;
  a.q = p.q;
  a.k = p.k_pages;
  a.v = p.v_pages;
  a.page_indptr = p.page_indptr;
  a.page_indices = p.page_indices;
  a.kv_lens = p.kv_lens;
  a.g_indptr = p.gather_indptr;
  a.g_idx = p.gather_indices;
  a.mode = static_cast<int>(p.gather);
  a.hq = p.num_qo_heads;
  a.hkv = p.num_kv_heads;
  a.ps = p.page_size;
  a.ps_shift = ps_shift_of(p.page_size);
  a.chunk = plan.chunk;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.out = split_out(p.o, workspace, rows, plan.num_splits, p.head_dim);
  const dim3 grid(plan.num_splits, p.num_kv_heads, p.batch_size);
  const int group = p.num_qo_heads / p.num_kv_heads;
  const bool tensor_cores =
      kernel == DecodeKernel::kTensorCores || (kernel == DecodeKernel::kAuto && group >= 4);
  KVB_DISPATCH_DTYPE(
      p.dtype, T,
      KVB_DISPATCH_HEAD_DIM(
          p.head_dim, HD, KVB_DISPATCH_GROUP(group, GT, {
            if (tensor_cores)
              KVB_LAUNCH(grid, kDecodeThreads, 0, stream, dense_decode_tc_kernel<T, HD, GT>)(a);
            else
              KVB_LAUNCH(grid, kDecodeThreads, 0, stream, dense_decode_kernel<T, HD, GT>)(a);
          })));
  KVB_CUDA_TRY(cudaGetLastError());
  if (plan.num_splits > 1) {
    KVB_DISPATCH_DTYPE(p.dtype, T,
                       { KVB_CUDA_TRY(launch_split_merge<T>(a.out, rows, p.head_dim, stream)); });
  }
  return cudaSuccess;
}

bool attention_merge_supported(const AttentionMergeParams& p, std::string* why) {
  if (!p.partial_o || !p.partial_m || !p.partial_l || !p.o) return set_why(why, "null pointer");
  if (p.num_rows < 0 || p.num_partials <= 0 || p.head_dim <= 0)
    return set_why(why, "non-positive size");
  if (p.num_rows > INT32_MAX) return set_why(why, "too many rows");
  return set_why(why, "");
}

cudaError_t attention_merge_cuda(const AttentionMergeParams& p, cudaStream_t stream) {
  if (!attention_merge_supported(p, nullptr)) return cudaErrorInvalidValue;
  if (p.num_rows == 0) return cudaSuccess;
  const int threads = std::min(256, (p.head_dim + 31) / 32 * 32);
  switch (p.o_dtype) {
    case KvDtype::kF16:
      KVB_LAUNCH(p.num_rows, threads, 0, stream, merge_states_kernel<__half>)
      (p.partial_o, p.partial_m, p.partial_l, static_cast<__half*>(p.o), p.lse, p.num_partials,
       p.head_dim);
      break;
    case KvDtype::kBF16:
      KVB_LAUNCH(p.num_rows, threads, 0, stream, merge_states_kernel<__nv_bfloat16>)
      (p.partial_o, p.partial_m, p.partial_l, static_cast<__nv_bfloat16*>(p.o), p.lse,
       p.num_partials, p.head_dim);
      break;
    case KvDtype::kF32:
      KVB_LAUNCH(p.num_rows, threads, 0, stream, merge_states_kernel<float>)
      (p.partial_o, p.partial_m, p.partial_l, static_cast<float*>(p.o), p.lse, p.num_partials,
       p.head_dim);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kvb::kernels::cuda
