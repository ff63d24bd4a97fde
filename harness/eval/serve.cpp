#include "harness/eval/serve.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/strings.h"
#include "harness/engine/engine.h"
#include "harness/formats/request_trace.h"
#include "harness/kv/method_registry.h"
#include "harness/model/synthetic_presets.h"
#include "harness/serve/redis_store.h"
#include "harness/serve/shm_kv_pool.h"

namespace kvb {

std::vector<FootprintPoint> measure_footprint_points(
    std::shared_ptr<Model> model, const std::string& method, const nlohmann::json& method_params,
    const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths, int64_t decode_tokens,
    int64_t prefill_chunk, int64_t serving_elem_bytes, bool* store_applies_windows) {
  const auto& c = model->config;
  const int64_t model_elem = dtype_bytes(model->dtype);
  // The share of a model-dtype byte that remains at the serving width.
  const double keep = static_cast<double>(serving_elem_bytes) / static_cast<double>(model_elem);
  CacheContext ctx{c, model->device, model->dtype, model};
  std::vector<FootprintPoint> points;
  for (int64_t len : lengths) {
    KVB_CHECK(len >= 2 && len <= static_cast<int64_t>(tokens.size()), "serve: probe length ", len,
              " needs ", len, " text tokens (have ", tokens.size(), ")");
    EngineOptions eo;
    eo.prefill_chunk = prefill_chunk;
    Engine e(model, MethodRegistry::instance().create(method, ctx, method_params), eo);
    const int64_t seq = e.new_sequence();
    std::vector<int64_t> prompt(tokens.begin(), tokens.begin() + len);
    at::Tensor logits = e.prefill({seq}, {prompt});
    int64_t next = logits.argmax(-1)[0].item<int64_t>();
    for (int64_t i = 0; i < decode_tokens; ++i) {
      at::Tensor l = e.decode({seq}, {next});
      next = l.argmax(-1)[0].item<int64_t>();
    }
    if (store_applies_windows)
      *store_applies_windows = c.n_window_layers() == 0 && e.kv().serves_windows();
    const Footprint fp = e.kv().footprint();
    FootprintPoint p;
    p.tokens = len + decode_tokens;
    p.host_bytes = static_cast<double>(fp.host_bytes + fp.remote_bytes);
    p.device_bytes = static_cast<double>(fp.physical_bytes()) - p.host_bytes;
    const auto counters = e.kv().counters();
    if (auto it = counters.find("decode_read_fraction"); it != counters.end() && decode_tokens > 0)
      p.read_fraction = std::clamp(it->second, 0.0, 1.0);
    if (auto it = counters.find("decode_h2d_bytes_per_token");
        it != counters.end() && decode_tokens > 0)
      p.h2d_bytes_per_token = std::max(0.0, it->second);
    if (model_elem != serving_elem_bytes) {
      KVB_CHECK(fp.model_dtype_device_bytes >= 0, "serve: method ", method,
                "'s store does not report which of its bytes are in the model dtype, so its ",
                model_elem * 8, "-bit footprint cannot be sized at ", serving_elem_bytes * 8,
                " bits: run the serve protocol with dtype bf16 or fp16");
      // Transfers are taken to have the host tier's make-up (its model-dtype share rescales).
      const double host_all = static_cast<double>(fp.host_bytes + fp.remote_bytes);
      const double host_model_share =
          host_all > 0 ? static_cast<double>(fp.model_dtype_host_bytes) / host_all : 0.0;
      p.h2d_bytes_per_token *= 1.0 - host_model_share * (1.0 - keep);
      p.device_bytes -= static_cast<double>(fp.model_dtype_device_bytes) * (1.0 - keep);
      p.host_bytes -= static_cast<double>(fp.model_dtype_host_bytes) * (1.0 - keep);
    }
    points.push_back(p);
  }
  return points;
}

const std::vector<ParamSpec>& serve_later_params() {
  static const std::vector<ParamSpec> params = {
      int_param("page_kib", 2048, 4, 1 << 20,
                "vattention allocator: the physical page in KiB (2048: CUDA's native page; 64: "
                "vAttention's patched driver)"),
      float_param("paged_attention_slowdown", 1.0, 1.0, 100.0,
                  "paged allocator: decode attention's KV bytes count this many times over (its "
                  "block-table indirection; vLLM's paper measured its paged kernel 1.20-1.26x "
                  "slower)"),
      enum_param("kv_policy", kKvPolicies, KvPolicy::kAlways,
                 "always: the method stores every request; on_pressure: requests start "
                 "uncompressed and the scheduler applies the method to running requests "
                 "instead of preempting them (compress-instead-of-preempt)"),
      enum_param("admission", kAdmissions, Admission::kPrompt,
                 "prompt: vLLM's rule (room for the whole prompt + 1%); predicted: every "
                 "request's predicted final footprint (prompt + mean output so far), "
                 "compressed where the policy can compress"),
      enum_param("prefix_blocks", kPrefixBlocks, PrefixBlocks::kAsHeld,
                 "on_pressure: prefix-store blocks at the size requests held them "
                 "(uncompressed) or compressed on the way in (more fit; a hit starts its "
                 "request compressed)"),
      string_param("pd_transport", "network", {"network", "shm", "cxl-sim"},
                   "P/D: prompts' KV over the network (pd_gbps), through the shared-memory "
                   "tier (measured: CXL emulated by host shared memory) or CXL as published "
                   "(cxl_gbps, cxl_latency_us; simulated)"),
      float_param("cxl_gbps", 64, 1e-3, 1e6,
                  "cxl-sim: CXL link rate (GB/s; 64 = CXL 2.0 / PCIe 5.0 x16 per direction)"),
      float_param("cxl_latency_us", 0.4, 0, 1e6,
                  "cxl-sim: load-to-use latency (us; measured CXL memory expanders are 2-5x "
                  "local DRAM's ~100 ns)")};
  return params;
}

nlohmann::json serve_param(const nlohmann::json& proto, const std::string& key) {
  if (auto it = proto.find(key); it != proto.end()) return *it;
  for (const ParamSpec& p : serve_later_params())
    if (p.name == key) return p.default_value;
  KVB_UNREACHABLE("serve", "serve_param: no parameter '", key, "'");
}

ServeTarget serve_target(const std::string& preset) {
  const ModelConfig c = synthetic_preset(preset);
  ServeTarget t;
  t.name = preset;
  const double params = static_cast<double>(c.parameter_count());
  t.weight_bytes = 2.0 * params;
  // Every weight is a matmul operand once per token except the input embedding (a lookup).
  const double matmul_params =
      params - (c.tied_embeddings ? 0.0 : static_cast<double>(c.vocab_size * c.dim));
  t.flops_per_token = 2.0 * matmul_params;
  t.attn_flops_per_pair = 4.0 * static_cast<double>(c.n_layers * c.n_heads * c.head_dim);
  t.layers = c.n_layers;
  t.kv_bytes_per_token = static_cast<double>(c.kv_bytes_per_token(2));
  t.max_context = c.max_seq_len;
  return t;
}

std::string serve_trace_path(const std::string& name, const std::string& data_dir) {
  if (name == "conversation" || name == "synthetic")
    return find_data_file(data_dir, "mooncake-traces/" + name + "_trace.jsonl");
  return name;
}

nlohmann::json footprint_sample_json(const std::vector<FootprintPoint>& points,
                                     double run_kv_bytes_per_token) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : points)
    pts.push_back({p.tokens, p.device_bytes, p.host_bytes, p.read_fraction, p.h2d_bytes_per_token});
  const FootprintCurve curve(points);
  return {{"points", pts},
          {"run_kv_bytes_per_token", run_kv_bytes_per_token},
          {"proportional", curve.proportional_in_length()}};
}

