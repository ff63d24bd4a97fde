// pertoken: per-token asymmetric group quantization of both keys and values (KVTuner's
// "per-token-asym" mode: group = head_dim, no residual), the per-token baseline next to KIVI.
// Physical storage: packed codes + fp16 scale/min per group (methods/common/kv_codec.h).

#include "harness/common/error.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "methods/common/kv_codec.h"
#include "methods/common/method_listing.h"

namespace kvb {
namespace {

MethodInfo pertoken_info() {
  MethodInfo m = method_listing(
      "pertoken",
      "per-token asymmetric b-bit group quantization of K and V (fp16 scale/min per group)",
      "per-token-asym mode of KVTuner (Li et al., ICML 2025, arXiv 2502.04420); a common baseline",
      {int_param("k_bits", 4, 2, 8, "key bits: 2, 3, 4 or 8"),
       int_param("v_bits", 4, 2, 8, "value bits: 2, 3, 4 or 8"),
       int_param("group_size", 0, 0, 4096,
                 "channels per group; 0 = head_dim (one group per head and token); reduced to "
                 "the largest divisor of head_dim <= group_size"),
       int_param("residual_length", 0, 0, 1 << 20,
                 "newest tokens kept at full precision (a sliding window; 0 = none)"),
       string_param("residual_dtype", "fp16", {"fp16", "bf16", "fp32"},
                    "storage of the full-precision residual")});
  m.caps.quantizes = true;
  return m;
}

std::unique_ptr<KvCache> make_pertoken(const CacheContext& ctx, const nlohmann::json& p) {
  const int32_t kb = p["k_bits"].get<int32_t>(), vb = p["v_bits"].get<int32_t>();
  for (auto [name, bits] : {std::pair<const char*, int32_t>{"k_bits", kb}, {"v_bits", vb}})
    KVB_CHECK(kernels::quant_bits_supported(bits), "method pertoken.", name, ": ", bits,
              " is not a supported width (allowed: 2, 3, 4, 8)");
  const int64_t hd = ctx.config.head_dim;
  const int64_t req = p["group_size"].get<int64_t>();
  const int64_t G = adapt_channel_group(req == 0 ? hd : req, hd);
  const int64_t R = p["residual_length"].get<int64_t>();
  const RowDtype rd = parse_row_dtype(p["residual_dtype"]);
  auto codec = std::make_shared<QuantCodec>(
      "pertoken-k" + std::to_string(kb) + "v" + std::to_string(vb) + "-g" + std::to_string(G),
      QuantCodec::per_token(kb, G, R, rd), QuantCodec::per_token(vb, G, R, rd));
  return std::make_unique<CodecKvCache>(ctx, codec, "pertoken");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(pertoken, kvb::pertoken_info, kvb::make_pertoken);
