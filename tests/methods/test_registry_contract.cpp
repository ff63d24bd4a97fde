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
#include "harness/kv/context_pass.h"
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
    if (method_needs_context_pass(name)) continue;
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

}  // namespace
}  // namespace kvb