namespace {

FootprintCurve curve_from_json(const nlohmann::json& footprint) {
  std::vector<FootprintPoint> points;
  for (const auto& p : footprint.at("points")) {
    FootprintPoint x{p.at(0).get<int64_t>(), p.at(1).get<double>(), p.at(2).get<double>()};
    if (p.size() >= 5) {  // rows from before decode reads were measured have three fields
      x.read_fraction = p.at(3).get<double>();
      x.h2d_bytes_per_token = p.at(4).get<double>();
    }
    points.push_back(x);
  }
  return FootprintCurve(points);
}

// The method's curve at a target's shapes. The run's model has no window layers, so its curve is
// the method on global layers: it scales to the target's global layers, and each of the target's
// window layers adds its dense window (min(n, window - 1) rows at 16 bits) whatever the method. A
// target whose every layer is a window has no global layer (the window is the whole cache); there
// a store that applies windows itself (store_applies_windows: the codec store) holds each layer's
// last window - 1 rows encoded as it encodes any rows, so each layer adds the method's per-layer
// curve at min(n, window - 1) instead. The points are the measured lengths plus each window's knee
// and the target's context, so the piecewise-linear curve is exact at the knees. Without window
// layers: the plain scaling.
FootprintCurve target_curve(const FootprintCurve& run, const ModelConfig& tc, double target_bpt,
                            double run_bpt, bool store_applies_windows) {
  if (tc.n_window_layers() == 0) return run.scaled(target_bpt / run_bpt);
  const double row_bytes = 2.0 * static_cast<double>(tc.kv_dim()) * 2.0;  // K and V, 16-bit
  const double global_bpt = static_cast<double>(tc.n_layers - tc.n_window_layers()) * row_bytes;
  // A target whose every layer is a window (Phi-3-mini's 2,047) has no global layer to scale to.
  const FootprintCurve base =
      global_bpt > 0 ? run.scaled(global_bpt / run_bpt) : FootprintCurve::proportional(0.0);
  // The method on one layer of the target, for the windows a store applies itself.
  const bool encoded_windows = global_bpt == 0 && store_applies_windows;
  const FootprintCurve layer = run.scaled(row_bytes / run_bpt);
  std::vector<int64_t> lengths;
  for (const auto& p : run.points()) lengths.push_back(p.tokens);
  for (int64_t l = 0; l < tc.n_layers; ++l)
    if (tc.is_window_layer(l) && tc.layer_windows[l] > 1)
      lengths.push_back(tc.layer_windows[l] - 1);
  lengths.push_back(tc.max_seq_len);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::vector<FootprintPoint> points;
  for (int64_t t : lengths) {
    double window_bytes = 0, window_read = 0, window_host = 0, window_h2d = 0;
    for (int64_t l = 0; l < tc.n_layers; ++l) {
      if (!tc.is_window_layer(l)) continue;
      const int64_t rows = std::min(t, tc.layer_windows[l] - 1);
      if (encoded_windows) {
        window_bytes += layer.device_bytes(rows);
        window_read += layer.decode_read_bytes(rows);
        window_host += layer.host_bytes(rows);
        window_h2d += layer.h2d_bytes_per_token(rows);
      } else {
        window_bytes += static_cast<double>(rows) * row_bytes;
        window_read += static_cast<double>(rows) * row_bytes;
      }
    }
    FootprintPoint p;
    p.tokens = t;
    p.device_bytes = base.device_bytes(t) + window_bytes;
    p.host_bytes = base.host_bytes(t) + window_host;
    p.read_fraction =
        p.device_bytes > 0 ? (base.decode_read_bytes(t) + window_read) / p.device_bytes : 1.0;
    p.h2d_bytes_per_token = base.h2d_bytes_per_token(t) + window_h2d;
    points.push_back(p);
  }
  return FootprintCurve(points);
}

}  // namespace

