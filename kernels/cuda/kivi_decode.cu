// Launcher, planner and support check of the KIVI decode kernels (kivi_decode.cuh).

#include <algorithm>

#include "kivi_decode.cuh"

namespace kvb::kernels::cuda {

DecodePlan kivi_decode_plan(const KiviDecodeParams& p, int32_t requested_splits, int num_sms) {
  const int g = p.layout.num_kv_heads > 0 ? p.num_qo_heads / p.layout.num_kv_heads : 1;
  // A split should give every token slot of a block at least one page (phase A's unit of work).
  const int nslot = p.layout.head_dim == 64 ? (g <= 4 ? 32 : 16) : (g <= 4 ? 16 : 8);
  const int32_t ps = std::max(1, p.layout.page_size);
  return plan_splits(p.batch_size, p.layout.num_kv_heads, p.num_qo_heads, p.layout.head_dim,
                     p.max_kv_len, ps, std::max(256, nslot * ps), requested_splits, num_sms);
}

bool kivi_decode_supported(const KiviDecodeParams& p, std::string* why) {
  if (auto e = kivi_layout_check(p.layout); !e.empty()) return set_why(why, e);
  const KiviLayout& L = p.layout;
  if (p.dtype != KvDtype::kF16 && p.dtype != KvDtype::kBF16)
    return set_why(why,
                   std::string("dtype ") + kv_dtype_name(p.dtype) + " not compiled (fp16, bf16)");
  if (L.head_dim != 64 && L.head_dim != 128)
    return set_why(why, "head_dim " + std::to_string(L.head_dim) + " not compiled (64, 128)");
  if (L.k_bits != L.v_bits)
    return set_why(why, "k_bits " + std::to_string(L.k_bits) + " != v_bits " +
                            std::to_string(L.v_bits) +
                            ": only equal pairs (2,2), (4,4), (8,8) are compiled");
  if (p.num_qo_heads <= 0 || p.num_qo_heads % L.num_kv_heads != 0)
    return set_why(why, "num_qo_heads must be a positive multiple of num_kv_heads");
  const int g = p.num_qo_heads / L.num_kv_heads;
  if (g > 8) return set_why(why, "GQA group " + std::to_string(g) + " above 8 not compiled");
  if (p.batch_size < 0 || p.batch_size > 65535 || L.num_kv_heads > 65535)
    return set_why(why, "batch_size and num_kv_heads must be in [0, 65535]");
  if (!p.q || !p.o || !p.k_codes || !p.k_scales || !p.k_mins || !p.v_codes || !p.v_scales ||
      !p.v_mins || !p.k_residual || !p.v_residual || !p.page_indptr || !p.page_indices ||
      !p.kv_lens)
    return set_why(why, "null pointer");
  if (!aligned16(p.k_codes) || !aligned16(p.v_codes) || !aligned16(p.k_scales) ||
      !aligned16(p.k_mins) || !aligned16(p.k_residual) || !aligned16(p.v_residual))
    return set_why(why, "code, key-metadata and residual pools must be 16-byte aligned");
  if ((static_cast<int64_t>(L.page_size) * L.head_dim * L.k_bits / 8) % 16 != 0)
    return set_why(why, "page_size * head_dim * bits / 8 must be a multiple of 16 bytes");
  return set_why(why, "");
}

bool kivi_decode_tc_supported(const KiviDecodeParams& p, std::string* why) {
  if (!kivi_decode_supported(p, why)) return false;
  if (p.layout.page_size % 16 != 0)
    return set_why(why, "the tensor-core kernel takes whole 16-token tiles: page_size " +
                            std::to_string(p.layout.page_size) + " is not a multiple of 16");
  if (p.layout.v_group_size % 16 != 0 || ps_shift_of(p.layout.v_group_size) < 0)
    return set_why(why, "the tensor-core kernel needs v_group_size a power of 2 >= 16 (got " +
                            std::to_string(p.layout.v_group_size) + ")");
  return set_why(why, "");
}

cudaError_t kivi_decode_cuda(const KiviDecodeParams& p, const DecodePlan& plan, void* workspace,
                             cudaStream_t stream, KiviDecodeKernel kernel) {
  if (!kivi_decode_supported(p, nullptr)) return cudaErrorInvalidValue;
  bool tensor_cores = false;
  if (kernel == KiviDecodeKernel::kTensorCores) {
    if (!kivi_decode_tc_supported(p, nullptr)) return cudaErrorInvalidValue;
    tensor_cores = true;
  } else if (kernel == KiviDecodeKernel::kAuto) {
    tensor_cores = kivi_decode_tc_supported(p, nullptr);
  }
  if (p.batch_size == 0) return cudaSuccess;
  const KiviLayout& L = p.layout;
  const int64_t rows = static_cast<int64_t>(p.batch_size) * p.num_qo_heads;
  if (plan.num_splits < 1 || plan.chunk < 1) return cudaErrorInvalidValue;
  if (plan.num_splits > 1 &&
      (plan.chunk % L.page_size != 0 || !workspace ||
       plan.workspace_bytes < split_workspace_bytes(rows, plan.num_splits, L.head_dim)))
    return cudaErrorInvalidValue;
  KiviArgs a;
  a.q = p.q;
  a.kc = p.k_codes;
  a.ks = p.k_scales;
  a.km = p.k_mins;
  a.vc = p.v_codes;
  a.vs = p.v_scales;
  a.vm = p.v_mins;
  a.kres = p.k_residual;
  a.vres = p.v_residual;
  a.page_indptr = p.page_indptr;
  a.page_indices = p.page_indices;
  a.kv_lens = p.kv_lens;
  a.hq = p.num_qo_heads;
  a.hkv = L.num_kv_heads;
  a.ps = L.page_size;
  a.R = L.residual_length;
  a.U = static_cast<int>(kivi_residual_capacity(L));
  a.vg = L.v_group_size;
  a.vg_shift = ps_shift_of(L.v_group_size);
  a.vgroups = L.head_dim / L.v_group_size;
  a.chunk = plan.num_splits > 1 ? plan.chunk : (1 << 30) / L.page_size * L.page_size;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.out = split_out(p.o, workspace, rows, plan.num_splits, L.head_dim);
  const dim3 grid(plan.num_splits, L.num_kv_heads, p.batch_size);
  const int group = p.num_qo_heads / L.num_kv_heads;
  cudaError_t err = cudaErrorInvalidValue;
  switch (L.k_bits) {
    case 2:
      err = launch_kivi_decode_b2(a, p.dtype, L.head_dim, group, grid, stream, tensor_cores);
      break;
    case 4:
      err = launch_kivi_decode_b4(a, p.dtype, L.head_dim, group, grid, stream, tensor_cores);
      break;
    case 8:
      err = launch_kivi_decode_b8(a, p.dtype, L.head_dim, group, grid, stream, tensor_cores);
      break;
  }
  KVB_CUDA_TRY(err);
  if (plan.num_splits > 1) {
    KVB_DISPATCH_DTYPE(p.dtype, T,
                       { KVB_CUDA_TRY(launch_split_merge<T>(a.out, rows, L.head_dim, stream)); });
  }
  return cudaSuccess;
}

}  // namespace kvb::kernels::cuda
