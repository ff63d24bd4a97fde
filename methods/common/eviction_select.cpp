#include "methods/common/eviction_select.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "harness/common/enum_names.h"
#include "harness/common/error.h"

namespace kvb {

std::vector<int64_t> top_k_slots(const float* score, const std::vector<int64_t>& candidates,
                                 int64_t k) {
  if (k <= 0) return {};
  std::vector<int64_t> c = candidates;
  if (k < static_cast<int64_t>(c.size())) {
    auto better = [score](int64_t a, int64_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    };
    std::nth_element(c.begin(), c.begin() + k, c.end(), better);
    c.resize(static_cast<size_t>(k));
  }
  std::sort(c.begin(), c.end());
  return c;
}

std::vector<int64_t> merge_slots(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  const size_t mid = a.size();
  a.insert(a.end(), b.begin(), b.end());
  std::inplace_merge(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(mid), a.end());
  return a;
}

namespace {
const EnumName<Pooling> kPoolings[] = {
    {Pooling::kNone, "none"}, {Pooling::kAvg, "avg"}, {Pooling::kMax, "max"}};
}  // namespace

const char* pooling_name(Pooling p) { return enum_name(kPoolings, p); }

const char* gqa_agg_name(GqaAgg a) { return enum_name(kGqaAggs, a); }

std::vector<float> pool1d(const float* x, int64_t n, int64_t kernel, Pooling p) {
  std::vector<float> out(x, x + n);
  if (p == Pooling::kNone || kernel <= 1 || n == 0) return out;
  const int64_t r = kernel / 2;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - r), hi = std::min<int64_t>(n - 1, j + r);
    if (p == Pooling::kAvg) {
      double s = 0;
      for (int64_t t = lo; t <= hi; ++t) s += x[t];
      out[j] = static_cast<float>(s / static_cast<double>(kernel));
    } else {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t t = lo; t <= hi; ++t) m = std::max(m, x[t]);
      out[j] = m;
    }
  }
  return out;
}

SnapScores snap_scores(const LayerView& layer, const HeadView& head, Pooling pooling,
                       int64_t kernel, GqaAgg agg) {
  KVB_CHECK(head.window != nullptr, "snap_scores: the store gave no observation-window scores");
  SnapScores s;
  const int64_t first_window_idx = layer.seen - layer.window;
  for (int64_t j = 0; j < head.len; ++j)
    (head.idx[j] >= first_window_idx ? s.window : s.prefix).push_back(j);
  s.score.assign(static_cast<size_t>(head.len), 0.f);
  // Prefix entries are the leading slots (storage is in token order).
  const int64_t P = static_cast<int64_t>(s.prefix.size());
  if (P == 0) return s;
  for (int64_t g = 0; g < layer.group; ++g) {
    std::vector<float> pooled = pool1d(head.window + g * head.len, P, kernel, pooling);
    for (int64_t j = 0; j < P; ++j) {
      if (agg == GqaAgg::kMax)
        s.score[j] = g == 0 ? pooled[j] : std::max(s.score[j], pooled[j]);
      else
        s.score[j] += pooled[j] / static_cast<float>(layer.group);
    }
  }
  return s;
}

std::vector<int64_t> snap_keep(const SnapScores& s, int64_t budget) {
  const int64_t nw = static_cast<int64_t>(s.window.size());
  const int64_t keep_w = std::min(nw, std::max<int64_t>(0, budget));
  std::vector<int64_t> win(s.window.end() - keep_w, s.window.end());
  std::vector<int64_t> pre = top_k_slots(s.score.data(), s.prefix, budget - keep_w);
  return merge_slots(std::move(pre), win);
}

int64_t pyramid_layer_budget(int64_t avg, int64_t w, int64_t n, double beta, int layer,
                             int n_layers) {
  const int64_t prefix = avg - w;
  if (prefix <= 0 || n_layers <= 1) return avg;
  int64_t min_num = static_cast<int64_t>(std::floor(static_cast<double>(prefix) / beta));
  int64_t max_num = 2 * prefix - min_num;
  if (max_num >= n - w) {
    max_num = n - w;
    min_num = 2 * prefix - max_num;
  }
  if (min_num < 0 || max_num < min_num) return avg;
  const int64_t steps = (max_num - min_num) / (n_layers - 1);
  return w + max_num - static_cast<int64_t>(layer) * steps;
}