void check_prefix_store(const std::string& store) {
  if (store == "host" || store == "shm" || store == "cxl-sim" || store == "redis-local") return;
  KVB_CHECK(store.rfind("redis://", 0) == 0 || store.rfind("unix://", 0) == 0,
            "config.protocol.prefix_store: '", store,
            "' (host | shm | cxl-sim | redis-local | redis://HOST:PORT | unix://PATH)");
  try {
    parse_redis_url(store);
  } catch (const Error& e) {
    KVB_FAIL("config.protocol.prefix_store: ", e.what());
  }
}

void check_serve_inputs(const nlohmann::json& proto, const std::string& data_dir) {
  const std::string target = proto.at("target");
  try {
    (void)serve_target(target);
  } catch (const Error& e) {
    KVB_FAIL("config.protocol.target: ", e.what());
  }
  (void)param_enum(proto, "allocator", kKvAllocators);
  (void)parse_enum(kKvPolicies, serve_param(proto, "kv_policy"), "kv_policy");
  (void)parse_enum(kAdmissions, serve_param(proto, "admission"), "admission");
  (void)parse_enum(kPrefixBlocks, serve_param(proto, "prefix_blocks"), "prefix_blocks");
  const std::string store = proto.at("prefix_store");
  check_prefix_store(store);
  KVB_CHECK(store == "host" || proto.at("prefix_cache_gib").get<double>() != 0,
            "config.protocol.prefix_store: '", store,
            "' needs a prefix cache (prefix_cache_gib != 0)");
  const std::string pd = serve_param(proto, "pd_transport");
  KVB_CHECK(pd == "network" || pd == "shm" || pd == "cxl-sim", "config.protocol.pd_transport: '",
            pd, "' (network | shm | cxl-sim)");
  KVB_CHECK(pd == "network" || proto.at("prefill_instances").get<int64_t>() > 0,
            "config.protocol.pd_transport: '", pd,
            "' moves prompts from prefill to decode instances: set prefill_instances > 0");
  const std::string trace_name = proto.at("trace");
  if (trace_name == "generated") return;  // made from gen_* parameters, each range-checked
  const std::string path = serve_trace_path(trace_name, data_dir);
  TraceReadOptions ro;
  ro.block_size_tokens = proto.at("trace_block_tokens");
  const RequestTrace trace = read_request_trace(path, ro);
  KVB_CHECK(!trace.requests.empty(), path, ": the trace has no requests");
}

