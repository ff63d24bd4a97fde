#include "harness/eval/run_config.h"

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/limits.h"
#include "harness/common/mapped_file.h"
#include "harness/common/strings.h"
#include "harness/kv/method_registry.h"
#include "harness/store/config_hash.h"

namespace kvb {

const std::vector<ProtocolSpec>& protocol_specs() {
  static const std::vector<ProtocolSpec> specs = {
      {"stream",
       "teacher-forced text windows with the method active while decoding; NLL, perplexity and KL / "
       "top-1 against the full cache",
       {string_param("dataset", "tinystories-valid-sample", {},
                     "corpus name in the data path, or a path to a .txt file"),
        int_param("window", 256, 2, 1 << 20, "tokens per window (BOS included)"),
        int_param("stride", 0, 0, 1 << 20, "tokens between window starts; 0: window (no overlap)"),
        int_param("max_windows", 4, 1, 1 << 20, "windows scored (samples)"),
        int_param("prefill_tokens", 1, 1, 1 << 20,
                  "tokens prefilled before token-by-token decoding (1: only BOS)"),
        int_param("prefill_chunk", 512, 1, 1 << 20, "tokens per prefill step")}},
      {"probe",
       "per-layer fidelity against exact attention at sampled decode positions (the method's and an "
       "exact cache get the same inputs): attention-output, key, value and attention-probability error",
       {string_param("dataset", "tinystories-valid-sample", {}, "corpus name or .txt path"),
        int_param("window", 256, 3, 1 << 20, "tokens per window (BOS included)"),
        int_param("max_windows", 2, 1, 1 << 20, "windows probed (samples)"),
        int_param("prefill_tokens", 64, 1, 1 << 20, "tokens prefilled (and compressed) first"),
        int_param("every", 16, 1, 1 << 20, "probe every n-th decode position"),
        int_param("stride", 0, 0, 1 << 20, "tokens between window starts; 0: window")}},
      {"qa",
       "context then questions, greedy answers scored by the task metric and paired with the full "
       "cache's answers; query-agnostic (one compressed context, many questions) or query-aware",
       {string_param("source", "synthetic", {"synthetic", "recall", "longbench"},
                     "synthetic: RULER-style generated tasks; recall: story-recall questions on a "
                     "corpus (small models can do it); longbench: LongBench-format JSONL"),
        string_param("task", "niah_single_1", {}, "synthetic task name (source synthetic)"),
        int_param("length", 1024, 0, 1 << 24,
                  "target prompt tokens (synthetic); max context tokens, middle-truncated (longbench; 0: none)"),
        int_param("num_samples", 4, 1, 1 << 20, "samples (per depth when depths are given)"),
        string_param("depths", "", {}, "comma-separated needle depths in [0, 1]; \"\": RULER's grid"),
        string_param("corpus", "", {}, "haystack corpus for synthetic tasks (\"\": the task default)"),
        string_param("dataset", "tinystories-valid-sample", {}, "corpus of the recall source"),
        int_param("questions", 2, 1, 64, "questions per story (recall)"),
        string_param("mode", "query_agnostic", {"query_agnostic", "query_aware"},
                     "compress the context before the question is seen, or with it"),
        string_param("chat_template", "auto", {"auto", "none", "chatml", "llama3", "mistral", "gemma"},
                     "wrap context + question in one user turn of an instruct model's template; auto: "
                     "the tokenizer's own (GGUF tokenizer.chat_template, tokenizer_config.json), else none"),
        int_param("max_new_tokens", 0, 0, 1 << 16, "answer length cap (0: the task's default)"),
        string_param("path", "", {}, "LongBench JSONL file (source longbench)"),
        string_param("tasks", "", {}, "LongBench per-task prompt/metric JSON (source longbench)"),
        bool_param("skip_bad_lines", false,
                   "longbench: skip (and count) malformed JSONL lines instead of failing on the first"),
        int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step")}},
      {"perf",
       "throughput: prefill tok/s, decode tok/s, time to first token and per output token",
       {int_param("context", 512, 2, 1 << 22, "prompt tokens per sequence"),
        int_param("decode_tokens", 64, 1, 1 << 20, "tokens generated per sequence"),
        string_param("batch_sizes", "1", {}, "comma-separated batch sizes, e.g. \"1,16\""),
        int_param("repeats", 3, 1, 1000, "timed repeats after one warm-up"),
        int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step")}},
      {"serve",
       "trace-driven serving: the method's measured footprint (on the run's model, scaled to a "
       "target's shapes) in a continuous-batching simulation under a KV pool, an allocator and a "
       "prefix store; capacity, waste, hit rates and preemptions exact, times from a roofline",
       {string_param("trace", "conversation", {},
                     "conversation | synthetic (the Mooncake traces in the data path), a JSONL path, "
                     "or generated (Poisson arrivals, lognormal lengths, shared prefixes: gen_*)"),
        float_param("gen_rate_per_s", 1.0, 1e-6, 1e6, "generated trace: arrivals per second"),
        int_param("gen_requests", 1000, 1, 10000000, "generated trace: requests"),
        int_param("gen_input_median", 2048, 1, 1 << 24, "generated trace: median prompt tokens"),
        int_param("gen_output_median", 256, 1, 1 << 24, "generated trace: median output tokens"),
        int_param("gen_prefix_groups", 0, 0, 1 << 20,
                  "generated trace: groups sharing a prefix (system prompts, documents); 0: none"),
        int_param("gen_prefix_blocks", 4, 1, 1 << 20, "generated trace: shared blocks per group"),
        float_param("gen_group_fraction", 0.5, 0, 1, "generated trace: requests that join a group"),
        int_param("max_requests", 1000, 0, 1 << 30, "first n requests of the trace (0: all)"),
        int_param("trace_block_tokens", 512, 1, 1 << 20, "tokens per hash_ids block of the trace"),
        string_param("target", "llama-3.1-8b", {}, "synthetic preset whose shapes are served"),
        float_param("kv_pool_gib", 100, 1e-6, 1e9, "device memory for KV (GiB)"),
        string_param("allocator", "paged", {"paged", "contiguous_max", "pow2", "oracle"},
                     "paged blocks, or contiguous reservations of the max context, the final "
                     "length rounded to a power of two, or exactly the final length"),
        int_param("block_tokens", 16, 1, 1 << 20, "paged allocator's block size"),
        int_param("max_num_seqs", 256, 1, 1 << 20, "running requests at most (per instance)"),
        int_param("instances", 1, 1, 4096, "identical instances behind the router"),
        string_param("router", "round_robin", {"round_robin", "least_loaded", "prefix", "conductor"},
                     "round_robin | least_loaded (fewest queued + running) | prefix (AIBrix: "
                     "longest local prefix match unless request counts drift apart) | conductor "
                     "(Mooncake: least transfer + queued prefill + prefill time, fetching a longer "
                     "prefix from another instance's store)"),
        int_param("prefill_instances", 0, 0, 4096,
                  "P/D disaggregation: the first n instances only prefill and send each prompt's KV "
                  "to a decode instance (0: every instance does both)"),
        float_param("pd_gbps", 25, 1e-3, 1e9, "P/D: prefill-to-decode KV transfer (GB/s)"),
        bool_param("pd_layerwise", false,
                   "P/D: stream each layer's KV as the prefill produces it (Mooncake, DistServe), "
                   "so the transfer overlaps the prefill; false: sent after the prefill ends"),
        int_param("conductor_threshold_tokens", 1024, 0, 1 << 24,
                  "conductor: fetch from another instance when its match is longer by more"),
        float_param("remote_gbps", 25, 1e-3, 1e9,
                    "conductor: another instance's prefix store to here (25 GB/s = a 200 Gb/s NIC)"),
        int_param("router_imbalance", 8, 0, 1 << 20,
                  "prefix router: balance by load when request counts differ by more than this"),
        string_param("prefix_scope", "local", {"local", "global"},
                     "local: a prefix store per instance; global: one store pooling every "
                     "instance's capacity (Mooncake)"),
        int_param("max_batched_tokens", 8192, 1, 1 << 24, "tokens per iteration"),
        float_param("time_scale", 1.0, 1e-9, 1e9, "arrival times x this (0.5: twice the load)"),
        float_param("prefix_cache_gib", 0, -1, 1e9,
                    "prefix store capacity per instance (GiB); 0: none; -1: unlimited"),
        string_param("prefix_policy", "lru", {"lru", "lfu", "fifo", "s3fifo"}, "prefix store eviction"),
        string_param("prefix_store", "host", {},
                     "host (loads at prefix_load_gbps) | redis-local (a private redis-server, "
                     "measured) | redis://HOST:PORT | unix://PATH"),
        float_param("hbm_gbps", 4300, 1e-3, 1e9, "device memory bandwidth (H200 copy, measured)"),
        float_param("tflops", 790, 1e-3, 1e9, "device matmul rate (H200 bf16 GEMM, measured)"),
        float_param("prefix_load_gbps", 55, 1e-3, 1e9, "prefix store to device (PCIe Gen5 H2D)"),
        float_param("h2d_gbps", 55, 1e-3, 1e9,
                    "a tiering method's host rows to device during decode (PCIe Gen5 H2D)"),
        float_param("iteration_overhead_ms", 0.3, 0, 1e6, "fixed time per iteration"),
        float_param("slo_ttft_ms", 5000, 0, 1e12, "time-to-first-token objective"),
        float_param("slo_tpot_ms", 100, 0, 1e12, "time-per-output-token objective"),
        string_param("dataset", "tinystories-valid-sample", {}, "text the footprint probe runs on"),
        string_param("probe_lengths", "128,256,384,480", {},
                     "comma-separated prompt lengths the footprint is measured at"),
        int_param("probe_decode_tokens", 16, 0, 1 << 20, "greedy steps after each probe prefill"),
        int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step of the probe")}},
  };
  return specs;
}

const ProtocolSpec& protocol_spec(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& p : protocol_specs()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  KVB_FAIL("protocol.name: unknown protocol '", name, "'", did_you_mean(name, names), "; known: ",
           join(names, ", "));
}

nlohmann::json load_config_file(const std::string& path) {
  KVB_CHECK(file_exists(path), path, ": config file not found");
  return parse_json(read_text_file(path), path);
}

namespace {

void check_keys(const nlohmann::json& obj, const std::vector<std::string>& allowed,
                const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end();
    KVB_CHECK(ok, where, "unknown key '", it.key(), "'", did_you_mean(it.key(), allowed),
              "; allowed: ", join(allowed, ", "));
  }
}

}  // namespace

nlohmann::json resolve_run_config(const nlohmann::json& raw) {
  KVB_CHECK(raw.is_object(), "config: expected a JSON object at the top level");
  check_keys(raw, {"model", "device", "dtype", "threads", "seed", "method", "protocol", "label"},
             "config: ");
  static const std::vector<ParamSpec> top = {
      string_param("model", "stories260K", {}, "model spec"),
      string_param("device", "cpu", {}, "cpu | cuda | cuda:N"),
      string_param("dtype", "fp32", {"fp32", "bf16", "fp16"}, "compute dtype"),
      int_param("threads", 0, 0, static_cast<double>(kMaxThreads), "CPU threads (0: default)"),
      int_param("seed", 0, 0, 1e15, "seed for anything random"),
      string_param("label", "", {}, "free text, not hashed"),
  };
  nlohmann::json flat = nlohmann::json::object();
  for (const auto& p : top)
    if (raw.contains(p.name)) flat[p.name] = raw[p.name];
  nlohmann::json out = resolve_params(top, flat, "config");
  const std::string dev = out["device"];
  KVB_CHECK(dev == "cpu" || starts_with(dev, "cuda"), "config.device: '", dev,
            "' is not one of cpu, cuda, cuda:N");

  // method: "name" or {"name": ..., "params": {...}}
  KVB_CHECK(raw.contains("method"), "config: missing required key 'method'");
  nlohmann::json m = raw["method"];
  if (m.is_string()) m = {{"name", m}};
  KVB_CHECK(m.is_object(), "config.method: expected a name or {\"name\": ..., \"params\": {...}}");
  check_keys(m, {"name", "params"}, "config.method: ");
  KVB_CHECK(m.contains("name") && m["name"].is_string(), "config.method.name: expected a string");
  const std::string mname = m["name"];
  MethodRegistry::instance().info(mname);  // unknown -> error with hint
  out["method"] = {{"name", mname},
                   {"params", MethodRegistry::instance().resolve(mname, m.value("params", nlohmann::json::object()))}};

  // protocol: {"name": ..., <params>}
  KVB_CHECK(raw.contains("protocol"), "config: missing required key 'protocol'");
  nlohmann::json p = raw["protocol"];
  if (p.is_string()) p = {{"name", p}};
  KVB_CHECK(p.is_object() && p.contains("name") && p["name"].is_string(),
            "config.protocol: expected {\"name\": ..., <parameters>}");
  const ProtocolSpec& spec = protocol_spec(p["name"]);
  nlohmann::json pp = p;
  pp.erase("name");
  nlohmann::json resolved = resolve_params(spec.params, pp, "config.protocol");
  resolved["name"] = spec.name;
  out["protocol"] = resolved;
  return out;
}

std::string run_dataset_label(const nlohmann::json& resolved) {
  const nlohmann::json& proto = resolved.at("protocol");
  const std::string protocol = proto.at("name");
  if (protocol == "qa") {
    const std::string src = proto.at("source");
    if (src == "synthetic")
      return proto.at("task").get<std::string>() + "@" + std::to_string(proto.at("length").get<int64_t>());
    if (src == "recall") return "recall:" + proto.at("dataset").get<std::string>();
    return "longbench:" + proto.at("path").get<std::string>();
  }
  if (protocol == "serve") return "trace:" + proto.at("trace").get<std::string>();  // not the probe text
  return proto.contains("dataset") ? proto.at("dataset").get<std::string>() : "synthetic";
}

std::string run_config_hash(const nlohmann::json& resolved) {
  nlohmann::json h = resolved;
  h.erase("label");
  return config_hash(h);
}

}  // namespace kvb
