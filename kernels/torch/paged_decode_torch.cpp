// LibTorch adapter of the paged decode-attention kernels: tensors in, the kernel for their device,
// tensors out (see paged_decode_torch.h).

#include "kernels/torch/paged_decode_torch.h"

#include <ATen/ATen.h>

#include "kernels/torch/adapter_util.h"
#include "kvb/kernels/decode_attention.h"

#if KVB_HAVE_CUDA
#include "kvb_cuda.cuh"
#endif

namespace kvb::kernels {

void PagedDecodeTables::upload(const c10::Device& dev) {
  if (host_kernels(dev)) {
    device = at::Tensor();
    return;
  }
  std::vector<int32_t> all;
  all.reserve(page_indptr.size() + page_indices.size() + kv_lens.size());
  all.insert(all.end(), page_indptr.begin(), page_indptr.end());
  all.insert(all.end(), page_indices.begin(), page_indices.end());
  all.insert(all.end(), kv_lens.begin(), kv_lens.end());
  device = at::tensor(all, at::kInt).to(dev);
}

std::string paged_decode_supported(const c10::Device& device, c10::ScalarType dtype,
                                   int64_t head_dim, int64_t num_qo_heads, int64_t num_kv_heads) {
  KvDtype d;
  if (!to_kv_dtype(dtype, &d))
    return std::string("dtype ") + c10::toString(dtype) + " has no kernel";
  if (num_kv_heads < 1 || num_qo_heads % num_kv_heads != 0) return "query heads do not group";
  if (host_kernels(device)) return "";
  if (!cuda_kernels(device)) return "device " + device.str() + " has no kernel";
#if KVB_HAVE_CUDA
  if (d == KvDtype::kF32) return "the CUDA kernel takes fp16 or bf16 only";
  if (head_dim != 64 && head_dim != 128)
    return "the CUDA kernel is compiled for head_dim 64 and 128 (this model: " +
           std::to_string(head_dim) + ")";
  const int64_t group = num_qo_heads / num_kv_heads;
  if (group > 8) return "GQA group " + std::to_string(group) + " is over the compiled 8";
  return "";
#else
  (void)head_dim;
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
#endif
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                  const at::Tensor& v_pool, const PagedDecodeTables& tables,
                                  float sm_scale, PagedCudaKernel cuda_kernel) {
  check(q.dim() == 3 && k_pool.dim() == 4 && v_pool.sizes() == k_pool.sizes(),
        "paged decode: q must be [batch, heads, head_dim] and the pools [pages, page_size, "
        "kv_heads, head_dim] (got ",
        q.sizes(), " and ", k_pool.sizes(), ")");
  check(q.scalar_type() == k_pool.scalar_type() && q.device() == k_pool.device(),
        "paged decode: q and the pools differ in dtype or device");
  check(k_pool.is_contiguous() && v_pool.is_contiguous(), "paged decode: pools not contiguous");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(2);
  check(k_pool.size(3) == D, "paged decode: head_dim ", D, " vs pools' ", k_pool.size(3));
  check(static_cast<int64_t>(tables.page_indptr.size()) == B + 1 &&
            static_cast<int64_t>(tables.kv_lens.size()) == B,
        "paged decode: page tables for ", tables.kv_lens.size(), " sequences, batch ", B);
  const std::string why = paged_decode_supported(q.device(), q.scalar_type(), D, Hq, Hkv);
  check(why.empty(), "paged decode: ", why);
  at::Tensor qc = q.contiguous();
  at::Tensor o = at::empty_like(qc);
  DecodeAttentionParams p;
  to_kv_dtype(q.scalar_type(), &p.dtype);
  p.q = qc.data_ptr();
  p.o = o.data_ptr();
  p.k_pages = k_pool.data_ptr();
  p.v_pages = v_pool.data_ptr();
  p.batch_size = static_cast<int32_t>(B);
  p.num_qo_heads = static_cast<int32_t>(Hq);
  p.num_kv_heads = static_cast<int32_t>(Hkv);
  p.head_dim = static_cast<int32_t>(D);
  p.page_size = static_cast<int32_t>(k_pool.size(1));
  p.sm_scale = sm_scale;
  int32_t max_len = 0;
  for (int32_t n : tables.kv_lens) max_len = std::max(max_len, n);
  p.max_scan_len = max_len;
  if (host_kernels(q.device())) {
    p.page_indptr = tables.page_indptr.data();
    p.page_indices = tables.page_indices.data();
    p.kv_lens = tables.kv_lens.data();
    decode_attention_cpu(p);
    return o;
  }
#if KVB_HAVE_CUDA
  check(tables.device.defined() && tables.device.device() == q.device(),
        "paged decode: the page tables were not uploaded to ", q.device().str());
  const int32_t* t = tables.device.data_ptr<int32_t>();
  p.page_indptr = t;
  p.page_indices = t + tables.page_indptr.size();
  p.kv_lens = t + tables.page_indptr.size() + tables.page_indices.size();
  std::string reason;
  check(cuda::decode_attention_supported(p, &reason), "paged decode (CUDA): ", reason);
  const cuda::DecodePlan plan = cuda::decode_attention_plan(p);
  at::Tensor ws;
  if (plan.workspace_bytes > 0)
    ws = at::empty({static_cast<int64_t>(plan.workspace_bytes)},
                   at::TensorOptions().dtype(at::kByte).device(q.device()));
  // The legacy default stream: LibTorch's current stream unless a caller set another.
  const cuda::DecodeKernel kernel =
      cuda_kernel == PagedCudaKernel::kTensorCores ? cuda::DecodeKernel::kTensorCores
      : cuda_kernel == PagedCudaKernel::kAuto      ? cuda::DecodeKernel::kAuto
                                                   : cuda::DecodeKernel::kCudaCores;
  const cudaError_t err = cuda::decode_attention_cuda(
      p, plan, ws.defined() ? ws.data_ptr() : nullptr, static_cast<cudaStream_t>(nullptr), kernel);
  check(err == cudaSuccess, "paged decode (CUDA): ", cudaGetErrorString(err));
  return o;
#else
  (void)cuda_kernel;
  KVB_UNREACHABLE("kernels/torch", "paged decode: the CUDA branch without CUDA kernels");
#endif
}

}  // namespace kvb::kernels