nlohmann::json serve_simulation_sample(const nlohmann::json& proto, const nlohmann::json& footprint,
                                       const std::string& data_dir, uint64_t seed) {
  const ServeTarget target = serve_target(proto.at("target"));
  const double run_bpt = footprint.at("run_kv_bytes_per_token");
  const ModelConfig target_config = synthetic_preset(proto.at("target"));
  const FootprintCurve kv =
      target_curve(curve_from_json(footprint), target_config, target.kv_bytes_per_token, run_bpt,
                   footprint.value("store_applies_windows", false));
  // The same target without the method (the co-design policies start requests uncompressed): the
  // full cache, proportional at the run's model, through the same scaling and window rules.
  const FootprintCurve dense = target_curve(FootprintCurve::proportional(run_bpt), target_config,
                                            target.kv_bytes_per_token, run_bpt, false);

  const std::string trace_name = proto.at("trace");
  const std::string path =
      trace_name == "generated" ? "generated" : serve_trace_path(trace_name, data_dir);
  RequestTrace trace;
  if (trace_name == "generated") {
    // The seeded generator (request_trace.h): Poisson arrivals, lognormal lengths (the generator's
    // default spreads around the medians given here), optional shared prefixes.
    SyntheticTraceConfig g;
    g.seed = seed;
    g.num_requests = proto.at("gen_requests").get<size_t>();
    g.rate_per_s = proto.at("gen_rate_per_s");
    g.input.median = proto.at("gen_input_median").get<double>();
    g.output.median = proto.at("gen_output_median").get<double>();
    g.num_prefix_groups = proto.at("gen_prefix_groups").get<size_t>();
    g.prefix_blocks = proto.at("gen_prefix_blocks");
    g.group_fraction = proto.at("gen_group_fraction");
    g.block_size_tokens = proto.at("trace_block_tokens");
    trace = generate_synthetic_trace(g);
  } else {
    TraceReadOptions ro;
    ro.block_size_tokens = proto.at("trace_block_tokens");
    trace = read_request_trace(path, ro);
    trace.block_size_tokens = ro.block_size_tokens;
  }
  const int64_t max_requests = proto.at("max_requests");
  if (max_requests > 0 && static_cast<int64_t>(trace.requests.size()) > max_requests)
    trace.requests.resize(static_cast<size_t>(max_requests));
  KVB_CHECK(!trace.requests.empty(), path, ": the trace has no requests");

  ServeHardware hw;
  hw.hbm_gbps = proto.at("hbm_gbps");
  hw.tflops = proto.at("tflops");
  hw.prefix_load_gbps = proto.at("prefix_load_gbps");
  hw.h2d_gbps = proto.at("h2d_gbps");
  hw.remote_gbps = proto.at("remote_gbps");
  hw.pd_gbps = proto.at("pd_gbps");
  hw.iteration_overhead_ms = proto.at("iteration_overhead_ms");
  hw.paged_attention_slowdown = serve_param(proto, "paged_attention_slowdown");
  ServeConfig cfg;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  cfg.kv_pool_bytes = proto.at("kv_pool_gib").get<double>() * kGiB;
  cfg.allocator = param_enum(proto, "allocator", kKvAllocators);
  cfg.block_tokens = proto.at("block_tokens");
  cfg.page_bytes = serve_param(proto, "page_kib").get<int64_t>() * 1024;
  cfg.kv_policy = parse_enum(kKvPolicies, serve_param(proto, "kv_policy"), "kv_policy");
  cfg.admission = parse_enum(kAdmissions, serve_param(proto, "admission"), "admission");
  cfg.prefix_blocks =
      parse_enum(kPrefixBlocks, serve_param(proto, "prefix_blocks"), "prefix_blocks");
  cfg.max_num_seqs = proto.at("max_num_seqs");
  cfg.instances = proto.at("instances");
  cfg.router = param_enum(proto, "router", kRouters);
  cfg.router_imbalance = proto.at("router_imbalance");
  cfg.conductor_threshold_tokens = proto.at("conductor_threshold_tokens");
  cfg.prefill_instances = proto.at("prefill_instances");
  cfg.pd_layerwise = proto.at("pd_layerwise");
  cfg.prefix_scope = param_enum(proto, "prefix_scope", kPrefixScopes);
  cfg.max_batched_tokens = proto.at("max_batched_tokens");
  cfg.time_scale = proto.at("time_scale");
  const double cache_gib = proto.at("prefix_cache_gib");
  cfg.prefix_cache_bytes = cache_gib < 0 ? -1.0 : cache_gib * kGiB;
  cfg.prefix_policy = param_enum(proto, "prefix_policy", kCachePolicies);
  cfg.slo_ttft_ms = proto.at("slo_ttft_ms");
  cfg.slo_tpot_ms = proto.at("slo_tpot_ms");

  nlohmann::json out;
  const std::string store = proto.at("prefix_store");
  const std::string pd = serve_param(proto, "pd_transport");
  // The size of one prefix-store block (a compressed one unless the policy holds blocks dense).
  const FootprintCurve& block_curve =
      cfg.kv_policy == KvPolicy::kOnPressure && cfg.prefix_blocks == PrefixBlocks::kAsHeld ? dense
                                                                                           : kv;
  const double block_bytes =
      static_cast<double>(trace.block_size_tokens) * block_curve.device_bytes_per_token();
  // The shared-memory tier (TraCT's CXL pool, emulated by this host's shared memory): blocks of
  // that size moved between two real processes through an ShmKvPool, with the non-coherent
  // publish/acquire protocol; its measured rate and publish-to-visible latency become the tier's.
  if (store == "shm" || pd == "shm") {
    const int64_t value_bytes = std::clamp<int64_t>(std::llround(block_bytes), 4096, 256 << 20);
    const ShmBandwidth bw = measure_shm_bandwidth(value_bytes, 4, seed);
    out["shm"] = {{"label", "CXL emulated by host shared memory (two processes, this machine)"},
                  {"value_bytes", value_bytes},
                  {"get_gbps", bw.get_gbps},
                  {"put_gbps", bw.put_gbps},
                  {"get_ms_p50", bw.get_ms_p50},
                  {"put_ms_p50", bw.put_ms_p50},
                  {"visible_us_p50", bw.visible_us_p50},
                  {"copy_gbps", bw.copy_gbps}};
    // A block crosses the tier twice on its way to the device (written, then read), pipelined:
    // the slower side bounds it; the host-to-device link still applies after.
    const double tier_gbps = std::min(bw.get_gbps, bw.put_gbps);
    if (store == "shm") {
      hw.prefix_load_gbps = std::min(hw.prefix_load_gbps, tier_gbps);
      hw.prefix_load_latency_ms = bw.visible_us_p50 / 1e3;
    }
    if (pd == "shm") {
      hw.pd_gbps = std::min(hw.h2d_gbps, tier_gbps);
      hw.pd_latency_ms = bw.visible_us_p50 / 1e3;
    }
  }
  // CXL shared memory as published (simulated): the link's rate and a device's load latency.
  if (store == "cxl-sim" || pd == "cxl-sim") {
    const double gbps = serve_param(proto, "cxl_gbps"),
                 latency_us = serve_param(proto, "cxl_latency_us");
    out["cxl"] = {{"label", "CXL shared memory (simulated: published figures, see cxl_gbps)"},
                  {"gbps", gbps},
                  {"latency_us", latency_us}};
    if (store == "cxl-sim") {
      hw.prefix_load_gbps = std::min(hw.prefix_load_gbps, gbps);
      hw.prefix_load_latency_ms = latency_us / 1e3;
    }
    if (pd == "cxl-sim") {
      hw.pd_gbps = std::min(hw.h2d_gbps, gbps);
      hw.pd_latency_ms = latency_us / 1e3;
    }
  }
  // A Redis prefix store: one compressed block's round trips measured for real (loopback); blocks
  // then load at the slower of that and the host-to-device link (the two stages pipeline).
  if (store != "host" && store != "shm" && store != "cxl-sim") {
    std::unique_ptr<LocalRedisServer> local;
    std::string url = store;
    if (store == "redis-local") {
      local = std::make_unique<LocalRedisServer>();
      url = local->url();
    }
    RedisStore redis(url);
    const int64_t value_bytes =
        std::max<int64_t>(1, static_cast<int64_t>(std::llround(block_bytes)));
    const RedisBandwidth bw = measure_redis_bandwidth(redis, value_bytes, 4, seed);
    out["remote"] = {
        {"url", store == "redis-local" ? "redis-local (unix socket, loopback)" : store},
        {"value_bytes", value_bytes},
        {"get_gbps", bw.get_gbps},
        {"put_gbps", bw.put_gbps},
        {"get_ms_p50", bw.get_ms_p50},
        {"put_ms_p50", bw.put_ms_p50}};
    hw.prefix_load_gbps = std::min(hw.prefix_load_gbps, bw.get_gbps);
  }

  const ServeResult r = simulate_serving(trace, kv, target, hw, cfg, &dense);
  double mean_len = 0;
  for (const auto& q : trace.requests)
    mean_len += static_cast<double>(q.input_length + q.output_length);
  mean_len /= static_cast<double>(trace.requests.size());
  const int64_t mean_tokens = std::max<int64_t>(1, std::llround(mean_len));
  out["result"] = serve_result_json(r);
  out["trace"] = {
      {"path", path}, {"requests", trace.requests.size()}, {"mean_tokens", mean_tokens}};
  out["target"] = target.name;
  // The uncompressed baseline: the target's full cache at the mean length per token (its window
  // layers hold only their window, in the full cache too); every layer's bytes without windows.
  out["target_kv_bytes_per_token"] =
      static_cast<double>(target_config.full_kv_bytes(mean_tokens, 2)) /
      static_cast<double>(mean_tokens);
  out["kv_bytes_per_token_at_mean"] =
      kv.device_bytes(mean_tokens) / static_cast<double>(mean_tokens);
  out["decode_read_bytes_at_mean"] = kv.decode_read_bytes(mean_tokens);
  out["decode_h2d_bytes_per_token_at_mean"] = kv.h2d_bytes_per_token(mean_tokens);
  out["prefix_load_gbps"] = hw.prefix_load_gbps;
  out["prefix_load_latency_ms"] = hw.prefix_load_latency_ms;
  out["pd_gbps"] = hw.pd_gbps;
  out["pd_latency_ms"] = hw.pd_latency_ms;
  return out;
}

