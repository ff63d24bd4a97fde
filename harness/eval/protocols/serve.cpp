// The serve protocol (harness/eval/serve.h): two samples, the method's measured footprint and the
// serving simulation that reads it.

#include "harness/eval/serve.h"

#include <algorithm>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/protocols/model_run.h"
#include "harness/eval/protocols/text_windows.h"

namespace kvb {
namespace {

enum ServeSample : int64_t { kFootprint = 0, kSimulation = 1 };

// The footprint probe's prompt lengths, each with its decode steps within the model's context.
std::vector<int64_t> probe_lengths(const nlohmann::json& proto, int64_t context_tokens) {
  const int64_t decode = proto.at("probe_decode_tokens");
  return protocol_int_list(proto, "probe_lengths", "length", 2, context_tokens - decode);
}

class ServeRun : public ModelRun {
 public:
  explicit ServeRun(const RunContext& ctx)
      : ModelRun(ctx),
        dtype_(ctx.resolved["dtype"]),
        data_dir_(resolve_data_dir(ctx.env.data_dir)) {
    lengths_ = probe_lengths(proto_, model_->config.max_seq_len);
    check_serve_inputs(proto_, data_dir_);
    nlohmann::json wp = {{"dataset", proto_["dataset"]},
                         {"stride", 0},
                         {"max_windows", 1},
                         {"window", *std::max_element(lengths_.begin(), lengths_.end())}};
    auto windows = stream_windows(model_->tokenizer_path, wp, ctx.env.data_dir, &dataset_hash_);
    KVB_CHECK(!windows.empty(), proto_["dataset"].get<std::string>(),
              ": no text for the footprint probe");
    footprint_text_ = std::move(windows[0].tokens);
  }
  int64_t samples() const override { return 2; }
  std::string sample_key(int64_t i) const override {
    return i == kFootprint ? "footprint" : "simulation";
  }

  SampleOutput run_sample(int64_t i, const StoredSamples& stored) override {
    if (i == kFootprint) {
      bool applies_windows = false;
      auto points = measure_footprint_points(model_, method_, method_params_, footprint_text_,
                                             lengths_, proto_["probe_decode_tokens"],
                                             proto_["prefill_chunk"], 2, &applies_windows);
      // Bytes as a 16-bit deployment holds them (fp32 runs rescale the model-dtype rows).
      nlohmann::json j =
          footprint_sample_json(points, static_cast<double>(model_->config.kv_bytes_per_token(2)));
      // Written only when set, so that the samples of stores without it read as before.
      if (applies_windows) j["store_applies_windows"] = true;
      j["dataset_hash"] = dataset_hash_;
      j["probe_dtype"] = dtype_;
      return {j, "footprint measured at " + std::to_string(points.size()) + " lengths"};
    }
    // The simulation reads the footprint as stored (a resumed run's, too).
    nlohmann::json sim =
        serve_simulation_sample(proto_, stored.output(kFootprint), data_dir_, seed_);
    return {sim,
            "simulated " + std::to_string(sim["trace"]["requests"].get<int64_t>()) + " requests"};
  }

  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    std::vector<Metric> m = serve_metrics(stored.output(kFootprint), stored.output(kSimulation),
                                          !caps_.evicts && !caps_.query_aware);
    m.push_back({"simulated", caps_.simulated ? 1.0 : 0.0, "", Direction::kNone});
    return m;
  }

