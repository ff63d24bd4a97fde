#pragma once
// The `serve` protocol: what a KV method buys a serving instance. Two samples:
//   0 "footprint"  - the method's real store runs on the run's model over real text at a few
//                    lengths (prefill, then a few greedy decode steps); its ledger gives device and
//                    host bytes per sequence as a function of length (a FootprintCurve).
//   1 "simulation" - that curve, scaled to a target model's shapes, drives a trace-driven serving
//                    simulation (harness/serve/serving_sim.h): continuous batching under a KV pool,
//                    an allocator, a prefix store (host, or a real Redis on loopback whose measured
//                    bandwidth sets the load rate), a roofline time model. Capacity, waste, hit
//                    rates and preemptions are exact accounting; times are simulated (flagged as
//                    such).

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/params.h"
#include "harness/model/model.h"
#include "harness/serve/footprint_curve.h"
#include "harness/serve/serving_sim.h"
#include "harness/store/results_db.h"

namespace kvb {

// Per length L in `lengths`: a fresh store, prefill of tokens[0:L], decode_tokens greedy steps; the
// point is (L + decode_tokens, device bytes, host + remote bytes) as a deployment storing rows at
// serving_elem_bytes would hold them: bytes the store keeps in the model's dtype are rescaled
// (an fp32 CPU run's dense rows count at 16 bits), fixed-width codes and fp16 rows are kept as
// measured. A store that does not report its model-dtype bytes can only be probed in the serving
// dtype itself (kvb::Error otherwise). tokens must be long enough. store_applies_windows (when
// given): whether the method's store applies sliding windows itself (KvCache::serves_windows, the
// codec store) on this model without window layers, so that on a target whose every layer is a
// window it holds each layer's window encoded (target_curve in serve.cpp).
std::vector<FootprintPoint> measure_footprint_points(
    std::shared_ptr<Model> model, const std::string& method, const nlohmann::json& method_params,
    const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths, int64_t decode_tokens,
    int64_t prefill_chunk, int64_t serving_elem_bytes = 2, bool* store_applies_windows = nullptr);

// The serve protocol's parameters added after its first stored runs: the vattention allocator's
// page, the paged kernel's slowdown, the co-design policies (kv_policy, admission,
// prefix_blocks), the P/D transport and the simulated CXL figures. A config that does not give
// one leaves it out of its resolved form (so earlier runs' hashes stay valid); serve_param()
// reads a key from a resolved protocol, falling back to this schema's default.
const std::vector<ParamSpec>& serve_later_params();
nlohmann::json serve_param(const nlohmann::json& proto, const std::string& key);

// The time model's view of a synthetic preset (bf16 weights and KV).
ServeTarget serve_target(const std::string& preset);

// "conversation" | "synthetic" (the Mooncake traces under the data path) or a JSONL path
// ("generated" traces are made in serve_simulation_sample from the gen_* parameters).
std::string serve_trace_path(const std::string& name, const std::string& data_dir);

nlohmann::json serve_result_json(const ServeResult& r);

// Sample 0's JSON: the points, whether bytes are proportional in length, the run's bytes per token.
nlohmann::json footprint_sample_json(const std::vector<FootprintPoint>& points,
                                     double run_kv_bytes_per_token);

// Sample 1: reads the trace, scales the footprint curve to the target, measures the Redis prefix
// store when the protocol names one, simulates. `proto` is the resolved serve protocol.
// What the simulation reads from the user, checked before a run begins (so that a bad one leaves no
// run row): the target preset, and for a file trace that it reads and has requests once cut to
// max_requests. Throws kvb::Error naming the key or file.
void check_serve_inputs(const nlohmann::json& proto, const std::string& data_dir);
// config.protocol.prefix_store: one of the store names, or a Redis URL that parses (nothing is
// connected to). Checked when the config is resolved, so that a bad URL fails before any run row.
void check_prefix_store(const std::string& store);

nlohmann::json serve_simulation_sample(const nlohmann::json& proto, const nlohmann::json& footprint,
                                       const std::string& data_dir, uint64_t seed);

// Run-level metrics from the two samples' JSON. prefix_reuse_exact: the method's stored KV of a
// prefix depends on the prefix alone (it neither evicts nor reads the query), so a prefix-store hit
// hands a request what it would have computed; otherwise the hit rates assume reuse is acceptable.
std::vector<Metric> serve_metrics(const nlohmann::json& footprint, const nlohmann::json& simulation,
                                  bool prefix_reuse_exact);

}  // namespace kvb
