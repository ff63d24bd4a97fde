// kivi: KIVI (Liu et al., ICML 2024): keys quantized per channel in groups of G tokens, values per
// token in groups of G channels, asymmetric b-bit with fp16 scale and min, and a full-precision
// residual of the R most recent tokens (keys: chunked, quantized R at a time; values: a sliding
// window). Only completed groups are quantized, never the whole cache again. Physical storage:
// packed codes + metadata + residual (methods/common/kv_codec.h) in a keep-everything store
// (codec_kv_cache.h), or the paged KIVI layout read and written by the kernels
// (kivi_kernel_kv_cache.h): `store`.

#include "harness/common/error.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "methods/common/cuda_decode_param.h"
#include "methods/common/kv_codec.h"
#include "methods/common/method_listing.h"
#include "methods/kivi/kivi_kernel_kv_cache.h"

namespace kvb {
namespace {

// The codec store keeps its rows on the host; the CUDA decode kernels belong to the kernel store on
// a CUDA device.
std::string kivi_target_check(const nlohmann::json& p, const RunTarget& t) {
  const std::string store = p.at("store"), cuda_decode = p.at("cuda_decode");
  const bool kernel_store = store == "kernel" || (store == "auto" && t.device.is_cuda());
  if (!kernel_store && !t.device.is_cpu())
    return "store=codec keeps its rows on the host and runs on the CPU only (device " +
           t.device.str() + " requested; use store=kernel or auto)";
  if (cuda_decode != "cuda_cores" && !(kernel_store && t.device.is_cuda()))
    return "cuda_decode=" + cuda_decode + ": chooses the CUDA decode kernel of the kernel store; " +
           "this run has " + (kernel_store ? "the kernel store" : "the codec store") + " on " +
           t.device.str() + " (leave cuda_decode at cuda_cores)";
  return "";
}

MethodInfo kivi_info() {
  MethodInfo m = method_listing(
      "kivi",
      "KIVI: per-channel keys / per-token values, asymmetric 2-8 bit groups, full-precision "
      "residual",
      "Liu et al., KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache, ICML 2024 (arXiv "
      "2402.02750)",
      {string_param(
           "preset", "none", {"none", "kivi-2", "kivi-4"},
           "official settings (G=32, R=128; 2 or 4 bits for K and V); leave k_bits, v_bits, "
           "group_size, residual_length at their defaults when using one"),
       int_param("k_bits", 2, 2, 8, "key bits: 2, 3, 4 or 8"),
       int_param("v_bits", 2, 2, 8, "value bits: 2, 3, 4 or 8"),
       int_param("group_size", 32, 1, 4096,
                 "G: tokens per key group (per channel); channels per value group, reduced to the "
                 "largest divisor of head_dim <= G (groups never straddle heads)"),
       int_param(
           "residual_length", 128, 0, 1 << 20,
           "R: most recent tokens kept at full precision (a multiple of G for per-channel keys)"),
       string_param("key_mode", "per_channel", {"per_channel", "per_token"},
                    "per_channel: KIVI keys; per_token: keys like values (the ablation)"),
       string_param("residual_dtype", "fp16", {"fp16", "bf16", "fp32"},
                    "storage of the full-precision residual (KIVI: fp16)"),
       string_param(
           "store", "auto", {"auto", "codec", "kernel"},
           "codec: the CPU codec store (decodes to fp32, exact attention: the accuracy "
           "reference); kernel: the paged KIVI layout with the fused dequantize-attention decode "
           "kernel (CPU or CUDA; 2/4/8 bits, per-channel keys, fp16/bf16 residual); auto: kernel "
           "on CUDA, codec elsewhere"),
       cuda_decode_param<kernels::KiviCudaKernel>(
           "the kernel store's CUDA decode kernel: cuda_cores (codes dequantized on CUDA "
           "cores), tensor_cores (whole quantized pages on tensor cores; group_size and "
           "value groups multiples of 16), auto (tensor cores where the layout allows); "
           "CUDA only")});
  m.caps.quantizes = true;
  m.target_check = kivi_target_check;
  return m;
}

std::unique_ptr<KvCache> make_kivi(const CacheContext& ctx, const nlohmann::json& p) {
  int32_t kb = p["k_bits"].get<int32_t>(), vb = p["v_bits"].get<int32_t>();
  int64_t G = p["group_size"].get<int64_t>(), R = p["residual_length"].get<int64_t>();
  const std::string preset = p["preset"];
  if (preset != "none") {
    KVB_CHECK(kb == 2 && vb == 2 && G == 32 && R == 128, "method kivi: preset '", preset,
              "' sets k_bits, v_bits, group_size and residual_length; leave them at their defaults "
              "(got k_bits ",
              kb, ", v_bits ", vb, ", group_size ", G, ", residual_length ", R, ")");
    kb = vb = preset == "kivi-4" ? 4 : 2;
  }
  for (auto [name, bits] : {std::pair<const char*, int32_t>{"k_bits", kb}, {"v_bits", vb}})
    KVB_CHECK(kernels::quant_bits_supported(bits), "method kivi.", name, ": ", bits,
              " is not a supported width (allowed: 2, 3, 4, 8)");
  const bool per_channel = p["key_mode"] == "per_channel";
  if (per_channel)
    KVB_CHECK(R % G == 0, "method kivi.residual_length: ", R, " is not a multiple of group_size ",
              G, " (keys are quantized per channel when the residual fills)");
  const RowDtype rd = parse_row_dtype(p["residual_dtype"]);
  const int64_t hd = ctx.config.head_dim;
  const int64_t channel_group = adapt_channel_group(G, hd);
  QuantSpec ks = per_channel ? QuantCodec::kivi_key(kb, G, R, rd)
                             : QuantCodec::per_token(kb, channel_group, R, rd);
  QuantSpec vs = QuantCodec::kivi_value(vb, channel_group, R, rd);
  const std::string name = "kivi-k" + std::to_string(kb) + "v" + std::to_string(vb) + "-g" +
                           std::to_string(G) + "-r" + std::to_string(R);
  const std::string store = p["store"];
  const bool kernel_store = store == "kernel" || (store == "auto" && ctx.device.is_cuda());
  if (kernel_store) {
    KVB_CHECK(per_channel, "method kivi.store=", store,
              ": key_mode per_token has no kernel (the KIVI layout keeps keys per channel); use "
              "store=codec on the CPU");
    KVB_CHECK(rd != RowDtype::kF32, "method kivi.store=", store,
              ": the kernels keep the residual in fp16 or bf16 (residual_dtype fp32 requested)");
    kernels::KiviLayout L;
    L.num_kv_heads = static_cast<int32_t>(ctx.config.n_kv_heads);
    L.head_dim = static_cast<int32_t>(hd);
    L.page_size = static_cast<int32_t>(G);
    L.k_bits = kb;
    L.v_bits = vb;
    L.v_group_size = static_cast<int32_t>(channel_group);
    L.residual_length = static_cast<int32_t>(R);
    const std::string why = kernels::kivi_layout_check(L);
    KVB_CHECK(why.empty(), "method kivi.store=", store, ": the KIVI kernel layout refuses k_bits ",
              kb, ", v_bits ", vb, ", group_size ", G, ", residual_length ", R, " on head_dim ", hd,
              ": ", why);
    return std::make_unique<KiviKernelKvCache>(
        ctx, L, rd == RowDtype::kBF16 ? c10::kBFloat16 : c10::kHalf, "kivi",
        std::map<std::string, double>{{"group_size_requested", static_cast<double>(G)},
                                      {"channel_group_adapted", channel_group != G ? 1.0 : 0.0}},
        parse_cuda_decode<kernels::KiviCudaKernel>(p));
  }
  auto codec = std::make_shared<QuantCodec>(name, ks, vs);
  return std::make_unique<CodecKvCache>(
      ctx, codec, "kivi",
      std::map<std::string, double>{{"group_size_requested", static_cast<double>(G)},
                                    {"channel_group_adapted", channel_group != G ? 1.0 : 0.0}});
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kivi, kvb::kivi_info, kvb::make_kivi);