 private:
  std::string dtype_, data_dir_;
  std::vector<int64_t> lengths_;
  std::string dataset_hash_;
  std::vector<int64_t> footprint_text_;
};

class ServeProtocol : public PlannedProtocol<ServeRun> {
 public:
  ServeProtocol()
      : PlannedProtocol(
            "serve",
            "trace-driven serving: the method's measured footprint (on the run's model, scaled "
            "to a target's shapes) in a continuous-batching simulation under a KV pool, an "
            "allocator and a prefix store; capacity, waste, hit rates and preemptions exact, "
            "times from a roofline",
            {string_param(
                 "trace", "conversation", {},
                 "conversation | synthetic (the Mooncake traces in the data path), a JSONL path, "
                 "or generated (Poisson arrivals, lognormal lengths, shared prefixes: gen_*)"),
             float_param("gen_rate_per_s", 1.0, 1e-6, 1e6, "generated trace: arrivals per second"),
             int_param("gen_requests", 1000, 1, 10000000, "generated trace: requests"),
             int_param("gen_input_median", 2048, 1, 1 << 24,
                       "generated trace: median prompt tokens"),
             int_param("gen_output_median", 256, 1, 1 << 24,
                       "generated trace: median output tokens"),
             int_param(
                 "gen_prefix_groups", 0, 0, 1 << 20,
                 "generated trace: groups sharing a prefix (system prompts, documents); 0: none"),
             int_param("gen_prefix_blocks", 4, 1, 1 << 20,
                       "generated trace: shared blocks per group"),
             float_param("gen_group_fraction", 0.5, 0, 1,
                         "generated trace: requests that join a group"),
             int_param("max_requests", 1000, 0, 1 << 30, "first n requests of the trace (0: all)"),
             int_param("trace_block_tokens", 512, 1, 1 << 20,
                       "tokens per hash_ids block of the trace"),
             string_param("target", "llama-3.1-8b", {}, "synthetic preset whose shapes are served"),
             float_param("kv_pool_gib", 100, 1e-6, 1e9, "device memory for KV (GiB)"),
             enum_param("allocator", kKvAllocators, KvAllocator::kPaged,
                        "paged blocks, or contiguous reservations of the max context, the final "
                        "length rounded to a power of two, or exactly the final length, or "
                        "vattention (contiguous virtual ranges, pages of page_kib committed per "
                        "layer and K/V as tokens arrive)"),
             int_param("block_tokens", 16, 1, 1 << 20, "paged allocator's block size"),
             int_param("max_num_seqs", 256, 1, 1 << 20, "running requests at most (per instance)"),
             int_param("instances", 1, 1, 4096, "identical instances behind the router"),
             enum_param(
                 "router", kRouters, Router::kRoundRobin,
                 "round_robin | least_loaded (fewest queued + running) | prefix (AIBrix: "
                 "longest local prefix match unless request counts drift apart) | conductor "
                 "(Mooncake: least transfer + queued prefill + prefill time, fetching a longer "
                 "prefix from another instance's store)"),
             int_param(
                 "prefill_instances", 0, 0, 4096,
                 "P/D disaggregation: the first n instances only prefill and send each prompt's KV "
                 "to a decode instance (0: every instance does both)"),
             float_param("pd_gbps", 25, 1e-3, 1e9, "P/D: prefill-to-decode KV transfer (GB/s)"),
             bool_param(
                 "pd_layerwise", false,
                 "P/D: stream each layer's KV as the prefill produces it (Mooncake, DistServe), "
                 "so the transfer overlaps the prefill; false: sent after the prefill ends"),
             int_param("conductor_threshold_tokens", 1024, 0, 1 << 24,
                       "conductor: fetch from another instance when its match is longer by more"),
             float_param(
                 "remote_gbps", 25, 1e-3, 1e9,
                 "conductor: another instance's prefix store to here (25 GB/s = a 200 Gb/s NIC)"),
             int_param(
                 "router_imbalance", 8, 0, 1 << 20,
                 "prefix router: balance by load when request counts differ by more than this"),
             enum_param("prefix_scope", kPrefixScopes, PrefixScope::kLocal,
                        "local: a prefix store per instance; global: one store pooling every "
                        "instance's capacity (Mooncake)"),
             int_param("max_batched_tokens", 8192, 1, 1 << 24, "tokens per iteration"),
             float_param("time_scale", 1.0, 1e-9, 1e9,
                         "arrival times x this (0.5: twice the load)"),
             float_param("prefix_cache_gib", 0, -1, 1e9,
                         "prefix store capacity per instance (GiB); 0: none; -1: unlimited"),
             enum_param("prefix_policy", kCachePolicies, CachePolicy::kLru,
                        "prefix store eviction"),
             string_param(
                 "prefix_store", "host", {},
                 "host (loads at prefix_load_gbps) | shm (a shared-memory pool between two "
                 "processes, measured: CXL emulated by host shared memory) | cxl-sim (CXL "
                 "as published: cxl_gbps, cxl_latency_us) | redis-local (a private "
                 "redis-server, measured) | redis://HOST:PORT | unix://PATH"),
             float_param("hbm_gbps", 4300, 1e-3, 1e9,
                         "device memory bandwidth (H200 copy, measured)"),
             float_param("tflops", 790, 1e-3, 1e9, "device matmul rate (H200 bf16 GEMM, measured)"),
             float_param("prefix_load_gbps", 55, 1e-3, 1e9,
                         "prefix store to device (PCIe Gen5 H2D)"),
             float_param("h2d_gbps", 55, 1e-3, 1e9,
                         "a tiering method's host rows to device during decode (PCIe Gen5 H2D)"),
             float_param("iteration_overhead_ms", 0.3, 0, 1e6, "fixed time per iteration"),
             float_param("slo_ttft_ms", 5000, 0, 1e12, "time-to-first-token objective"),
             float_param("slo_tpot_ms", 100, 0, 1e12, "time-per-output-token objective"),
             string_param("dataset", "tinystories-valid-sample", {},
                          "text the footprint probe runs on"),
             string_param("probe_lengths", "128,256,384,480", {},
                          "comma-separated prompt lengths the footprint is measured at"),
             int_param("probe_decode_tokens", 16, 0, 1 << 20,
                       "greedy steps after each probe prefill"),
             int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step of the probe")}) {
    for (const ParamSpec& p : serve_later_params()) info_.params.push_back(p);
    info_.needs_tokenizer = true;
    ProtocolReport& r = info_.report;
    r.default_metric = "serve_slo_attainment";
    // What the capacity bought: latency, hits, concurrency.
    r.secondary_metrics = {"serve_ttft_ms_p50", "serve_ttft_ms_p90",     "serve_tpot_ms_p50",
                           "serve_tpot_ms_p99", "serve_prefix_hit_rate", "serve_preemptions"};
    r.exact_delta_note =
        "Δ = method − full cache over the same trace: each run is one deterministic simulation "
        "(scheduling, reservations and prefix hits exact; times from a roofline, simulated), so "
        "no confidence interval. bytes/token: device bytes at the target model's shapes at the "
        "trace's mean request length.";
    r.table_order = 2;
  }
  // The later parameters stay out of a config that does not give them (earlier runs keep their
  // hashes); those that apply to one setting only are refused with another.
  nlohmann::json finish_config(const nlohmann::json& given, nlohmann::json r) const override {
    auto refuse_unless = [&](const char* key, bool applies, const std::string& why) {
      KVB_CHECK(applies || !given.contains(key), "config.protocol.", key, ": ", why);
    };
    refuse_unless("page_kib", r.at("allocator") == "vattention",
                  "applies to allocator 'vattention' only");
    refuse_unless("paged_attention_slowdown", r.at("allocator") == "paged",
                  "applies to allocator 'paged' only");
    refuse_unless("prefix_blocks", r.at("kv_policy") == "on_pressure",
                  "applies to kv_policy 'on_pressure' only (under 'always' blocks are the "
                  "method's)");
    const bool cxl = r.at("prefix_store") == "cxl-sim" || r.at("pd_transport") == "cxl-sim";
    refuse_unless("cxl_gbps", cxl, "applies to prefix_store or pd_transport 'cxl-sim' only");
    refuse_unless("cxl_latency_us", cxl, "applies to prefix_store or pd_transport 'cxl-sim' only");
    check_prefix_store(r.at("prefix_store"));
    for (const ParamSpec& p : serve_later_params())
      if (!given.contains(p.name)) r.erase(p.name);
    return r;
  }

  std::string dataset_label(const nlohmann::json& proto) const override {
    return "trace:" + proto.at("trace").get<std::string>();  // not the footprint probe's text
  }

  void check_inputs(const nlohmann::json& proto, const std::string& data_dir,
                    const InputCheck& check) const override {
    check_dataset_input(proto, data_dir, check);
    if (proto["trace"] == "generated") return;  // made from the gen_* parameters
    const std::string path = serve_trace_path(proto["trace"], resolve_data_dir(data_dir));
    check("trace:" + path,
          [&] { KVB_CHECK(file_exists(path), "serve trace ", path, " not found (data path)"); });
  }
  void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                          const std::string&, const InputCheck& check) const override {
    const nlohmann::json& proto = resolved.at("protocol");
    if (model.context_tokens <= 0) return;
    check("serve probe:" + model.spec + ":" + proto.dump(), [&] {
      try {
        probe_lengths(proto, model.context_tokens);
      } catch (const Error& e) {
        KVB_FAIL(e.what(), " (the context of ", model.spec, " is ", model.context_tokens,
                 " tokens, probe_decode_tokens included)");
      }
    });
  }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(serve, kvb::ServeProtocol);