std::vector<int64_t> adaptive_head_budgets(const std::vector<std::vector<float>>& scores,
                                           int64_t total, double alpha) {
  const int64_t H = static_cast<int64_t>(scores.size());
  std::vector<int64_t> caps(H), out(H, 0);
  int64_t cap_sum = 0;
  for (int64_t h = 0; h < H; ++h) cap_sum += caps[h] = static_cast<int64_t>(scores[h].size());
  total = std::max<int64_t>(0, std::min(total, cap_sum));
  if (H == 0 || total == 0) return out;
  // Global top `total` over all heads: (score desc, head asc, position asc).
  std::vector<std::pair<int64_t, int64_t>> all;
  all.reserve(static_cast<size_t>(cap_sum));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < caps[h]; ++j) all.emplace_back(h, j);
  auto better = [&](const std::pair<int64_t, int64_t>& a, const std::pair<int64_t, int64_t>& b) {
    const float sa = scores[a.first][a.second], sb = scores[b.first][b.second];
    if (sa != sb) return sa > sb;
    return a < b;
  };
  std::nth_element(all.begin(), all.begin() + (total - 1), all.end(), better);
  std::vector<int64_t> n_sel(H, 0);
  for (int64_t i = 0; i < total; ++i) n_sel[all[i].first]++;
  std::vector<double> quota(H);
  const double floor_share = alpha * static_cast<double>(total) / static_cast<double>(H);
  for (int64_t h = 0; h < H; ++h)
    quota[h] = std::min<double>(static_cast<double>(caps[h]),
                                floor_share + (1.0 - alpha) * static_cast<double>(n_sel[h]));
  int64_t given = 0;
  for (int64_t h = 0; h < H; ++h) given += out[h] = static_cast<int64_t>(std::floor(quota[h]));
  // Largest remainder first (then the head with more global selections, then the lower head),
  // repeated while heads still have room (a capped head's share goes to the others).
  while (given < total) {
    std::vector<int64_t> order(H);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double ra = quota[a] - static_cast<double>(out[a]);
      const double rb = quota[b] - static_cast<double>(out[b]);
      if (ra != rb) return ra > rb;
      if (n_sel[a] != n_sel[b]) return n_sel[a] > n_sel[b];
      return a < b;
    });
    bool progressed = false;
    for (int64_t h : order) {
      if (given >= total) break;
      if (out[h] < caps[h]) {
        out[h]++;
        given++;
        progressed = true;
      }
    }
    if (!progressed) break;
  }
  return out;
}

// ---- parameters ----

std::vector<ParamSpec> budget_params(double default_budget, const std::string& default_unit,
                                     const std::string& budget_doc) {
  return {float_param("budget", default_budget, 0.0, 1e12,
                      !budget_doc.empty()
                          ? budget_doc
                          : "kept budget, protected tokens included: a fraction of the tokens seen "
                            "(budget_unit=ratio, (0, 1]; 1 keeps everything) or a token count "
                            "(tokens_per_head, tokens_per_layer; integral)"),
          string_param(
              "budget_unit", default_unit, {"ratio", "tokens_per_layer", "tokens_per_head"},
              "ratio: keep floor(budget x tokens seen) per KV head (kvpress compression_ratio = "
              "1 - budget); tokens_per_head: budget entries per KV head (KVCache-Factory's "
              "max_capacity_prompt); tokens_per_layer: budget entries per layer summed over "
              "its KV heads")};
}

ParamSpec position_mode_param(const std::string& default_mode) {
  return string_param(
      "position_mode", default_mode, {"absolute", "rerotated"},
      "absolute: kept keys keep their original RoPE rotation (kvpress); rerotated: "
      "keys are stored pre-RoPE and re-rotated every step to contiguous positions "
      "ending before the query (official StreamingLLM, kvpress KeyRerotationPress)");
}

