// The serve protocol end to end on stories260K (bf16): footprints measured with the methods' real
// stores, the simulation over the real Mooncake conversation trace, resume, and bad input.

#include <gtest/gtest.h>

#include <fstream>

#include "harness/common/error.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/serve.h"
#include "harness/serve/redis_store.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::metric;

nlohmann::json serve_config(const nlohmann::json& method, const nlohmann::json& proto_extra = {}) {
  nlohmann::json proto = {{"name", "serve"},
                          {"max_requests", 150},
                          {"kv_pool_gib", 4},
                          {"prefix_cache_gib", 8},
                          {"probe_lengths", "64,128,256"}};
  for (auto it = proto_extra.begin(); it != proto_extra.end(); ++it) proto[it.key()] = it.value();
  return resolve_run_config({{"model", test::models_dir() + "/stories260K"},
                             {"dtype", "bf16"},
                             {"method", method},
                             {"protocol", proto}});
}

std::shared_ptr<Model> bf16_model() {
  LoadOptions lo;
  lo.dtype = "bf16";
  return load_model(test::models_dir() + "/stories260K", lo);
}

std::vector<int64_t> text_tokens(const std::shared_ptr<Model>& m, int64_t n) {
  std::string hash;
  auto w = stream_windows(
      m->tokenizer_path,
      {{"dataset", "tinystories-valid-sample"}, {"window", n}, {"stride", 0}, {"max_windows", 1}},
      test::data_dir(), &hash);
  return w.at(0).tokens;
}

TEST(ServeFootprint, FullIsProportionalKiviSmallerStreamingSaturates) {
  auto model = bf16_model();
  const auto tokens = text_tokens(model, 480);
  const double bpt = static_cast<double>(model->config.kv_bytes_per_token(2));  // 640 bytes
  const std::vector<int64_t> lengths = {64, 128, 256, 464};
  const auto full =
      measure_footprint_points(model, "full", nlohmann::json::object(), tokens, lengths, 16, 512);
  ASSERT_EQ(full.size(), 4u);
  for (const auto& p : full) {
    EXPECT_NEAR(p.device_bytes / (p.tokens * bpt), 1.0, 0.02) << p.tokens;
    EXPECT_EQ(p.host_bytes, 0);
  }
  EXPECT_TRUE(FootprintCurve(full).proportional_in_length());
  const auto kivi =
      measure_footprint_points(model, "kivi", {{"preset", "kivi-2"}}, tokens, lengths, 16, 512);
  // 128 residual tokens stay fp16; the 2-bit rest costs ~0.3 of fp16 with head_dim 8's metadata.
  EXPECT_LT(kivi.back().device_bytes, 0.6 * full.back().device_bytes);
  EXPECT_LT(kivi.back().device_bytes - kivi[2].device_bytes,
            0.5 * (full.back().device_bytes - full[2].device_bytes));
  const auto stream = measure_footprint_points(
      model, "streaming_llm", {{"budget", 128}, {"budget_unit", "tokens_per_head"}}, tokens,
      lengths, 16, 512);
  // 128 tokens kept: the bytes stop growing past it.
  EXPECT_NEAR(stream.back().device_bytes, stream[2].device_bytes, 0.02 * stream[2].device_bytes);
  EXPECT_FALSE(FootprintCurve(stream).proportional_in_length());
  EXPECT_THROW(
      measure_footprint_points(model, "full", nlohmann::json::object(), tokens, {600}, 0, 512),
      Error);
}

