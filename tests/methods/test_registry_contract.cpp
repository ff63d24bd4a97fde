// The contract every registered method meets, whatever it is: created with its defaults (or, for a
// method that needs a trained artifact, test::runnable_params), it streams
// 256 tokens of stories260K on TinyStories (128 prefilled, 128 decoded), its logits stay finite and
// close to the full cache's, two runs are identical (deterministic under the default seed), and a
// method that evicts or quantizes holds no more physical bytes than the full cache.

#include <gtest/gtest.h>

#include <cmath>

#include "harness/common/error.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/eval/stream.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

TEST(RegistryContract, EveryMethodStreamsDeterministicallyWithinTheFullFootprint) {
  auto m = load_model(test::models_dir() + "/stories260K");
  nlohmann::json proto = {
      {"dataset", "tinystories-valid-sample"}, {"window", 256}, {"stride", 0}, {"max_windows", 1}};
  std::string hash;
  auto windows = stream_windows(m->tokenizer_path, proto, test::data_dir(), &hash);
  ASSERT_EQ(windows.size(), 1u);
  StreamOptions so;
  so.prefill_tokens = 128;
  const auto& reg = MethodRegistry::instance();
  const StreamSampleResult full = run_stream_sample(m, "full", nlohmann::json::object(), windows[0].tokens, so);
  const int64_t full_bytes = full.ledger.fp.physical_bytes();
  ASSERT_GT(full_bytes, 0);
  for (const auto& name : reg.names()) {
    SCOPED_TRACE(name);
    const MethodInfo& info = reg.info(name);
    // A method that scores by the question cannot stream (a stream has none); its run configs
    // with such protocols are refused (RegistryContract.QuestionMethodsAreRefusedWithoutAQuestion).
    if (info.caps.needs_question) continue;
    // Nor can a method that runs its own pass over the context (a stream has no context pass);
    // tests/methods/test_kvzip.cpp checks its refusal.
    if (info.caps.needs_context_pass) continue;
    const nlohmann::json params = test::runnable_params(name);
    const auto a = run_stream_sample(m, name, params, windows[0].tokens, so);
    const auto b = run_stream_sample(m, name, params, windows[0].tokens, so);
    ASSERT_EQ(a.tokens, 255);
    double kl = 0;
    for (float x : a.kl) {
      ASSERT_TRUE(std::isfinite(x));
      kl += x;
    }
    kl /= static_cast<double>(a.tokens);
    EXPECT_LT(kl, 1.0);  // compressed, not broken (full KL of a random model is ~3+ nats)
    EXPECT_EQ(a.kl, b.kl);
    EXPECT_EQ(a.nll_sum, b.nll_sum);
    EXPECT_EQ(a.ledger.fp.physical_bytes(), b.ledger.fp.physical_bytes());
    if ((info.caps.evicts || info.caps.quantizes) && !info.caps.simulated) {
      EXPECT_LE(a.ledger.fp.physical_bytes(), full_bytes)
          << "holds " << a.ledger.fp.physical_bytes() << " bytes, full " << full_bytes;
    }
    RecordProperty(name + "_kl_mean", std::to_string(kl));
    RecordProperty(name + "_physical_fraction",
                   std::to_string(static_cast<double>(a.ledger.fp.physical_bytes()) / full_bytes));
  }
}

TEST(RegistryContract, QuestionMethodsAreRefusedWithoutAQuestion) {
  const auto& reg = MethodRegistry::instance();
  int n = 0;
  for (const auto& name : reg.names()) {
    if (!reg.info(name).caps.needs_question) continue;
    ++n;
    const nlohmann::json qa = {{"name", "qa"}, {"source", "synthetic"}, {"task", "passkey"}, {"length", 256}};
    for (const nlohmann::json& proto :
         {nlohmann::json{{"name", "stream"}, {"dataset", "tinystories-valid-sample"}}, qa}) {
      const nlohmann::json cfg = {{"model", "stories260K"}, {"method", name}, {"protocol", proto}};
      EXPECT_THROW(resolve_run_config(cfg), Error) << name << " " << proto.dump();
    }
    nlohmann::json aware = qa;
    aware["mode"] = "query_aware";
    EXPECT_NO_THROW(resolve_run_config({{"model", "stories260K"}, {"method", name}, {"protocol", aware}}))
        << name;
  }
  EXPECT_GE(n, 1);
}