Budget parse_budget(const nlohmann::json& p, const std::string& method) {
  Budget b;
  b.value = p.at("budget").get<double>();
  b.unit = parse_budget_unit(p.at("budget_unit").get<std::string>());
  if (b.unit == BudgetUnit::kRatio) {
    KVB_CHECK(b.value > 0.0 && b.value <= 1.0, "method ", method, ".budget: ", b.value,
              " is not a valid kept ratio (budget_unit=ratio wants 0 < budget <= 1)");
  } else {
    KVB_CHECK(b.value >= 1.0 && std::floor(b.value) == b.value, "method ", method,
              ".budget: ", b.value, " is not a token count (budget_unit=", budget_unit_name(b.unit),
              " wants an integer >= 1)");
  }
  return b;
}

std::vector<ParamSpec> snap_params(const std::map<std::string, SnapSettings>& presets,
                                   const std::string& default_preset) {
  std::vector<std::string> names = {"none"};
  std::string doc = "settings preset (explicit window/kernel_size/pooling/gqa_agg override it): ";
  for (const auto& [n, s] : presets) {
    names.push_back(n);
    doc += n + " = window " + std::to_string(s.window) + ", " + pooling_name(s.pooling) +
           "-pool kernel " + std::to_string(s.kernel) + ", GQA " + gqa_agg_name(s.agg) + "; ";
  }
  doc += "none = set all four";
  return {string_param("preset", default_preset, names, doc),
          int_param("window", -1, -1, 1 << 20,
                    "observation window: the last w queries score the prefix and the last w tokens "
                    "are kept (-1: from the preset)"),
          int_param("kernel_size", -1, -1, 1023,
                    "pooling kernel along the keys, odd (-1: from the preset)"),
          string_param("pooling", "preset", {"preset", "avg", "max", "none"},
                       "1-D pooling of the window scores along the keys"),
          string_param("gqa_agg", "preset", {"preset", "mean", "max"},
                       "how the query heads of a GQA group combine into their KV head's score "
                       "(selection is per KV head; KV is never repeated per query head)"),
          compress_every_param()};
}

ParamSpec compress_every_param() {
  return int_param("compress_every", 0, 0, 1 << 20,
                   "0: compress once at the end of prefill (the paper); k > 0: also every k decode "
                   "steps (kvpress DecodingPress style), scoring with the last window queries");
}

std::vector<ParamSpec> eviction_schedule_params() {
  return {string_param("schedule", "continuous", {"continuous", "prefill"},
                       "continuous: evict as tokens arrive, prefill and decode (the paper); "
                       "prefill: once at the end of the prompt (kvpress), and every "
                       "compress_every decode steps if set"),
          int_param("compress_every", 0, 0, 1 << 20,
                    "schedule=prefill: also compress every k decode steps (kvpress "
                    "DecodingPress); 0: never")};
}

EvictionPolicy::Schedule parse_eviction_schedule(const nlohmann::json& p, const std::string& method,
                                                 EvictionPolicy::Schedule continuous) {
  const int64_t every = p.at("compress_every").get<int64_t>();
  if (p.at("schedule").get<std::string>() == "continuous") {
    KVB_CHECK(every == 0, "method ", method, ".compress_every: ", every,
              " needs schedule=prefill (schedule=continuous already evicts at every step)");
    return continuous;
  }
  EvictionPolicy::Schedule s;
  s.end_prefill = true;
  s.every_decode_steps = every;
  return s;
}

SnapSettings parse_snap(const nlohmann::json& p, const std::string& method,
                        const std::map<std::string, SnapSettings>& presets) {
  const std::string preset = p.at("preset").get<std::string>();
  SnapSettings s;
  const bool from_preset = preset != "none";
  if (from_preset) s = presets.at(preset);
  auto need = [&](bool given, const char* key) {
    KVB_CHECK(given || from_preset, "method ", method, ".", key,
              ": preset=none needs an explicit value");
  };
  const int64_t w = p.at("window").get<int64_t>();
  need(w >= 0, "window");
  if (w >= 0) s.window = w;
  const int64_t k = p.at("kernel_size").get<int64_t>();
  need(k >= 0, "kernel_size");
  if (k >= 0) s.kernel = k;
  // "preset" or a name of the enum's table (the schema allows nothing else).
  const std::string pool = p.at("pooling").get<std::string>();
  need(pool != "preset", "pooling");
  if (pool != "preset") s.pooling = parse_enum(kPoolings, pool, "pooling");
  const std::string agg = p.at("gqa_agg").get<std::string>();
  need(agg != "preset", "gqa_agg");
  if (agg != "preset") s.agg = parse_enum(kGqaAggs, agg, "gqa_agg");
  KVB_CHECK(s.window >= 1, "method ", method, ".window: ", s.window, " must be >= 1");
  KVB_CHECK(s.kernel >= 1 && s.kernel % 2 == 1, "method ", method, ".kernel_size: ", s.kernel,
            " must be odd and >= 1 (same-padding pooling)");
  return s;
}

