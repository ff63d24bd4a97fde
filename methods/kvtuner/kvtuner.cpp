// kvtuner: KVTuner's online cache (Li et al., ICML 2025): every layer quantizes its K and V with
// its own bit pair (bK, bV) from a precision config, in KVTuner's KIVI mode (per-channel keys,
// per-token values, G = 32, residual 32) or its per-token mode (group = head_dim, no residual). The
// config comes inline (`pairs`, covered by the run's config hash) or from a JSON file (`config`):
// a plain config or the artifact of the offline search (kvtuner_search.h, `kvbench
// kvtuner-search`). Physical storage: the shared codec layer (methods/common/kv_codec.h); only
// completed groups are quantized, never the whole cache again (KVTuner's released cache
// re-quantizes; see README.md).

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "methods/common/kv_codec.h"
#include "methods/common/method_listing.h"

namespace kvb {
namespace {

MethodInfo kvtuner_info() {
  MethodInfo m = method_listing(
      "kvtuner",
      "KVTuner: per-layer (K bits, V bits) pairs from a precision config, KIVI or per-token layout",
      "Li et al., KVTuner: Sensitivity-Aware Layer-wise Mixed Precision KV Cache Quantization, "
      "ICML 2025 (arXiv 2502.04420)",
      {string_param(
           "pairs", "KV4", {},
           "per-layer pairs in KVTuner's notation, comma-separated, one per layer (KV8, K8V4, "
           "K4V2, ...); a single pair applies to every layer"),
       string_param("config", "", {},
                    "JSON precision file instead of `pairs`: {\"<layer>\": {\"nbits_key\": b, "
                    "\"nbits_value\": b}, ...} (KVTuner's YAML as JSON), [[bK, bV], ...], or a "
                    "kvtuner-search artifact (its \"layers\")"),
       string_param("mode", "kivi", {"kivi", "per_token"},
                    "kivi: per-channel K, per-token V, G=32, R=32; per_token: K and V per token, "
                    "group = head_dim, R=0 (KVTuner's two modes)"),
       int_param("group_size", -1, -1, 4096, "-1: the mode's (kivi 32, per_token head_dim)"),
       int_param("residual_length", -1, -1, 1 << 20, "-1: the mode's (kivi 32, per_token 0)"),
       string_param("residual_dtype", "fp16", {"fp16", "bf16", "fp32"},
                    "storage of the full-precision residual")});
  m.caps.quantizes = true;
  return m;
}

int32_t parse_bits(const std::string& s, const std::string& pair) {
  KVB_CHECK(!s.empty() && s.size() <= 2 && std::isdigit(static_cast<unsigned char>(s[0])) &&
                std::isdigit(static_cast<unsigned char>(s.back())),
            "method kvtuner.pairs: '", pair, "' is not a pair (write KV8, K8V4, K4V2, ...)");
  const int32_t b = std::atoi(s.c_str());
  KVB_CHECK(kernels::quant_bits_supported(b), "method kvtuner.pairs: '", pair, "': ", b,
            " bits not supported (allowed: 2, 3, 4, 8)");
  return b;
}

// "KV8" -> (8, 8); "K8V4" -> (8, 4).
std::pair<int32_t, int32_t> parse_pair(std::string p) {
  while (!p.empty() && std::isspace(static_cast<unsigned char>(p.back()))) p.pop_back();
  while (!p.empty() && std::isspace(static_cast<unsigned char>(p.front()))) p.erase(p.begin());
  if (p.rfind("KV", 0) == 0) {
    const int32_t b = parse_bits(p.substr(2), p);
    return {b, b};
  }
  const size_t v = p.find('V');
  KVB_CHECK(p.size() >= 4 && p[0] == 'K' && v != std::string::npos && v > 1,
            "method kvtuner.pairs: '", p, "' is not a pair (write KV8, K8V4, K4V2, ...)");
  return {parse_bits(p.substr(1, v - 1), p), parse_bits(p.substr(v + 1), p)};
}

std::vector<std::pair<int32_t, int32_t>> pairs_from_json(const nlohmann::json& j, int64_t n_layers,
                                                         const std::string& where) {
  // A kvtuner-search artifact (kvtuner_search.h): its "layers" member is the config, the rest
  // (Pareto set, profile, settings) is ignored here.
  if (j.is_object() && j.contains("layers")) return pairs_from_json(j["layers"], n_layers, where);
  std::vector<std::pair<int32_t, int32_t>> out(static_cast<size_t>(n_layers), {0, 0});
  auto bits = [&](const nlohmann::json& v, const std::string& what) {
    KVB_CHECK(v.is_number_integer() && kernels::quant_bits_supported(v.get<int32_t>()), where, ": ",
              what, " = ", v.dump(), " is not a supported width (2, 3, 4, 8)");
    return v.get<int32_t>();
  };
  if (j.is_array()) {
    KVB_CHECK(static_cast<int64_t>(j.size()) == n_layers, where, ": ", j.size(),
              " pairs for a model of ", n_layers, " layers");
    for (size_t l = 0; l < j.size(); ++l) {
      KVB_CHECK(j[l].is_array() && j[l].size() == 2, where, ": entry ", l, " is not [bK, bV]");
      out[l] = {bits(j[l][0], "layer " + std::to_string(l) + " key"),
                bits(j[l][1], "layer " + std::to_string(l) + " value")};
    }
    return out;
  }
  KVB_CHECK(j.is_object(), where, ": expected an object {\"<layer>\": {...}} or an array of pairs");
  for (auto it = j.begin(); it != j.end(); ++it) {
    char* end = nullptr;
    const long l = std::strtol(it.key().c_str(), &end, 10);
    KVB_CHECK(end && *end == '\0' && !it.key().empty() && l >= 0 && l < n_layers, where, ": key '",
              it.key(), "' is not a layer index in [0, ", n_layers, ")");
    const auto& e = it.value();
    KVB_CHECK(e.is_object() && e.contains("nbits_key") && e.contains("nbits_value"), where,
              ": layer ", l, " needs nbits_key and nbits_value");
    out[l] = {bits(e["nbits_key"], "layer " + it.key() + " nbits_key"),
              bits(e["nbits_value"], "layer " + it.key() + " nbits_value")};
  }
  for (int64_t l = 0; l < n_layers; ++l)
    KVB_CHECK(out[l].first != 0, where, ": layer ", l, " is missing (the model has ", n_layers,
              " layers)");
  return out;
}

std::unique_ptr<KvCache> make_kvtuner(const CacheContext& ctx, const nlohmann::json& p) {
  const int64_t L = ctx.config.n_layers, hd = ctx.config.head_dim;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::map<std::string, double> extra;
  const std::string path = p["config"];
  if (!path.empty()) {
    const std::string where = "method kvtuner.config " + path;
    KVB_CHECK(file_exists(path), where, ": file not found");
    const std::string text = read_text_file(path);
    const nlohmann::json j = parse_json(text, where);
    pairs = pairs_from_json(j, L, where);
    // The file is not part of the config hash: record which content ran (first 48 bits of sha256).
    extra["config_sha256_48"] =
        static_cast<double>(std::strtoull(sha256_hex(text).substr(0, 12).c_str(), nullptr, 16));
  } else {
    std::stringstream ss(p["pairs"].get<std::string>());
    std::string item;
    while (std::getline(ss, item, ',')) pairs.push_back(parse_pair(item));
    KVB_CHECK(!pairs.empty(), "method kvtuner.pairs: empty");
    if (pairs.size() == 1) pairs.assign(static_cast<size_t>(L), pairs[0]);
    KVB_CHECK(static_cast<int64_t>(pairs.size()) == L, "method kvtuner.pairs: ", pairs.size(),
              " pairs for a model of ", L, " layers (give one per layer, or one for all)");
  }
  const bool kivi = p["mode"] == "kivi";
  int64_t G = p["group_size"].get<int64_t>(), R = p["residual_length"].get<int64_t>();
  if (G < 0) G = kivi ? 32 : hd;
  if (R < 0) R = kivi ? 32 : 0;
  KVB_CHECK(G >= 1, "method kvtuner.group_size: ", G, " must be >= 1 (or -1 for the mode's)");
  if (kivi)
    KVB_CHECK(R % G == 0, "method kvtuner.residual_length: ", R,
              " is not a multiple of group_size ", G,
              " (keys are quantized per channel when the residual fills)");
  const RowDtype rd = parse_row_dtype(p["residual_dtype"]);
  const int64_t cg = adapt_channel_group(G, hd);
  auto spec_k = [&](int32_t b) {
    return kivi ? QuantCodec::kivi_key(b, G, R, rd) : QuantCodec::per_token(b, cg, R, rd);
  };
  auto spec_v = [&](int32_t b) {
    return kivi ? QuantCodec::kivi_value(b, cg, R, rd) : QuantCodec::per_token(b, cg, R, rd);
  };
  auto codec = std::make_shared<QuantCodec>("kvtuner-" + p["mode"].get<std::string>(),
                                            spec_k(pairs[0].first), spec_v(pairs[0].second));
  double eq_bits = 0;
  for (int64_t l = 0; l < L; ++l) {
    codec->set_layer(static_cast<int>(l), spec_k(pairs[l].first), spec_v(pairs[l].second));
    eq_bits += 0.5 * (pairs[l].first + pairs[l].second);
  }
  // KVTuner's own figure: mean over layers of (bK + bV) / 2, without scales, mins or residual.
  extra["equivalent_bits"] = eq_bits / static_cast<double>(L);
  extra["group_size_requested"] = static_cast<double>(G);
  return std::make_unique<CodecKvCache>(ctx, codec, "kvtuner", extra);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kvtuner, kvb::kvtuner_info, kvb::make_kvtuner);
