// Quantize-and-append into the KIVI store and the converting append into paged pools.
//
// KIVI: one block per (kv head, sequence) walks the sequence's new tokens in order, exactly as the
// oracle does (kivi_cache_ref.cpp): the value row leaving the window is quantized before its ring
// slot is reused, the new key goes into the ring, and a full chunk of U keys becomes U / page_size
// quantized pages. The quantizer is quantize.h's, bit for bit: min rounded down and scale rounded
// up to fp16, inv = 1 / scale, codes = rint(clamp((x - min) * inv, 0, qmax)) (IEEE division: this
// file must not be built with --use_fast_math). Rings are read with plain loads (the block writes
// them).

#include <algorithm>

#include "common.cuh"
#include "kvb_cuda.cuh"

namespace kvb::kernels::cuda {

namespace {

constexpr int kAppendThreads = 128;
constexpr int kMaxAppendHeadDim = 256;

__device__ __forceinline__ uint32_t quant_code(float x, float mn, float inv, float qmax) {
  const float t = fminf(fmaxf((x - mn) * inv, 0.f), qmax);
  return static_cast<uint32_t>(__float2int_rn(t));
}

// (min, scale) of a group with extremes lo, hi: the stored fp16 bits and the fp32 values used.
__device__ __forceinline__ void group_params(float lo, float hi, float qmax, uint16_t* mh,
                                             uint16_t* sh, float* mn, float* inv) {
  *mh = half_bits_down(lo);
  *mn = h2f_bits(*mh);
  *sh = half_bits_up((hi - *mn) / qmax);
  const float sc = h2f_bits(*sh);
  *inv = sc > 0.f ? 1.f / sc : 0.f;
}

struct KiviAppendArgs {
  const void* k_new;  // [tokens, hkv, hd] T
  const void* v_new;  // [tokens, hkv, hd] T
  const int32_t* new_indptr;
  const int32_t* kv_lens;
  uint8_t* kc;
  uint16_t* ks;
  uint16_t* km;
  uint8_t* vc;
  uint16_t* vs;
  uint16_t* vm;
  void* kres;  // [batch, U, hkv, hd] T
  void* vres;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int hkv, hd, ps, R, U, kbits, vbits, vg;
};

template <typename T>
__global__ void __launch_bounds__(kAppendThreads) kivi_append_kernel(const KiviAppendArgs a) {
  const int kvh = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int hd = a.hd, ps = a.ps, U = a.U;
  const int vgroups = hd / a.vg;
  const int64_t vrow_bytes = static_cast<int64_t>(hd) * a.vbits / 8;
  const int64_t kpage_bytes = static_cast<int64_t>(ps) * hd * a.kbits / 8;
  const float kqmax = static_cast<float>((1 << a.kbits) - 1),
              vqmax = static_cast<float>((1 << a.vbits) - 1);
  const int32_t* pages = a.page_indices + a.page_indptr[b];
  T* kres = static_cast<T*>(a.kres);
  T* vres = static_cast<T*>(a.vres);
  auto ring = [&](int64_t j) { return ((static_cast<int64_t>(b) * U + j % U) * a.hkv + kvh) * hd; };
  auto blk = [&](int64_t j) { return static_cast<int64_t>(pages[j / ps]) * a.hkv + kvh; };

  __shared__ float s_row[kMaxAppendHeadDim];
  __shared__ float s_mn[kMaxAppendHeadDim];
  __shared__ float s_inv[kMaxAppendHeadDim];

  // Quantizes s_row (a value row) into token j's slot.
  auto quantize_value = [&](int64_t j) {
    const int64_t vb = blk(j);
    const int64_t meta = (vb * ps + j % ps) * vgroups;
    for (int g = tid; g < vgroups; g += kAppendThreads) {
      float lo = s_row[g * a.vg], hi = lo;
      for (int c = g * a.vg + 1; c < (g + 1) * a.vg; ++c) {
        lo = fminf(lo, s_row[c]);
        hi = fmaxf(hi, s_row[c]);
      }
      uint16_t mh, sh;
      group_params(lo, hi, vqmax, &mh, &sh, &s_mn[g], &s_inv[g]);
      a.vs[meta + g] = sh;
      a.vm[meta + g] = mh;
    }
    __syncthreads();
    uint8_t* dst = a.vc + vb * (static_cast<int64_t>(ps) * vrow_bytes) + (j % ps) * vrow_bytes;
    const int per = 8 / a.vbits;  // codes per byte
    for (int k = tid; k < vrow_bytes; k += kAppendThreads) {
      uint32_t byte = 0;
      for (int i = 0; i < per; ++i) {
        const int c = k * per + i, g = c / a.vg;
        byte |= quant_code(s_row[c], s_mn[g], s_inv[g], vqmax) << (i * a.vbits);
      }
      dst[k] = static_cast<uint8_t>(byte);
    }
    __syncthreads();
  };

  // Quantizes the ps keys j0 .. j0 + ps - 1 (all in the ring) into their page.
  auto quantize_key_page = [&](int64_t j0) {
    const int64_t kb = blk(j0);
    for (int c = tid; c < hd; c += kAppendThreads) {
      float lo = to_float<T>(kres[ring(j0) + c]), hi = lo;
      for (int r = 1; r < ps; ++r) {
        const float x = to_float<T>(kres[ring(j0 + r) + c]);
        lo = fminf(lo, x);
        hi = fmaxf(hi, x);
      }
      uint16_t mh, sh;
      group_params(lo, hi, kqmax, &mh, &sh, &s_mn[c], &s_inv[c]);
      a.ks[kb * hd + c] = sh;
      a.km[kb * hd + c] = mh;
    }
    __syncthreads();
    uint8_t* dst = a.kc + kb * kpage_bytes;
    const int per = 8 / a.kbits;
    for (int64_t k = tid; k < kpage_bytes; k += kAppendThreads) {
      uint32_t byte = 0;
      for (int i = 0; i < per; ++i) {
        const int64_t e = k * per + i;
        const int r = static_cast<int>(e / hd), c = static_cast<int>(e % hd);
        byte |= quant_code(to_float<T>(kres[ring(j0 + r) + c]), s_mn[c], s_inv[c], kqmax)
                << (i * a.kbits);
      }
      dst[k] = static_cast<uint8_t>(byte);
    }
    __syncthreads();
  };

  const int t_begin = a.new_indptr[b], t_end = a.new_indptr[b + 1];
  for (int t = t_begin; t < t_end; ++t) {
    const int64_t n = static_cast<int64_t>(a.kv_lens[b]) + (t - t_begin);
    const int64_t src = (static_cast<int64_t>(t) * a.hkv + kvh) * hd;
    // Values.
    if (a.R == 0) {
      for (int c = tid; c < hd; c += kAppendThreads)
        s_row[c] = to_float<T>(static_cast<const T*>(a.v_new)[src + c]);
      __syncthreads();
      quantize_value(n);
    } else {
      if (n >= a.R) {
        for (int c = tid; c < hd; c += kAppendThreads)
          s_row[c] = to_float<T>(vres[ring(n - a.R) + c]);
        __syncthreads();
        quantize_value(n - a.R);
      }
      for (int c = tid; c < hd; c += kAppendThreads)
        vres[ring(n) + c] = static_cast<const T*>(a.v_new)[src + c];
    }
    // Keys.
    for (int c = tid; c < hd; c += kAppendThreads)
      kres[ring(n) + c] = static_cast<const T*>(a.k_new)[src + c];
    __syncthreads();
    if ((n + 1) % U == 0)
      for (int64_t j0 = n + 1 - U; j0 <= n; j0 += ps) quantize_key_page(j0);
  }
}

struct PagedAppendArgs {
  const void* k_new;
  const void* v_new;
  const int32_t* new_indptr;
  const int32_t* kv_lens;
  void* kp;
  void* vp;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int batch, row, ps;
  KvDtype src, dst;
};

__device__ __forceinline__ float load_any(const void* p, KvDtype d, int64_t i) {
  switch (d) {
    case KvDtype::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case KvDtype::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void store_any(void* p, KvDtype d, int64_t i, float x) {
  switch (d) {
    case KvDtype::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(x);
      break;
    case KvDtype::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
      break;
    default:
      static_cast<float*>(p)[i] = x;
      break;
  }
}

__global__ void paged_append_kernel(const PagedAppendArgs a) {
  const int t = blockIdx.x;
  int lo = 0, hi = a.batch;  // the sequence b with new_indptr[b] <= t < new_indptr[b + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (a.new_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  const int b = lo;
  const int64_t j = static_cast<int64_t>(a.kv_lens[b]) + (t - a.new_indptr[b]);
  const int64_t dst =
      (static_cast<int64_t>(a.page_indices[a.page_indptr[b] + j / a.ps]) * a.ps + j % a.ps) * a.row;
  const int64_t src = static_cast<int64_t>(t) * a.row;
  for (int i = threadIdx.x; i < a.row; i += blockDim.x) {
    store_any(a.kp, a.dst, dst + i, load_any(a.k_new, a.src, src + i));
    store_any(a.vp, a.dst, dst + i, load_any(a.v_new, a.src, src + i));
  }
}

}  // namespace

bool kivi_append_supported(const KiviAppendParams& p, std::string* why) {
  if (auto e = kivi_layout_check(p.layout); !e.empty()) return set_why(why, e);
  if (p.dtype != KvDtype::kF16 && p.dtype != KvDtype::kBF16)
    return set_why(why,
                   std::string("dtype ") + kv_dtype_name(p.dtype) + " not compiled (fp16, bf16)");
  if (p.layout.head_dim > kMaxAppendHeadDim)
    return set_why(why, "head_dim above " + std::to_string(kMaxAppendHeadDim) + " not supported");
  if (p.batch_size < 0 || p.batch_size > 65535 || p.layout.num_kv_heads > 65535)
    return set_why(why, "batch_size and num_kv_heads must be in [0, 65535]");
  if (!p.k_new || !p.v_new || !p.new_indptr || !p.kv_lens || !p.k_codes || !p.k_scales ||
      !p.k_mins || !p.v_codes || !p.v_scales || !p.v_mins || !p.k_residual || !p.v_residual ||
      !p.page_indptr || !p.page_indices)
    return set_why(why, "null pointer");
  return set_why(why, "");
}

cudaError_t kivi_append_cuda(const KiviAppendParams& p, cudaStream_t stream) {
  if (!kivi_append_supported(p, nullptr)) return cudaErrorInvalidValue;
  if (p.batch_size == 0) return cudaSuccess;
  const KiviLayout& L = p.layout;
  KiviAppendArgs a{p.k_new,
                   p.v_new,
                   p.new_indptr,
                   p.kv_lens,
                   p.k_codes,
                   p.k_scales,
                   p.k_mins,
                   p.v_codes,
                   p.v_scales,
                   p.v_mins,
                   p.k_residual,
                   p.v_residual,
                   p.page_indptr,
                   p.page_indices,
                   L.num_kv_heads,
                   L.head_dim,
                   L.page_size,
                   L.residual_length,
                   static_cast<int>(kivi_residual_capacity(L)),
                   L.k_bits,
                   L.v_bits,
                   L.v_group_size};
  const dim3 grid(L.num_kv_heads, p.batch_size);
  KVB_DISPATCH_DTYPE(p.dtype, T, {
    KVB_LAUNCH(grid, kAppendThreads, 0, stream, kivi_append_kernel<T>)(a);
  });
  return cudaGetLastError();
}

bool paged_append_supported(const PagedAppendParams& p, std::string* why) {
  if (p.batch_size < 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 || p.page_size <= 0)
    return set_why(why, "non-positive size");
  for (KvDtype d : {p.src_dtype, p.dtype})
    if (d != KvDtype::kF16 && d != KvDtype::kBF16 && d != KvDtype::kF32)
      return set_why(why, "unknown dtype");
  if (!p.k_new || !p.v_new || !p.new_indptr || !p.kv_lens || !p.k_pages || !p.v_pages ||
      !p.page_indptr || !p.page_indices)
    return set_why(why, "null pointer");
  return set_why(why, "");
}

cudaError_t paged_append_cuda(const PagedAppendParams& p, int32_t num_new_tokens,
                              cudaStream_t stream) {
  if (!paged_append_supported(p, nullptr) || num_new_tokens < 0) return cudaErrorInvalidValue;
  if (num_new_tokens == 0 || p.batch_size == 0) return cudaSuccess;
  PagedAppendArgs a{
      p.k_new,     p.v_new,       p.new_indptr,   p.kv_lens,    p.k_pages,
      p.v_pages,   p.page_indptr, p.page_indices, p.batch_size, p.num_kv_heads * p.head_dim,
      p.page_size, p.src_dtype,   p.dtype};
  KVB_LAUNCH(num_new_tokens, 256, 0, stream, paged_append_kernel)(a);
  return cudaGetLastError();
}

}  // namespace kvb::kernels::cuda