std::map<std::string, double> snap_settings_counters(const SnapSettings& s) {
  return {{"setting.window", static_cast<double>(s.window)},
          {"setting.kernel_size", static_cast<double>(s.kernel)},
          {"setting.pooling_max", s.pooling == Pooling::kMax ? 1.0 : 0.0},
          {"setting.pooling_avg", s.pooling == Pooling::kAvg ? 1.0 : 0.0},
          {"setting.gqa_agg_max", s.agg == GqaAgg::kMax ? 1.0 : 0.0}};
}

std::vector<ParamSpec> codec_params() {
  return {
      string_param("codec", "none",
                   {"none", "fp16", "bf16", "kivi-2", "kivi-4", "kivi-8", "pertoken-2",
                    "pertoken-4", "pertoken-8"},
                   "storage of the kept entries: none = the model dtype; fp16/bf16 rows; "
                   "kivi-b = KIVI layout at b bits (keys per channel, G = 32 tokens; values per "
                   "token); pertoken-b = K and V per token, one group per head"),
      int_param("codec_residual", 128, 0, 1 << 20,
                "newest kept entries per head held at full precision (fp16) by a quantizing "
                "codec (KIVI's R; a multiple of 32 for kivi-*)")};
}

std::string codec_target_check(const nlohmann::json& p, const RunTarget& target) {
  const std::string c = p.value("codec", "none");
  if (c == "none" || (target.device.is_cpu() && target.dtype == c10::kFloat)) return "";
  return "codec=" + c + " keeps its rows on the host and runs on CPU fp32 only (device " +
         target.device.str() + ", dtype " + std::string(c10::toString(target.dtype)) +
         " requested)";
}

std::shared_ptr<const KvCodec> parse_codec(const nlohmann::json& p, const std::string& method,
                                           int64_t head_dim) {
  const std::string c = p.at("codec").get<std::string>();
  const int64_t R = p.at("codec_residual").get<int64_t>();
  if (c == "none") return nullptr;
  if (c == "fp16" || c == "bf16") return make_plain_codec(parse_row_dtype(c));
  const bool kivi = c.rfind("kivi-", 0) == 0;
  const int32_t bits = std::stoi(c.substr(c.find('-') + 1));
  if (kivi) {
    KVB_CHECK(
        R % 32 == 0, "method ", method, ".codec_residual: ", R,
        " is not a multiple of 32 (kivi keys are quantized per channel in groups of 32 tokens)");
    return std::make_shared<QuantCodec>(
        c + "-r" + std::to_string(R), QuantCodec::kivi_key(bits, 32, R, RowDtype::kF16),
        QuantCodec::kivi_value(bits, adapt_channel_group(32, head_dim), R, RowDtype::kF16));
  }
  return std::make_shared<QuantCodec>(c + "-r" + std::to_string(R),
                                      QuantCodec::per_token(bits, head_dim, R, RowDtype::kF16),
                                      QuantCodec::per_token(bits, head_dim, R, RowDtype::kF16));
}

EvictingKvCache::Options evicting_options(const nlohmann::json& p, const std::string& method,
                                          int64_t head_dim) {
  EvictingKvCache::Options o;
  o.name = method;
  o.position_mode = parse_position_mode(p.at("position_mode").get<std::string>());
  o.codec = parse_codec(p, method, head_dim);
  return o;
}

}  // namespace kvb
