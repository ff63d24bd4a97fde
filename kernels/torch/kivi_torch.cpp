// LibTorch adapter of the KIVI store kernels: tensors in, the kernel for their device, tensors out
// (see kivi_torch.h).

#include "kernels/torch/kivi_torch.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "kernels/torch/adapter_util.h"

#if KVB_HAVE_CUDA
#include "kvb_cuda.cuh"
#endif

namespace kvb::kernels {

namespace {

// The rings hold fp16 or bf16 (the kernels' residual dtypes).
bool ring_kv_dtype(c10::ScalarType t, KvDtype* out) {
  return (t == at::kHalf || t == at::kBFloat16) && to_kv_dtype(t, out);
}

// Offsets of the concatenated device tables (KiviStepTables::upload's order).
struct DeviceTables {
  const int32_t* page_indptr;
  const int32_t* page_indices;
  const int32_t* kv_lens_before;
  const int32_t* kv_lens_after;
  const int32_t* new_indptr;
};

DeviceTables device_tables(const KiviStepTables& t, const c10::Device& dev) {
  check(t.device.defined() && t.device.device() == dev,
        "kivi kernels: the step tables were not uploaded to ", dev.str());
  const int32_t* p = t.device.data_ptr<int32_t>();
  DeviceTables d;
  d.page_indptr = p;
  p += t.page_indptr.size();
  d.page_indices = p;
  p += t.page_indices.size();
  d.kv_lens_before = p;
  p += t.kv_lens_before.size();
  d.kv_lens_after = p;
  p += t.kv_lens_after.size();
  d.new_indptr = p;
  return d;
}

void check_rings(const KiviLayout& l, const at::Tensor& k_ring, const at::Tensor& v_ring,
                 int64_t batch) {
  check(k_ring.dim() == 4 && k_ring.sizes() == v_ring.sizes() && k_ring.size(0) == batch &&
            k_ring.size(1) == kivi_residual_capacity(l) && k_ring.size(2) == l.num_kv_heads &&
            k_ring.size(3) == l.head_dim,
        "kivi kernels: rings must be [batch ", batch, ", U ", kivi_residual_capacity(l),
        ", kv_heads, head_dim] (got ", k_ring.sizes(), " and ", v_ring.sizes(), ")");
  check(k_ring.is_contiguous() && v_ring.is_contiguous() &&
            k_ring.scalar_type() == v_ring.scalar_type(),
        "kivi kernels: rings not contiguous or of different dtypes");
}

// Unpacks quantize.h's little-endian bit stream: codes [..., bytes] uint8 -> [..., bytes * 8/bits]
// int32 (code i in bits [(i % per) * bits, ...) of byte i / per).
at::Tensor unpack_codes(const at::Tensor& codes, int32_t bits) {
  const int64_t per = 8 / bits;
  at::Tensor shifts =
      at::arange(0, 8, bits, at::TensorOptions().dtype(at::kInt).device(codes.device()));
  at::Tensor c = codes.to(at::kInt).unsqueeze(-1);
  at::Tensor out = at::bitwise_and(at::bitwise_right_shift(c, shifts), (1 << bits) - 1);
  std::vector<int64_t> shape(codes.sizes().begin(), codes.sizes().end());
  shape.back() *= per;
  return out.reshape(shape);
}

at::Tensor fp16_bits_to_float(const at::Tensor& bits) {
  return bits.view(at::kHalf).to(at::kFloat);
}

}  // namespace

int64_t kivi_page_code_bytes(const KiviLayout& l) {
  return static_cast<int64_t>(l.num_kv_heads) * (kivi_k_page_bytes(l) + kivi_v_page_bytes(l));
}

int64_t kivi_page_meta_bytes(const KiviLayout& l) {
  // keys: scale + min per channel; values: scale + min per (row, group); fp16 each.
  return static_cast<int64_t>(l.num_kv_heads) *
         (2 * l.head_dim * 2 + 2 * l.page_size * kivi_v_groups_per_row(l) * 2);
}

KiviPools kivi_pools_empty(const KiviLayout& l, int64_t num_pages, const c10::Device& device) {
  const std::string why = kivi_layout_check(l);
  check(why.empty(), "kivi store: ", why);
  auto u8 = at::TensorOptions().dtype(at::kByte).device(device);
  auto i16 = at::TensorOptions().dtype(at::kShort).device(device);
  const int64_t H = l.num_kv_heads;
  KiviPools p;
  p.k_codes = at::zeros({num_pages, H, kivi_k_page_bytes(l)}, u8);
  p.k_scales = at::zeros({num_pages, H, l.head_dim}, i16);
  p.k_mins = at::zeros({num_pages, H, l.head_dim}, i16);
  p.v_codes = at::zeros({num_pages, H, kivi_v_page_bytes(l)}, u8);
  p.v_scales = at::zeros({num_pages, H, l.page_size, kivi_v_groups_per_row(l)}, i16);
  p.v_mins = at::zeros({num_pages, H, l.page_size, kivi_v_groups_per_row(l)}, i16);
  return p;
}

void KiviStepTables::upload(const c10::Device& dev) {
  if (host_kernels(dev)) {
    device = at::Tensor();
    return;
  }
  std::vector<int32_t> all;
  for (const auto* v : {&page_indptr, &page_indices, &kv_lens_before, &kv_lens_after, &new_indptr})
    all.insert(all.end(), v->begin(), v->end());
  device = at::tensor(all, at::kInt).to(dev);
}

std::string kivi_kernel_supported(const c10::Device& device, c10::ScalarType ring_dtype,
                                  const KiviLayout& l, int64_t num_qo_heads,
                                  KiviCudaKernel cuda_kernel) {
  KvDtype d;
  if (!ring_kv_dtype(ring_dtype, &d))
    return std::string("the residual must be fp16 or bf16 for the kernels (got ") +
           c10::toString(ring_dtype) + ")";
  if (auto e = kivi_layout_check(l); !e.empty()) return e;
  if (num_qo_heads < 1 || num_qo_heads % l.num_kv_heads != 0) return "query heads do not group";
  if (host_kernels(device)) return "";
  if (!cuda_kernels(device)) return "device " + device.str() + " has no kernel";
#if KVB_HAVE_CUDA
  if (l.head_dim != 64 && l.head_dim != 128)
    return "the CUDA kernels are compiled for head_dim 64 and 128 (this model: " +
           std::to_string(l.head_dim) + ")";
  if (l.k_bits != l.v_bits)
    return "the CUDA kernels are compiled for equal key/value bits (2,2), (4,4), (8,8)";
  if (num_qo_heads / l.num_kv_heads > 8) return "GQA group above the compiled 8";
  if ((static_cast<int64_t>(l.page_size) * l.head_dim * l.k_bits / 8) % 16 != 0)
    return "page_size * head_dim * bits / 8 must be a multiple of 16 bytes for the CUDA kernels";
  if (cuda_kernel == KiviCudaKernel::kTensorCores &&
      (l.page_size % 16 != 0 || l.v_group_size % 16 != 0 ||
       (l.v_group_size & (l.v_group_size - 1)) != 0))
    return "the tensor-core kernel needs page_size a multiple of 16 and v_group_size a power of 2 "
           ">= 16 (got " +
           std::to_string(l.page_size) + " and " + std::to_string(l.v_group_size) + ")";
  return "";
#else
  (void)cuda_kernel;
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
#endif
}

void kivi_append(const KiviLayout& l, KiviPools& pools, at::Tensor& k_ring, at::Tensor& v_ring,
                 const at::Tensor& k_new, const at::Tensor& v_new, const KiviStepTables& t) {
  const int64_t B = static_cast<int64_t>(t.kv_lens_before.size());
  check_rings(l, k_ring, v_ring, B);
  check(k_new.dim() == 3 && k_new.sizes() == v_new.sizes() && k_new.size(1) == l.num_kv_heads &&
            k_new.size(2) == l.head_dim && k_new.size(0) == t.new_indptr.back(),
        "kivi append: k_new / v_new must be [", t.new_indptr.back(), ", ", l.num_kv_heads, ", ",
        l.head_dim, "] (got ", k_new.sizes(), ")");
  check(k_new.scalar_type() == k_ring.scalar_type() && k_new.is_contiguous() &&
            v_new.is_contiguous() && v_new.scalar_type() == k_ring.scalar_type(),
        "kivi append: new rows must be contiguous and in the rings' dtype");
  KiviAppendParams p;
  ring_kv_dtype(k_ring.scalar_type(), &p.dtype);
  p.layout = l;
  p.k_new = k_new.data_ptr();
  p.v_new = v_new.data_ptr();
  p.k_codes = pools.k_codes.data_ptr<uint8_t>();
  p.k_scales = reinterpret_cast<uint16_t*>(pools.k_scales.data_ptr<int16_t>());
  p.k_mins = reinterpret_cast<uint16_t*>(pools.k_mins.data_ptr<int16_t>());
  p.v_codes = pools.v_codes.data_ptr<uint8_t>();
  p.v_scales = reinterpret_cast<uint16_t*>(pools.v_scales.data_ptr<int16_t>());
  p.v_mins = reinterpret_cast<uint16_t*>(pools.v_mins.data_ptr<int16_t>());
  p.k_residual = k_ring.data_ptr();
  p.v_residual = v_ring.data_ptr();
  p.batch_size = static_cast<int32_t>(B);
  // The host tables are always checked (the CUDA launcher cannot read device memory).
  p.new_indptr = t.new_indptr.data();
  p.kv_lens = t.kv_lens_before.data();
  p.page_indptr = t.page_indptr.data();
  p.page_indices = t.page_indices.data();
  const std::string why = kivi_append_check(p);
  check(why.empty(), "kivi append: ", why);
  if (host_kernels(k_ring.device())) {
    kivi_append_cpu(p);
    return;
  }
#if KVB_HAVE_CUDA
  const DeviceTables d = device_tables(t, k_ring.device());
  p.new_indptr = d.new_indptr;
  p.kv_lens = d.kv_lens_before;
  p.page_indptr = d.page_indptr;
  p.page_indices = d.page_indices;
  std::string reason;
  check(cuda::kivi_append_supported(p, &reason), "kivi append (CUDA): ", reason);
  const cudaError_t err = cuda::kivi_append_cuda(p, static_cast<cudaStream_t>(nullptr));
  check(err == cudaSuccess, "kivi append (CUDA): ", cudaGetErrorString(err));
#else
  KVB_UNREACHABLE("kernels/torch", "kivi append: the CUDA branch without CUDA kernels");
#endif
}

at::Tensor kivi_decode_attention(const at::Tensor& q, const KiviLayout& l, const KiviPools& pools,
                                 const at::Tensor& k_ring, const at::Tensor& v_ring,
                                 const KiviStepTables& t, float sm_scale,
                                 KiviCudaKernel cuda_kernel) {
  const int64_t B = static_cast<int64_t>(t.kv_lens_after.size());
  check_rings(l, k_ring, v_ring, B);
  check(q.dim() == 3 && q.size(0) == B && q.size(2) == l.head_dim, "kivi decode: q must be [", B,
        ", heads, ", l.head_dim, "] (got ", q.sizes(), ")");
  check(q.scalar_type() == k_ring.scalar_type() && q.device() == k_ring.device(),
        "kivi decode: q and the rings differ in dtype or device");
  const std::string why =
      kivi_kernel_supported(q.device(), q.scalar_type(), l, q.size(1), cuda_kernel);
  check(why.empty(), "kivi decode: ", why);
  at::Tensor qc = q.contiguous();
  at::Tensor o = at::empty_like(qc);
  KiviDecodeParams p;
  ring_kv_dtype(q.scalar_type(), &p.dtype);
  p.layout = l;
  p.q = qc.data_ptr();
  p.o = o.data_ptr();
  p.k_codes = pools.k_codes.data_ptr<uint8_t>();
  p.k_scales = reinterpret_cast<const uint16_t*>(pools.k_scales.data_ptr<int16_t>());
  p.k_mins = reinterpret_cast<const uint16_t*>(pools.k_mins.data_ptr<int16_t>());
  p.v_codes = pools.v_codes.data_ptr<uint8_t>();
  p.v_scales = reinterpret_cast<const uint16_t*>(pools.v_scales.data_ptr<int16_t>());
  p.v_mins = reinterpret_cast<const uint16_t*>(pools.v_mins.data_ptr<int16_t>());
  p.k_residual = k_ring.data_ptr();
  p.v_residual = v_ring.data_ptr();
  p.batch_size = static_cast<int32_t>(B);
  p.num_qo_heads = static_cast<int32_t>(q.size(1));
  p.sm_scale = sm_scale;
  int32_t max_len = 0;
  for (int32_t n : t.kv_lens_after) max_len = std::max(max_len, n);
  p.max_kv_len = max_len;
  p.page_indptr = t.page_indptr.data();
  p.page_indices = t.page_indices.data();
  p.kv_lens = t.kv_lens_after.data();
  const std::string bad = kivi_decode_check(p);
  check(bad.empty(), "kivi decode: ", bad);
  if (host_kernels(q.device())) {
    kivi_decode_cpu(p);
    return o;
  }
#if KVB_HAVE_CUDA
  const DeviceTables d = device_tables(t, q.device());
  p.page_indptr = d.page_indptr;
  p.page_indices = d.page_indices;
  p.kv_lens = d.kv_lens_after;
  std::string reason;
  check(cuda::kivi_decode_supported(p, &reason), "kivi decode (CUDA): ", reason);
  const cuda::DecodePlan plan = cuda::kivi_decode_plan(p);
  at::Tensor ws;
  if (plan.workspace_bytes > 0)
    ws = at::empty({static_cast<int64_t>(plan.workspace_bytes)},
                   at::TensorOptions().dtype(at::kByte).device(q.device()));
  const cuda::KiviDecodeKernel kernel =
      cuda_kernel == KiviCudaKernel::kTensorCores ? cuda::KiviDecodeKernel::kTensorCores
      : cuda_kernel == KiviCudaKernel::kAuto      ? cuda::KiviDecodeKernel::kAuto
                                                  : cuda::KiviDecodeKernel::kCudaCores;
  const cudaError_t err = cuda::kivi_decode_cuda(p, plan, ws.defined() ? ws.data_ptr() : nullptr,
                                                 static_cast<cudaStream_t>(nullptr), kernel);
  check(err == cudaSuccess, "kivi decode (CUDA): ", cudaGetErrorString(err));
  return o;
#else
  (void)cuda_kernel;
  KVB_UNREACHABLE("kernels/torch", "kivi decode: the CUDA branch without CUDA kernels");
#endif
}

std::pair<at::Tensor, at::Tensor> kivi_dequantize(const KiviLayout& l, const KiviPools& pools,
                                                  const at::Tensor& k_ring_row,
                                                  const at::Tensor& v_ring_row,
                                                  const std::vector<int32_t>& pages, int64_t n) {
  const int64_t H = l.num_kv_heads, D = l.head_dim, P = l.page_size;
  const int64_t U = kivi_residual_capacity(l);
  const int64_t kq = kivi_k_quant_len(l, n), vq = kivi_v_quant_len(l, n);
  check(static_cast<int64_t>(pages.size()) >= kivi_pages_needed(l, n),
        "kivi dequantize: ", pages.size(), " pages for ", n, " tokens (", kivi_pages_needed(l, n),
        " needed)");
  const c10::Device dev = pools.k_codes.device();
  auto idx = [&](int64_t count) {
    std::vector<int64_t> ids(pages.begin(), pages.begin() + count);
    return at::tensor(ids, at::kLong).to(dev);
  };
  auto ring_rows = [&](const at::Tensor& ring, int64_t from) {
    std::vector<int64_t> slots;
    for (int64_t j = from; j < n; ++j) slots.push_back(j % U);
    return ring.index_select(0, at::tensor(slots, at::kLong).to(dev)).to(at::kFloat);
  };
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(dev);
  at::Tensor K = at::empty({0, H, D}, fopts), V = at::empty({0, H, D}, fopts);
  if (kq > 0) {
    const at::Tensor ids = idx(kq / P);
    // [pages, H, P*D] codes -> [pages, H, P, D]; per-channel (scale, min): [pages, H, 1, D].
    at::Tensor c = unpack_codes(pools.k_codes.index_select(0, ids), l.k_bits)
                       .reshape({-1, H, P, D})
                       .to(at::kFloat);
    at::Tensor s = fp16_bits_to_float(pools.k_scales.index_select(0, ids)).unsqueeze(2);
    at::Tensor m = fp16_bits_to_float(pools.k_mins.index_select(0, ids)).unsqueeze(2);
    K = (c * s + m).permute({0, 2, 1, 3}).reshape({kq, H, D});
  }
  if (vq > 0) {
    const int64_t np = (vq + P - 1) / P, vg = l.v_group_size;
    const at::Tensor ids = idx(np);
    at::Tensor c = unpack_codes(pools.v_codes.index_select(0, ids), l.v_bits)
                       .reshape({-1, H, P, D})
                       .to(at::kFloat);
    // per-row groups of vg channels: [pages, H, P, D/vg] -> [pages, H, P, D]
    at::Tensor s =
        fp16_bits_to_float(pools.v_scales.index_select(0, ids)).repeat_interleave(vg, -1);
    at::Tensor m = fp16_bits_to_float(pools.v_mins.index_select(0, ids)).repeat_interleave(vg, -1);
    V = (c * s + m).permute({0, 2, 1, 3}).reshape({np * P, H, D}).narrow(0, 0, vq);
  }
  if (kq < n) K = at::cat({K, ring_rows(k_ring_row, kq)});
  if (vq < n) V = at::cat({V, ring_rows(v_ring_row, vq)});
  return {K, V};
}

}  // namespace kvb::kernels