// An fp32 CPU run sizes the same 16-bit deployment as a bf16 run: dense rows are rescaled, codes
// and fp16 rows are not (so a store that misreports its model-dtype bytes fails here).
TEST(ServeFootprint, Fp32ProbesAreRescaledToTheBf16Bytes) {
  auto bf16 = bf16_model();
  auto fp32 = load_model(test::models_dir() + "/stories260K");
  const auto tokens = text_tokens(bf16, 480);
  const std::vector<int64_t> lengths = {64, 256, 464};
  const std::vector<std::pair<std::string, nlohmann::json>> methods = {
      {"full", nlohmann::json::object()},
      {"kivi", {{"preset", "kivi-2"}}},
      {"snapkv", {{"budget", 0.25}}},
      {"quest", {{"budget", 0.25}}}};
  for (const auto& [name, params] : methods) {
    const auto a = measure_footprint_points(bf16, name, params, tokens, lengths, 8, 512);
    const auto b = measure_footprint_points(fp32, name, params, tokens, lengths, 8, 512);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i].device_bytes, a[i].device_bytes, 0.01 * a[i].device_bytes)
          << name << " at " << a[i].tokens;
      EXPECT_NEAR(b[i].host_bytes, a[i].host_bytes, 0.01 * a[i].host_bytes + 1) << name;
    }
  }
  // fp32-only stores: a codec stack keeps every row fixed-width (nothing rescales); DMS keeps
  // dense fp32 rows (about half their bytes go) beside fixed-width positions and flags.
  auto probe = [&](const std::string& name, const nlohmann::json& params, int64_t serving_elem) {
    return measure_footprint_points(fp32, name, params, tokens, lengths, 8, 512, serving_elem);
  };
  const nlohmann::json stack = {{"budget", 0.25}, {"codec", "kivi-4"}, {"codec_residual", 32}};
  const auto stack_raw = probe("streaming_llm", stack, 4),
             stack_16 = probe("streaming_llm", stack, 2);
  for (size_t i = 0; i < stack_raw.size(); ++i)
    EXPECT_EQ(stack_16[i].device_bytes, stack_raw[i].device_bytes);
  const nlohmann::json dms = {{"decisions", "keep_all"}, {"window", 16}};
  const auto dms_raw = probe("dms", dms, 4), dms_16 = probe("dms", dms, 2);
  for (size_t i = 0; i < dms_raw.size(); ++i) {
    EXPECT_LT(dms_16[i].device_bytes, 0.6 * dms_raw[i].device_bytes);
    EXPECT_GT(dms_16[i].device_bytes, 0.5 * dms_raw[i].device_bytes);
  }
}

// Quest reads its top pages (a fraction of the dense bytes); SpeCache pulls top-k rows from the
// host every decode step; the full cache reads everything and pulls nothing.
TEST(ServeFootprint, DecodeReadsAndHostTransfersAreMeasured) {
  auto model = bf16_model();
  const auto tokens = text_tokens(model, 480);
  const std::vector<int64_t> lengths = {128, 464};
  const auto full =
      measure_footprint_points(model, "full", nlohmann::json::object(), tokens, lengths, 8, 512);
  for (const auto& p : full) {
    EXPECT_EQ(p.read_fraction, 1.0);
    EXPECT_EQ(p.h2d_bytes_per_token, 0.0);
  }
  auto fp32 = load_model(test::models_dir() + "/stories260K");
  const auto quest =
      measure_footprint_points(fp32, "quest", {{"budget", 0.25}}, tokens, lengths, 8, 512);
  EXPECT_LT(quest.back().read_fraction, 0.6);
  EXPECT_GT(quest.back().read_fraction, 0.1);
  // Prefilled in chunks of 128, whose rows swap too: only decode steps' swaps may count.
  const auto spec = measure_footprint_points(fp32, "specache", {{"bits", 2}, {"top_k", 16}}, tokens,
                                             lengths, 8, 128);
  // 16 rows per KV head, K and V, fp16, every layer: 5 x 4 x 16 x 2 x 8 x 2 = 20,480 bytes at most.
  for (const auto& p : spec) {
    EXPECT_GT(p.h2d_bytes_per_token, 0);
    EXPECT_LE(p.h2d_bytes_per_token, 20480) << p.tokens;
  }
}

