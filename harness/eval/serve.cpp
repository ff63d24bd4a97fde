#include "harness/eval/serve.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/strings.h"
#include "harness/engine/engine.h"
#include "harness/formats/request_trace.h"
#include "harness/kv/method_registry.h"
#include "harness/model/synthetic_presets.h"
#include "harness/serve/redis_store.h"

namespace kvb {

std::vector<FootprintPoint> measure_footprint_points(
    std::shared_ptr<Model> model, const std::string& method, const nlohmann::json& method_params,
    const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths, int64_t decode_tokens,
    int64_t prefill_chunk, int64_t serving_elem_bytes) {
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
// window layers adds its dense window (min(n, window - 1) rows at 16 bits) whatever the method. The
// points are the measured lengths plus each window's knee and the target's context, so the
// piecewise-linear curve is exact at the knees. Without window layers: the plain scaling.
FootprintCurve target_curve(const FootprintCurve& run, const ModelConfig& tc, double target_bpt,
                            double run_bpt) {
  if (tc.n_window_layers() == 0) return run.scaled(target_bpt / run_bpt);
  const double row_bytes = 2.0 * static_cast<double>(tc.kv_dim()) * 2.0;  // K and V, 16-bit
  const double global_bpt =
      static_cast<double>(tc.n_layers - tc.n_window_layers()) * row_bytes;
  // A target whose every layer is a window (Phi-3-mini's 2,047) has no global layer to scale to.
  const FootprintCurve base =
      global_bpt > 0 ? run.scaled(global_bpt / run_bpt) : FootprintCurve::proportional(0.0);
  std::vector<int64_t> lengths;
  for (const auto& p : run.points()) lengths.push_back(p.tokens);
  for (int64_t l = 0; l < tc.n_layers; ++l)
    if (tc.is_window_layer(l) && tc.layer_windows[l] > 1) lengths.push_back(tc.layer_windows[l] - 1);
  lengths.push_back(tc.max_seq_len);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::vector<FootprintPoint> points;
  for (int64_t t : lengths) {
    double window_bytes = 0;
    for (int64_t l = 0; l < tc.n_layers; ++l)
      if (tc.is_window_layer(l))
        window_bytes += static_cast<double>(std::min(t, tc.layer_windows[l] - 1)) * row_bytes;
    FootprintPoint p;
    p.tokens = t;
    p.device_bytes = base.device_bytes(t) + window_bytes;
    p.host_bytes = base.host_bytes(t);
    p.read_fraction =
        p.device_bytes > 0 ? (base.decode_read_bytes(t) + window_bytes) / p.device_bytes : 1.0;
    p.h2d_bytes_per_token = base.h2d_bytes_per_token(t);
    points.push_back(p);
  }
  return FootprintCurve(points);
}

}  // namespace

void check_serve_inputs(const nlohmann::json& proto, const std::string& data_dir) {
  const std::string target = proto.at("target");
  try {
    (void)serve_target(target);
  } catch (const Error& e) {
    KVB_FAIL("config.protocol.target: ", e.what());
  }
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
      target_curve(curve_from_json(footprint), target_config, target.kv_bytes_per_token, run_bpt);

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
  ServeConfig cfg;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  cfg.kv_pool_bytes = proto.at("kv_pool_gib").get<double>() * kGiB;
  cfg.allocator = parse_kv_allocator(proto.at("allocator"));
  cfg.block_tokens = proto.at("block_tokens");
  cfg.max_num_seqs = proto.at("max_num_seqs");
  cfg.instances = proto.at("instances");
  cfg.router = parse_router(proto.at("router"));
  cfg.router_imbalance = proto.at("router_imbalance");
  cfg.conductor_threshold_tokens = proto.at("conductor_threshold_tokens");
  cfg.prefill_instances = proto.at("prefill_instances");
  cfg.pd_layerwise = proto.at("pd_layerwise");
  cfg.prefix_scope = parse_prefix_scope(proto.at("prefix_scope"));
  cfg.max_batched_tokens = proto.at("max_batched_tokens");
  cfg.time_scale = proto.at("time_scale");
  const double cache_gib = proto.at("prefix_cache_gib");
  cfg.prefix_cache_bytes = cache_gib < 0 ? -1.0 : cache_gib * kGiB;
  cfg.prefix_policy = parse_cache_policy(proto.at("prefix_policy"));
  cfg.slo_ttft_ms = proto.at("slo_ttft_ms");
  cfg.slo_tpot_ms = proto.at("slo_tpot_ms");

  nlohmann::json out;
  // A Redis prefix store: one compressed block's round trips measured for real (loopback); blocks
  // then load at the slower of that and the host-to-device link (the two stages pipeline).
  const std::string store = proto.at("prefix_store");
  if (store != "host") {
    KVB_CHECK(cache_gib != 0, "config.protocol.prefix_store: '", store,
              "' needs a prefix cache (prefix_cache_gib != 0)");
    std::unique_ptr<LocalRedisServer> local;
    std::string url = store;
    if (store == "redis-local") {
      local = std::make_unique<LocalRedisServer>();
      url = local->url();
    }
    RedisStore redis(url);
    const double block_bytes =
        static_cast<double>(trace.block_size_tokens) * kv.device_bytes_per_token();
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

  const ServeResult r = simulate_serving(trace, kv, target, hw, cfg);
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
  return out;
}

// Every figure of a simulation under its own name (per-request results are not stored).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServeResult, requests, completed, rejected, preemptions, iterations,
                                   duration_s, output_tok_s, requests_per_s, ttft_ms_p50, ttft_ms_p90,
                                   ttft_ms_p99, tpot_ms_p50, tpot_ms_p90, tpot_ms_p99, slo_attainment,
                                   mean_running, max_running, kv_utilization, allocator_waste,
                                   prefix_hit_rate, prefill_tokens, pd_transfer_bytes,
                                   remote_fetch_bytes, prefix_load_bytes, prefix_block_bytes,
                                   prefix_capacity_blocks, memory_bound_fraction, pcie_bound_fraction,
                                   peak_host_bytes, load_imbalance, instance_requests)

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
  // Iteration times come from a roofline, not a device: say so in every run.
  m.push_back({"serve_times_simulated", 1.0, "", D::kNone});
  return m;
}

}  // namespace kvb