// Every figure of a simulation under its own name (per-request results are not stored).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServeResult, requests, completed, rejected, preemptions,
                                   iterations, duration_s, output_tok_s, requests_per_s,
                                   ttft_ms_p50, ttft_ms_p90, ttft_ms_p99, tpot_ms_p50, tpot_ms_p90,
                                   tpot_ms_p99, slo_attainment, mean_running, max_running,
                                   kv_utilization, allocator_waste, prefix_hit_rate, prefill_tokens,
                                   pd_transfer_bytes, remote_fetch_bytes, prefix_load_bytes,
                                   prefix_block_bytes, prefix_capacity_blocks,
                                   memory_bound_fraction, pcie_bound_fraction, peak_host_bytes,
                                   load_imbalance, instance_requests, compressions,
                                   compressed_request_fraction, compressed_token_fraction)

nlohmann::json serve_result_json(const ServeResult& r) { return r; }

std::vector<Metric> serve_metrics(const nlohmann::json& footprint, const nlohmann::json& sim,
                                  bool prefix_reuse_exact) {
  using D = Direction;
  std::vector<Metric> m;
  const nlohmann::json& s = sim.at("result");
  auto add = [&](const std::string& name, const char* unit, D d) {
    m.push_back({"serve_" + name, s.at(name).get<double>(), unit, d});
  };
  add("output_tok_s", "tokens/s", D::kHigher);
  add("requests_per_s", "1/s", D::kHigher);
  add("ttft_ms_p50", "ms", D::kLower);
  add("ttft_ms_p90", "ms", D::kLower);
  add("ttft_ms_p99", "ms", D::kLower);
  add("tpot_ms_p50", "ms", D::kLower);
  add("tpot_ms_p99", "ms", D::kLower);
  add("slo_attainment", "fraction", D::kHigher);
  add("mean_running", "requests", D::kHigher);
  add("max_running", "requests", D::kNone);
  add("kv_utilization", "fraction", D::kNone);
  add("allocator_waste", "fraction", D::kLower);
  add("prefix_hit_rate", "fraction", D::kHigher);
  add("prefill_tokens", "tokens", D::kLower);
  add("prefix_load_bytes", "bytes", D::kNone);
  add("remote_fetch_bytes", "bytes", D::kNone);
  add("pd_transfer_bytes", "bytes", D::kNone);
  add("preemptions", "", D::kLower);
  add("rejected", "", D::kLower);
  add("completed", "", D::kHigher);
  add("duration_s", "s", D::kLower);
  add("memory_bound_fraction", "fraction", D::kNone);
  add("pcie_bound_fraction", "fraction", D::kNone);
  add("peak_host_bytes", "bytes", D::kNone);
  add("load_imbalance", "x", D::kLower);
  // Rows written before the co-design policies existed have no such fields.
  auto add_if = [&](const std::string& name, const char* unit, D d) {
    if (s.contains(name)) add(name, unit, d);
  };
  add_if("compressions", "", D::kNone);
  add_if("compressed_request_fraction", "fraction", D::kNone);
  add_if("compressed_token_fraction", "fraction", D::kLower);
  // The method's footprint, at the target's shapes, at the trace's mean request length.
  const double bpt = sim.at("target_kv_bytes_per_token");
  m.push_back({"serve_kv_bytes_per_token", sim.at("kv_bytes_per_token_at_mean").get<double>(),
               "bytes/token", D::kLower});
  m.push_back({"serve_baseline_kv_bytes_per_token", bpt, "bytes/token", D::kNone});
  // The leaderboard's memory columns (target shapes, device bytes, at the trace's mean length).
  const double at_mean = sim.at("kv_bytes_per_token_at_mean");
  m.push_back({"bytes_per_token", at_mean, "bytes", D::kLower});
  m.push_back({"compression_ratio", at_mean > 0 ? bpt / at_mean : 0.0, "x", D::kHigher});
  // Already 16-bit figures (footprints are sized as a 16-bit deployment holds them).
  m.push_back({"bytes_per_token_16bit", at_mean, "bytes", D::kLower});
  m.push_back({"compression_ratio_16bit", at_mean > 0 ? bpt / at_mean : 0.0, "x", D::kHigher});
  m.push_back({"serve_prefix_reuse_exact", prefix_reuse_exact ? 1.0 : 0.0, "", D::kNone});
  m.push_back({"serve_footprint_proportional", footprint.at("proportional").get<bool>() ? 1.0 : 0.0,
               "", D::kNone});
  if (sim.contains("remote")) {
    m.push_back(
        {"serve_remote_get_gbps", sim["remote"].at("get_gbps").get<double>(), "GB/s", D::kHigher});
    m.push_back(
        {"serve_remote_put_gbps", sim["remote"].at("put_gbps").get<double>(), "GB/s", D::kHigher});
  }
  if (sim.contains("shm")) {
    m.push_back(
        {"serve_shm_get_gbps", sim["shm"].at("get_gbps").get<double>(), "GB/s", D::kHigher});
    m.push_back(
        {"serve_shm_put_gbps", sim["shm"].at("put_gbps").get<double>(), "GB/s", D::kHigher});
    m.push_back(
        {"serve_shm_visible_us", sim["shm"].at("visible_us_p50").get<double>(), "us", D::kLower});
    m.push_back(
        {"serve_shm_copy_gbps", sim["shm"].at("copy_gbps").get<double>(), "GB/s", D::kNone});
  }
  if (sim.contains("pd_gbps"))
    m.push_back({"serve_pd_gbps", sim.at("pd_gbps").get<double>(), "GB/s", D::kNone});
  if (sim.contains("prefix_load_gbps"))
    m.push_back(
        {"serve_prefix_load_gbps", sim.at("prefix_load_gbps").get<double>(), "GB/s", D::kNone});
  // Iteration times come from a roofline, not a device: say so in every run.
  m.push_back({"serve_times_simulated", 1.0, "", D::kNone});
  return m;
}

}  // namespace kvb