TEST(ServeRun, CompressionRunsMoreRequestsAtOnceOnTheConversationTrace) {
  std::string dir = test::make_temp_dir("serve");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const RunOutcome full = execute_run(serve_config("full"), db, env);
  const RunOutcome kivi = execute_run(
      serve_config(R"({"name": "kivi", "params": {"preset": "kivi-2"}})"_json), db, env);
  EXPECT_EQ(full.samples_total, 2);
  EXPECT_NEAR(metric(full.metrics, "compression_ratio"), 1.0, 0.02);
  EXPECT_NEAR(metric(full.metrics, "serve_baseline_kv_bytes_per_token"), 131072,
              0);  // Llama-3.1-8B bf16
  EXPECT_GT(metric(kivi.metrics, "compression_ratio"), 2.5);
  EXPECT_EQ(metric(full.metrics, "serve_times_simulated"), 1.0);
  EXPECT_EQ(metric(full.metrics, "serve_prefix_reuse_exact"), 1.0);
  EXPECT_EQ(metric(kivi.metrics, "serve_prefix_reuse_exact"), 1.0);
  // An eviction method's kept set depends on the whole prompt: its prefix hits are not exact.
  const RunOutcome snap = execute_run(serve_config("snapkv", {{"max_requests", 10}}), db, env);
  EXPECT_EQ(metric(snap.metrics, "serve_prefix_reuse_exact"), 0.0);
  EXPECT_EQ(metric(full.metrics, "serve_completed") + metric(full.metrics, "serve_rejected"), 150);
  EXPECT_GT(metric(kivi.metrics, "serve_mean_running"),
            2 * metric(full.metrics, "serve_mean_running"));
  EXPECT_LT(metric(kivi.metrics, "serve_ttft_ms_p50"), metric(full.metrics, "serve_ttft_ms_p50"));
  // At a twentieth of the load (requests rarely queue) the prefix store's capacity decides the
  // hit rate: compressed blocks are smaller, more of them stay.
  const nlohmann::json light = {{"time_scale", 20}, {"kv_pool_gib", 24}, {"prefix_cache_gib", 128}};
  const RunOutcome full_light = execute_run(serve_config("full", light), db, env);
  const RunOutcome kivi_light = execute_run(
      serve_config(R"({"name": "kivi", "params": {"preset": "kivi-2"}})"_json, light), db, env);
  EXPECT_GT(
      metric(kivi_light.metrics, "serve_prefix_hit_rate"),
      metric(full_light.metrics, "serve_prefix_hit_rate") + 0.005);  // measured 0.044 vs 0.034
  // Finished work is skipped.
  const RunOutcome again = execute_run(serve_config("full"), db, env);
  EXPECT_TRUE(again.skipped);
  EXPECT_EQ(metric(again.metrics, "serve_mean_running"),
            metric(full.metrics, "serve_mean_running"));
}