// Where a method runs is declared (MethodCaps::cpu_only / fp32_only, MethodInfo::target_check) and
// refused when a config is resolved. The declarations are held true here on what the CPU can run:
// a method that does not say fp32 only streams in bf16, and one that says so is refused before its
// store is built, by config resolution and by the registry alike.
TEST(RegistryContract, DeclaredTargetsAreTheOnesThatRun) {
  LoadOptions lo;
  lo.dtype = "bf16";
  auto m = load_model(test::models_dir() + "/stories260K", lo);
  nlohmann::json proto = {
      {"dataset", "tinystories-valid-sample"}, {"window", 96}, {"stride", 0}, {"max_windows", 1}};
  std::string hash;
  auto windows = stream_windows(m->tokenizer_path, proto, test::data_dir(), &hash);
  ASSERT_EQ(windows.size(), 1u);
  StreamOptions so;
  so.prefill_tokens = 64;
  const auto& reg = MethodRegistry::instance();
  int refused = 0, ran = 0;
  for (const auto& name : reg.names()) {
    SCOPED_TRACE(name);
    const MethodInfo& info = reg.info(name);
    if (info.caps.needs_question || info.caps.needs_context_pass) continue;
    nlohmann::json params = test::runnable_params(name);
    if (params.contains("eval_window")) {  // a method tuned on the eval's windows: this stream's
      params["eval_window"] = 96;
      params["eval_prefill_tokens"] = 64;
    }
    const nlohmann::json cfg = {{"model", "stories260K"}, {"dtype", "bf16"},
                                {"method", {{"name", name}, {"params", params}}},
                                {"protocol", {{"name", "stream"}, {"dataset", "tinystories-valid-sample"}}}};
    if (info.caps.fp32_only) {
      ++refused;
      try {
        resolve_run_config(cfg);
        ADD_FAILURE() << "a bf16 config was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("method " + name + " runs in fp32 only (dtype bf16"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_THROW(run_stream_sample(m, name, params, windows[0].tokens, so), Error);
      continue;
    }
    EXPECT_NO_THROW(resolve_run_config(cfg));
    ++ran;
    const auto r = run_stream_sample(m, name, params, windows[0].tokens, so);
    ASSERT_EQ(r.tokens, 95);
    for (float x : r.kl) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_GE(refused, 4);
  EXPECT_GE(ran, 20);
}

TEST(RegistryContract, CpuOnlyStoresAndParametersAreRefusedOnCudaBeforeAnythingRuns) {
  const auto& reg = MethodRegistry::instance();
  auto cfg = [](const std::string& method, nlohmann::json params, const std::string& device,
                const std::string& dtype) {
    return nlohmann::json{{"model", "stories260K"}, {"device", device}, {"dtype", dtype},
                          {"method", {{"name", method}, {"params", std::move(params)}}},
                          {"protocol", {{"name", "stream"}, {"dataset", "tinystories-valid-sample"}}}};
  };
  auto refusal = [&](const nlohmann::json& c) -> std::string {
    try {
      resolve_run_config(c);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  int cpu_only = 0;
  for (const auto& name : reg.names()) {
    if (!reg.info(name).caps.cpu_only) continue;
    ++cpu_only;
    EXPECT_NE(refusal(cfg(name, test::runnable_params(name), "cuda", "fp32"))
                  .find("method " + name + " runs on the CPU only (device cuda"),
              std::string::npos)
        << name;
  }
  EXPECT_GE(cpu_only, 6);
  // Parameters that narrow a method's targets: a codec keeps rows on the host.
  EXPECT_NE(refusal(cfg("snapkv", {{"codec", "kivi-2"}}, "cuda", "bf16")).find("codec=kivi-2"),
            std::string::npos);
  EXPECT_NE(refusal(cfg("snapkv", {{"codec", "kivi-2"}}, "cpu", "bf16")).find("codec=kivi-2"),
            std::string::npos);
  EXPECT_EQ(refusal(cfg("snapkv", {{"codec", "kivi-2"}}, "cpu", "fp32")), "");
  EXPECT_EQ(refusal(cfg("snapkv", nlohmann::json::object(), "cuda", "bf16")), "");
  EXPECT_NE(refusal(cfg("kivi", {{"store", "codec"}}, "cuda", "fp16")).find("store=codec"),
            std::string::npos);
  EXPECT_EQ(refusal(cfg("kivi", nlohmann::json::object(), "cuda", "fp16")), "");
  EXPECT_NE(refusal(cfg("paged", {{"cuda_decode", "tensor_cores"}}, "cpu", "fp32"))
                .find("method paged: cuda_decode=tensor_cores"),
            std::string::npos);
  // A wrapper is refused where the store it wraps cannot run.
  EXPECT_NE(refusal(cfg("kv_packet", {{"wrap", "none"}, {"inner", "kvreviver"}}, "cuda", "fp32"))
                .find("inner=kvreviver: method kvreviver runs on the CPU only"),
            std::string::npos);
  EXPECT_NE(refusal(cfg("snapkv", nlohmann::json::object(), "cudax", "fp32")).find("config.device"),
            std::string::npos);
}

}  // namespace
}  // namespace kvb
