#pragma once
// A trace-driven simulation of serving instances behind a router, for the `serve` protocol:
// continuous batching with chunked prefill (vLLM's scheduler shape) under a device KV budget, an
// allocator (paged blocks or up-front contiguous reservations, as in the PagedAttention paper's
// comparison), a prefix store in a host or remote tier (Mooncake / LMCache style) and a roofline
// time model of the accelerator.
//
// What is exact and what is modelled: the scheduling, the allocator's reservations, preemptions and
// the prefix cache's hits are exact discrete-event accounting over the trace; the KV bytes per
// sequence come from the method's measured footprint curve; iteration times are a roofline
// (max(FLOPs / peak, bytes / bandwidth) + a fixed overhead) and therefore *simulated* - the
// protocol reports them as such. Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include "harness/common/enum_names.h"
#include "harness/formats/request_trace.h"
#include "harness/serve/footprint_curve.h"
#include "harness/serve/prefix_cache.h"

namespace kvb {

// The served model, as the time model needs it.
struct ServeTarget {
  std::string name;
  double weight_bytes = 0;     // read once per iteration
  double flops_per_token = 0;  // dense matmul FLOPs per token (2 x parameters)
  double attn_flops_per_pair =
      0;  // attention FLOPs per (query token, context token): 4 x layers x q_heads x head_dim
  double kv_bytes_per_token = 0;  // uncompressed KV bytes per token (for reports)
  int64_t layers = 0;             // transformer layers (layer-wise P/D transfer)
  int64_t max_context = 0;        // longer requests are rejected
};

// A simulated accelerator. Defaults: the H200 figures measured on the device (copy
// bandwidth 4.3 TB/s, bf16 GEMM 790 TFLOP/s) and PCIe Gen5 host-to-device 55 GB/s.
struct ServeHardware {
  double hbm_gbps = 4300;
  double tflops = 790;
  double prefix_load_gbps = 55;        // prefix-store blocks -> device
  double h2d_gbps = 55;                // a tiering method's host rows -> device during decode
  double remote_gbps = 25;             // another instance's prefix store -> here (200 Gb/s NIC)
  double pd_gbps = 25;                 // a prefill instance's KV -> a decode instance (P/D)
  double iteration_overhead_ms = 0.3;  // scheduling and launches per iteration
  // Fixed latency of one prefix-store load and of one P/D handoff, beyond bytes / bandwidth (a
  // measured tier's publish-to-visible time). 0: none.
  double prefix_load_latency_ms = 0;
  double pd_latency_ms = 0;
  // The paged allocator's decode attention reads its KV through a block table, which costs kernel
  // time beyond the bytes (vLLM's paper: its paged kernel 20-26% slower than FasterTransformer's):
  // a paged decode step's KV bytes count this many times over. 1: no penalty. Contiguous
  // allocators (vattention, the reservations) read without a table.
  double paged_attention_slowdown = 1.0;
};

enum class KvAllocator {
  kPaged,          // blocks of block_tokens allocated as tokens arrive (vLLM)
  kContiguousMax,  // the model's max context reserved per request at admission (Orca-Max)
  kPow2,           // the final length rounded up to a power of two (Orca-Pow2)
  kOracle,         // exactly the final length, reserved up front (Orca-Oracle)
  kVAttention,     // vAttention: contiguous virtual ranges, physical pages of page_bytes committed
                   // per layer and K/V as tokens arrive (no block table)
};
inline constexpr EnumName<KvAllocator> kKvAllocators[] = {
    {KvAllocator::kPaged, "paged"},
    {KvAllocator::kContiguousMax, "contiguous_max"},
    {KvAllocator::kPow2, "pow2"},
    {KvAllocator::kOracle, "oracle"},
    {KvAllocator::kVAttention, "vattention"}};

enum class Router {
  kRoundRobin,   // in turn
  kLeastLoaded,  // fewest requests queued or running
  kPrefix,     // AIBrix's prefix-cache router: longest local prefix match unless loads drift apart
  kConductor,  // Mooncake's conductor: least transfer + queued prefill + prefill time, fetching a
               // longer prefix from another instance's store when it beats the local match by
               // more than conductor_threshold_tokens
};
inline constexpr EnumName<Router> kRouters[] = {{Router::kRoundRobin, "round_robin"},
                                                {Router::kLeastLoaded, "least_loaded"},
                                                {Router::kPrefix, "prefix"},
                                                {Router::kConductor, "conductor"}};

enum class PrefixScope {
  kLocal,   // each instance its own prefix store (vLLM's automatic prefix caching, LMCache local)
  kGlobal,  // one store pooling every instance's capacity, reachable from all (Mooncake's store)
};
inline constexpr EnumName<PrefixScope> kPrefixScopes[] = {{PrefixScope::kLocal, "local"},
                                                          {PrefixScope::kGlobal, "global"}};

// When the method's compression applies to a request (the scheduling x memory co-design axis).
enum class KvPolicy {
  kAlways,      // every request is stored by the method from its first token (the method's curve)
  kOnPressure,  // requests start uncompressed; when the pool cannot give a running request its
                // next tokens, the scheduler compresses running requests (the one it frees most
                // bytes from first) before it preempts any (compress-instead-of-preempt)
};
inline constexpr EnumName<KvPolicy> kKvPolicies[] = {{KvPolicy::kAlways, "always"},
                                                     {KvPolicy::kOnPressure, "on_pressure"}};

// What admission counts.
enum class Admission {
  kPrompt,     // vLLM: room for the whole prompt at the size it is stored at now + 1% watermark
  kPredicted,  // the predicted final footprint (prompt + the mean output of the requests finished
               // so far) of every running request and the new one, each at its compressed size
               // when the policy can compress it
};
inline constexpr EnumName<Admission> kAdmissions[] = {{Admission::kPrompt, "prompt"},
                                                      {Admission::kPredicted, "predicted"}};

// At what size the prefix store holds blocks (on_pressure only; under always both are the
// method's). A compressed block costs less room but hands a request compressed KV.
enum class PrefixBlocks {
  kAsHeld,      // the size the requests held them at: uncompressed under on_pressure
  kCompressed,  // compressed on the way to the store; a hit starts its request compressed
};
inline constexpr EnumName<PrefixBlocks> kPrefixBlocks[] = {
    {PrefixBlocks::kAsHeld, "as_held"}, {PrefixBlocks::kCompressed, "compressed"}};

struct ServeConfig {
  int64_t instances = 1;  // identical instances behind the router
  Router router = Router::kRoundRobin;
  int64_t router_imbalance = 8;  // prefix router: balance when request counts differ by more
  int64_t conductor_threshold_tokens = 1024;  // Mooncake's kvcache_balancing_threshold
  // P/D disaggregation (Mooncake): the first prefill_instances only prefill (arrivals go there),
  // then hand each prompt's KV to the least-loaded of the rest, which decode. 0: every instance
  // does both.
  int64_t prefill_instances = 0;
  // P/D: each layer's KV leaves as the prefill produces it (Mooncake's layer-wise transfer), so a
  // prompt's KV is ready at max(prefill start + all bytes / bandwidth, prefill end + the last
  // chunk's last layer / bandwidth) instead of prefill end + all bytes / bandwidth. Either way a
  // prefill instance's link sends one prompt at a time (a transfer starts when the previous ends).
  bool pd_layerwise = false;
  PrefixScope prefix_scope = PrefixScope::kLocal;
  double kv_pool_bytes = 100.0 * (1ll << 30);  // device memory for KV
  KvAllocator allocator = KvAllocator::kPaged;
  int64_t block_tokens = 16;          // paged allocator's block
  int64_t page_bytes = 2 << 20;       // vattention allocator's physical page
  int64_t max_num_seqs = 256;         // running requests at most
  int64_t max_batched_tokens = 8192;  // tokens per iteration (decode tokens + prefill chunks)
  double time_scale = 1.0;            // arrival times are multiplied by this (0.5: twice the load)
  double prefix_cache_bytes = 0;      // prefix store capacity per instance; 0: none; < 0: unlimited
  CachePolicy prefix_policy = CachePolicy::kLru;
  double slo_ttft_ms = 2000;
  double slo_tpot_ms = 100;
  KvPolicy kv_policy = KvPolicy::kAlways;
  Admission admission = Admission::kPrompt;
  PrefixBlocks prefix_blocks = PrefixBlocks::kAsHeld;
};

struct ServeRequestResult {
  double arrival_ms = 0, first_token_ms = -1, finish_ms = -1;
  int64_t input = 0, output = 0, hit_tokens = 0, preemptions = 0;
  bool rejected = false;
  // Output tokens generated after the method's compression applied (all of them under always).
  int64_t compressed_output = 0;
  double ttft_ms() const { return first_token_ms - arrival_ms; }
  double tpot_ms() const;  // (finish - first token) / (output - 1); 0 for a single output token
};

struct ServeResult {
  int64_t requests = 0, completed = 0, rejected = 0, preemptions = 0, iterations = 0;
  double duration_s = 0;  // first arrival to last finish
  double output_tok_s = 0, requests_per_s = 0;
  double ttft_ms_p50 = 0, ttft_ms_p90 = 0, ttft_ms_p99 = 0;
  double tpot_ms_p50 = 0, tpot_ms_p90 = 0, tpot_ms_p99 = 0;
  double slo_attainment = 0;  // requests within both SLOs (rejected ones fail)
  double mean_running = 0;    // time-weighted running requests
  int64_t max_running = 0;
  double kv_utilization = 0;           // time-weighted live KV bytes / pool
  double allocator_waste = 0;          // time-weighted (reserved - live) / reserved
  double prefix_hit_rate = 0;          // prompt tokens served from the prefix store / prompt tokens
  double prefill_tokens = 0;           // tokens actually prefilled (recomputation included)
  double prefix_load_bytes = 0;        // bytes loaded from the prefix store
  double remote_fetch_bytes = 0;       // of those, fetched from another instance's store
  double pd_transfer_bytes = 0;        // prompts' KV sent from prefill to decode instances
  double prefix_block_bytes = 0;       // bytes one prefix-store block costs
  int64_t prefix_capacity_blocks = 0;  // -1: unlimited
  double memory_bound_fraction = 0;    // iterations' time share limited by HBM bytes
  double pcie_bound_fraction = 0;      // ... limited by host-to-device transfers (tiering)
  double peak_host_bytes = 0;  // largest host-tier bytes one instance's running requests held
  double load_imbalance = 0;   // most requests routed to one instance / the mean (1: even)
  // Co-design: compressions the scheduler applied to running requests (on_pressure), the share of
  // completed requests that ran compressed at any point, and of output tokens generated from
  // compressed KV (the share the method's accuracy cost applies to; 1 under always).
  int64_t compressions = 0;
  double compressed_request_fraction = 0;
  double compressed_token_fraction = 0;
  std::vector<int64_t> instance_requests;  // requests routed to each instance
  std::vector<ServeRequestResult> per_request;
};

// kv: the method's bytes per sequence at the target's shapes. uncompressed: the same without the
// method (the target's dense cache); needed by, and only read under, KvPolicy::kOnPressure.
// Requests whose input + output exceeds target.max_context are rejected. Invalid settings throw
// kvb::Error naming the field.
ServeResult simulate_serving(const RequestTrace& trace, const FootprintCurve& kv,
                             const ServeTarget& target, const ServeHardware& hw,
                             const ServeConfig& config,
                             const FootprintCurve* uncompressed = nullptr);

}  // namespace kvb