TEST(ServeRun, BadInputNamesWhatIsWrong) {
  std::string dir = test::make_temp_dir("serve_bad");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  auto expect_error = [&](nlohmann::json cfg, const std::string& needle) {
    try {
      execute_run(cfg, db, env);
      ADD_FAILURE() << "no error; wanted " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(serve_config("full", {{"trace", dir + "/missing.jsonl"}}), dir + "/missing.jsonl");
  expect_error(serve_config("full", {{"probe_lengths", "64,x"}}), "probe_lengths");
  expect_error(serve_config("full", {{"probe_lengths", "1000"}}), "probe_lengths");
  expect_error(serve_config("full", {{"prefix_store", "redis-local"}, {"prefix_cache_gib", 0}}),
               "prefix_cache_gib");
  expect_error(serve_config("full", {{"target", "llama-9"}}), "llama-9");
  EXPECT_THROW(serve_config("full", {{"allocator", "buddy"}}), Error);
}

TEST(ServeRun, ClusterSettingsReachTheSimulation) {
  std::string dir = test::make_temp_dir("serve_cluster");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const RunOutcome o = execute_run(
      serve_config("full", {{"instances", 3}, {"router", "prefix"}, {"max_requests", 60}}), db,
      env);
  const double imbalance = metric(o.metrics, "serve_load_imbalance");
  EXPECT_GE(imbalance, 1.0);
  EXPECT_LE(imbalance, 3.0);
  nlohmann::json sim;
  for (const auto& s : db.samples(o.run_id))
    if (s.index == 1) sim = nlohmann::json::parse(s.output_json);
  const auto per = sim.at("result").at("instance_requests").get<std::vector<int64_t>>();
  ASSERT_EQ(per.size(), 3u);
  EXPECT_EQ(per[0] + per[1] + per[2], 60);
  // P/D: 2 of the 3 prefill, the third decodes every request that needs more than one token.
  const RunOutcome pd = execute_run(
      serve_config("full", {{"instances", 3}, {"prefill_instances", 2}, {"max_requests", 60}}), db,
      env);
  EXPECT_GT(metric(pd.metrics, "serve_pd_transfer_bytes"), 0);
  EXPECT_EQ(metric(pd.metrics, "serve_completed") + metric(pd.metrics, "serve_rejected"), 60);
  EXPECT_THROW(serve_config("full", {{"router", "aibrix"}}), Error);
  EXPECT_THROW(serve_config("full", {{"instances", 0}}), Error);
}

// A generated trace (seeded Poisson arrivals): shared-prefix groups make the prefix store hit.
TEST(ServeRun, GeneratedTracesSweepRateAndSharing) {
  std::string dir = test::make_temp_dir("serve_gen");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const nlohmann::json base = {{"trace", "generated"},
                               {"gen_requests", 200},
                               {"max_requests", 0},
                               {"gen_rate_per_s", 2.0},
                               {"prefix_cache_gib", 16}};
  nlohmann::json shared = base;
  shared["gen_prefix_groups"] = 4;
  shared["gen_group_fraction"] = 0.8;
  const RunOutcome lone = execute_run(serve_config("full", base), db, env);
  const RunOutcome groups = execute_run(serve_config("full", shared), db, env);
  EXPECT_EQ(metric(lone.metrics, "serve_completed") + metric(lone.metrics, "serve_rejected"), 200);
  EXPECT_EQ(metric(lone.metrics, "serve_prefix_hit_rate"), 0.0);  // every block id fresh
  EXPECT_GT(metric(groups.metrics, "serve_prefix_hit_rate"), 0.2);
  // The seed fixes the trace: the same config gives the same simulation.
  const RunOutcome again = execute_run(serve_config("full", base), db, env);
  EXPECT_TRUE(again.skipped);
}

TEST(ServeRun, RedisPrefixStoreIsMeasuredOnLoopback) {
  if (!LocalRedisServer::available())
    GTEST_SKIP() << "redis-server not installed (scripts/setup.sh)";
  std::string dir = test::make_temp_dir("serve_redis");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const RunOutcome o =
      execute_run(serve_config(R"({"name": "kivi", "params": {"preset": "kivi-4"}})"_json,
                               {{"prefix_store", "redis-local"}, {"max_requests", 40}}),
                  db, env);
  const double get_gbps = metric(o.metrics, "serve_remote_get_gbps");
  EXPECT_GT(get_gbps, 0.01);
  EXPECT_LT(get_gbps, 1000);
  EXPECT_GT(metric(o.metrics, "serve_remote_put_gbps"), 0.01);
}

// The parameters added after the protocol's first runs stay out of a config that does not give
// them (the stored hashes of earlier runs stay valid), and those that apply to one setting are
// refused with another, naming the key.
TEST(ServeRun, LaterParametersKeepEarlierHashesAndApplyWhereTheyMean) {
  const nlohmann::json plain = serve_config("full");
  for (const ParamSpec& p : serve_later_params())
    EXPECT_FALSE(plain.at("protocol").contains(p.name)) << p.name;
  const nlohmann::json given =
      serve_config("full", {{"allocator", "vattention"}, {"page_kib", 64}});
  EXPECT_EQ(given.at("protocol").at("page_kib"), 64);
  EXPECT_FALSE(given.at("protocol").contains("kv_policy"));
  auto refused = [](const nlohmann::json& extra, const std::string& needle) {
    try {
      serve_config("full", extra);
      ADD_FAILURE() << "accepted " << extra.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({{"page_kib", 64}}, "config.protocol.page_kib");
  refused({{"allocator", "oracle"}, {"paged_attention_slowdown", 1.2}},
          "config.protocol.paged_attention_slowdown");
  refused({{"prefix_blocks", "compressed"}}, "config.protocol.prefix_blocks");
  refused({{"cxl_gbps", 32}}, "config.protocol.cxl_gbps");
  refused({{"kv_policy", "sometimes"}}, "kv_policy");
  std::string dir = test::make_temp_dir("serve_later");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  for (const auto& [extra, needle] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"pd_transport", "shm"}}, "prefill_instances"},
           {{{"prefix_store", "shm"}, {"prefix_cache_gib", 0}}, "prefix_cache_gib"},
           {{{"prefix_store", "nfs://x"}}, "prefix_store"}}) {
    try {
      execute_run(serve_config("full", extra), db, env);
      ADD_FAILURE() << "no error for " << extra.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

// The co-design policy, the vattention allocator and the shared-memory and CXL tiers reach the
// simulation end to end: compress-instead-of-preempt on a pool too small for uncompressed KV
// compresses and preempts no more than the vLLM rule does with the full cache; the shm tier is
// measured (two processes) and its rate becomes the load rate; cxl-sim uses the given figures.
TEST(ServeRun, CodesignAllocatorAndTiersReachTheSimulation) {
  std::string dir = test::make_temp_dir("serve_codesign");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const nlohmann::json kivi = R"({"name": "kivi", "params": {"preset": "kivi-2"}})"_json;
  // Requests arriving faster than they finish into a pool of 8,192 uncompressed tokens
  // (Llama-3.1-8B shapes): prompts of ~1K that grow by ~512 outgrow it.
  const nlohmann::json tight = {{"trace", "generated"},     {"gen_requests", 60},
                                {"max_requests", 0},        {"gen_rate_per_s", 50},
                                {"gen_input_median", 1024}, {"gen_output_median", 512},
                                {"kv_pool_gib", 1},         {"prefix_cache_gib", 0}};
  nlohmann::json on_pressure = tight;
  on_pressure["kv_policy"] = "on_pressure";
  const RunOutcome vllm = execute_run(serve_config("full", tight), db, env);
  const RunOutcome co = execute_run(serve_config(kivi, on_pressure), db, env);
  EXPECT_GT(metric(vllm.metrics, "serve_preemptions"), 0);
  EXPECT_GT(metric(co.metrics, "serve_compressions"), 0);
  EXPECT_LT(metric(co.metrics, "serve_preemptions"), metric(vllm.metrics, "serve_preemptions"));
  const double frac = metric(co.metrics, "serve_compressed_token_fraction");
  EXPECT_GT(frac, 0);
  EXPECT_LT(frac, 1);
  const RunOutcome va = execute_run(
      serve_config("full", {{"allocator", "vattention"}, {"page_kib", 2048}, {"max_requests", 40}}),
      db, env);
  EXPECT_GT(metric(va.metrics, "serve_allocator_waste"), 0);
  const RunOutcome shm =
      execute_run(serve_config(kivi, {{"prefix_store", "shm"}, {"max_requests", 40}}), db, env);
  const double get_gbps = metric(shm.metrics, "serve_shm_get_gbps");
  EXPECT_GT(get_gbps, 0.01);
  EXPECT_GT(metric(shm.metrics, "serve_shm_visible_us"), 0);
  EXPECT_NEAR(metric(shm.metrics, "serve_prefix_load_gbps"),
              std::min(55.0, std::min(get_gbps, metric(shm.metrics, "serve_shm_put_gbps"))), 1e-9);
  const RunOutcome cxl = execute_run(
      serve_config(kivi, {{"prefix_store", "cxl-sim"}, {"cxl_gbps", 20}, {"max_requests", 40}}), db,
      env);
  EXPECT_DOUBLE_EQ(metric(cxl.metrics, "serve_prefix_load_gbps"), 20);
  const RunOutcome pd = execute_run(serve_config(kivi, {{"instances", 3},
                                                        {"prefill_instances", 1},
                                                        {"pd_transport", "cxl-sim"},
                                                        {"max_requests", 40}}),
                                    db, env);
  EXPECT_DOUBLE_EQ(metric(pd.metrics, "serve_pd_gbps"), 55);  // PCIe caps CXL's 64 GB/s
}

}  // namespace
}  // namespace kvb
